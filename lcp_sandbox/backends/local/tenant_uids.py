"""run_as="per-tenant": a uid (and the same gid) of its own for each tenant, kept.

    of(tenant)     its uid, allocated on first use from the supervisor's uid_range
                   (a hash of the name, then the next free one) and kept in
                   <tenants_root>/.lcp-sandbox-uids.jsonl (root's, mode 0600), so a tenant
                   keeps its uid across restarts and host processes; without a tenants_root,
                   for this supervisor's life only

Then the kernel's own rules keep tenants apart too: each tenant's root is its uid's, mode
0700, so another tenant's worker cannot read it whatever else holds, and signals,
priorities and affinity need the same uid; and RLIMIT_NPROC of that uid caps the processes
and threads of all the tenant's workers together (``max_processes_per_tenant``, 1024 by
default: a fork bomb's end, whatever the start kind: no cgroup, so templates still serve).
"""
from __future__ import annotations

import json
import os
import threading
import zlib
from typing import Any, Optional

from ...core.limits import count_setting
from ...core.outcomes import Unavailable
from ...core.policy import BEST_EFFORT, PER_TENANT, run_as_ids, uid_range_setting

STORE = ".lcp-sandbox-uids.jsonl"


class TenantUids:
    def __init__(self, uid_range: tuple[int, int], folder: Optional[str],
                 max_processes: Optional[int] = None) -> None:
        """The supervisor's ``uid_range`` and ``max_processes_per_tenant``, checked
        (ValueError/TypeError naming the setting)."""
        self.first, self.count = uid_range_setting(uid_range)
        # per tenant: its uid's RLIMIT_NPROC
        self.max_processes = count_setting("max_processes_per_tenant", max_processes)
        self.path = os.path.join(folder, STORE) if folder else None
        self._lock = threading.Lock()
        self._torn = False
        self._uids: dict[str, int] = self._load()
        self._taken = set(self._uids.values())

    def _load(self) -> dict[str, int]:
        """The kept uids: one JSON object a line, {"tenant": name, "uid": n}, appended as
        each is given (a line torn by a crash is skipped: that tenant gets a new uid)."""
        if self.path is None:
            return {}
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise OSError(f"the tenants' uids in {self.path} cannot be read ({exc}): fix or "
                          f"remove the file (tenants then get new uids)") from None
        self._torn = bool(text) and not text.endswith("\n")      # (the next line starts anew)
        out: dict[str, int] = {}
        for line in text.splitlines():
            try:
                got = json.loads(line)
                out[str(got["tenant"])] = int(got["uid"])
            except (ValueError, KeyError, TypeError):
                continue
        return out

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
                self._save(tenant, uid)
                self._uids[tenant] = uid
                self._taken.add(uid)
            return uid, uid

    def _free(self, tenant: str) -> int:
        taken = self._taken
        start = zlib.crc32(tenant.encode()) % self.count
        for i in range(self.count):
            uid = self.first + (start + i) % self.count
            if uid not in taken:
                return uid
        raise OSError(f"no uid left in uid_range ({self.first}, {self.count}) for tenant "
                      f"{tenant!r}")

    def _save(self, tenant: str, uid: int) -> None:
        """Append ``tenant``'s uid to the store (root's, mode 0600): one write of one line,
        not a rewrite of every tenant's (a new tenant's first call waits for it)."""
        if self.path is None:
            return
        line = "\n" * self._torn + json.dumps({"tenant": tenant, "uid": uid}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line.encode())
            self._torn = False
        finally:
            os.close(fd)
