"""run_as="per-tenant": a uid (and the same gid) of its own for each tenant, kept.

    of(tenant)     its uid, allocated on first use from the supervisor's uid_range
                   (a hash of the name, then the next free one) and kept in
                   <tenants_root>/.lcp-sandbox-uids.json (root's, mode 0600), so a tenant
                   keeps its uid across restarts and host processes; without a tenants_root,
                   for this supervisor's life only

Then the kernel's own rules keep tenants apart too: each tenant's root is its uid's, mode
0700, so another tenant's worker cannot read it whatever else holds, and signals,
priorities and affinity need the same uid.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import zlib
from typing import Any, Optional

from ...core.outcomes import Unavailable
from ...core.policy import BEST_EFFORT, PER_TENANT, run_as_ids

STORE = ".lcp-sandbox-uids.json"


class TenantUids:
    def __init__(self, uid_range: tuple[int, int], folder: Optional[str]) -> None:
        self.first, self.count = uid_range
        self.path = os.path.join(folder, STORE) if folder else None
        self._lock = threading.Lock()
        self._uids: dict[str, int] = self._load()

    def _load(self) -> dict[str, int]:
        if self.path is None:
            return {}
        try:
            with open(self.path, encoding="utf-8") as f:
                got = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise OSError(f"the tenants' uids in {self.path} cannot be read ({exc}): fix or "
                          f"remove the file (tenants then get new uids)") from None
        return {str(k): int(v) for k, v in got.items() if isinstance(v, int)}

    def worker_ids(self, run_as: Any, tenant: str, confine: Any, library: str,
                   tool: str) -> tuple[tuple[int, int], bool]:
        """((uid, gid) of a confined worker of ``tenant`` with this ``run_as`` setting,
        whether they are the tenant's own).  A uid per tenant needs a root host: elsewhere
        every tenant would keep the host's uid, so the call is refused (503) unless the
        host said confine="best-effort"."""
        if run_as != PER_TENANT:
            return run_as_ids(run_as), False
        if os.geteuid() != 0 and confine != BEST_EFFORT:
            raise Unavailable.not_run(library, tool, 'run_as="per-tenant" gives each tenant a '
                                      "uid of its own, which needs a root host (CAP_SETUID); "
                                      f"this host runs as uid {os.geteuid()}. Nothing was run. "
                                      'With confine="best-effort" its workers keep the host\'s '
                                      "uid.", "not_confined")
        return self.of(tenant), True

    def of(self, tenant: str) -> tuple[int, int]:
        """``tenant``'s (uid, gid), allocated now if it has none (OSError: none left)."""
        with self._lock:
            uid = self._uids.get(tenant)
            if uid is None:
                uid = self._free(tenant)
                self._uids[tenant] = uid
                self._save()
            return uid, uid

    def _free(self, tenant: str) -> int:
        taken = set(self._uids.values())
        start = zlib.crc32(tenant.encode()) % self.count
        for i in range(self.count):
            uid = self.first + (start + i) % self.count
            if uid not in taken:
                return uid
        raise OSError(f"no uid left in uid_range ({self.first}, {self.count}) for tenant "
                      f"{tenant!r}")

    def _save(self) -> None:
        if self.path is None:
            return
        fd, tmp = tempfile.mkstemp(prefix=".lcp-sandbox-uids-", dir=os.path.dirname(self.path))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self._uids, f)
            os.replace(tmp, self.path)
        except BaseException:
            os.unlink(tmp)
            raise
