"""run_as="per-tenant": a uid (and the same gid) of its own for each tenant, given back.

    of(tenant)       its uid: a uid given back earlier that nothing holds any more (checked
                     now: holders()), else a new one (a hash of the name, then the next never
                     given); kept in <tenants_root>/.lcp-sandbox-uids.jsonl (root's, mode
                     0600), so a tenant keeps its uid across restarts and host processes;
                     without a tenants_root, for this supervisor's life only
    release(tenant)  its uid returns to the range (Supervisor.remove_tenant, once the
                     tenant's root is gone); the store gets a release record
    tenants()        the tenants that hold a uid

The store is JSON lines, appended: {"tenant": t, "uid": u} when u is given to t,
{"tenant": t, "uid": u, "released": true} when t gives it back.  Once most of its lines
say nothing any more (given, then released), it is rewritten whole (a new file renamed
over it), with a tenant-less {"uid": u, "released": true} for each uid given back and not
given again: a uid once given is never taken for a new one, whatever the store forgot.

A uid given back is given again only when nothing of it remains (holders()): no process
runs as it, and no file or folder of it (owner or group) is under tenants_root or in the
workers' temp dirs.  The walk enters only the folders that uid could have entered (its own,
and those others may search): every other tenant's root is its uid's, mode 0700, so that
walk costs about one stat per tenant; a walk longer than WALK_BUDGET entries counts as
"held" (fail closed: a new uid is given instead).

Then the kernel's own rules keep tenants apart too: each tenant's root is its uid's, mode
0700, so another tenant's worker cannot read it whatever else holds, and signals,
priorities and affinity need the same uid; and RLIMIT_NPROC of that uid caps the processes
and threads of all the tenant's workers together (``max_processes_per_tenant``, 1024 by
default: a fork bomb's end, whatever the start kind: no cgroup, so templates still serve).
"""
from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
import threading
import time
import zlib
from typing import Any, Optional

from ....core.limits import count_setting
from ....core.outcomes import Unavailable
from ....core.policy import BEST_EFFORT, PER_TENANT, run_as_ids, uid_range_setting
from .temp_dirs import TMP_PREFIX

log = logging.getLogger("lcp_sandbox")

STORE = ".lcp-sandbox-uids.jsonl"
#: Entries one ownership walk reads at most before it counts every candidate as held.
WALK_BUDGET = 50_000
#: Seconds a uid found held is not looked at again (a new tenant then gets a new uid).
HELD_RECHECK_S = 60.0
#: How holders() says that a process holds a uid.
PROCESS_HELD = "process "


class TenantUids:
    def __init__(self, uid_range: tuple[int, int], folder: Optional[str],
                 max_processes: Optional[int] = None) -> None:
        """The supervisor's ``uid_range`` and ``max_processes_per_tenant``, checked
        (ValueError/TypeError naming the setting)."""
        self.first, self.count = uid_range_setting(uid_range)
        # per tenant: its uid's RLIMIT_NPROC
        self.max_processes = count_setting("max_processes_per_tenant", max_processes)
        self.folder = folder
        self.path = os.path.join(folder, STORE) if folder else None
        self._lock = threading.Lock()
        self._torn = False
        self._lines = 0
        self._uids: dict[str, int] = {}
        # given back, not given again: each is checked (holders()) before it is
        self._returned: set[int] = set()
        # uid -> when it was last found held (not looked at again for HELD_RECHECK_S)
        self._held_at: dict[int, float] = {}
        self._load()
        self._taken = set(self._uids.values())
        spent = {u for u in self._taken | self._returned if self._in_range(u)}
        self._never_given = self.count - len(spent)
        if self._lines > 2 * (len(self._uids) + len(self._returned)) + 64:
            self._compact()

    def _in_range(self, uid: int) -> bool:
        return self.first <= uid < self.first + self.count

    # ------------------------------------------------------------ the store
    def _load(self) -> None:
        """The kept uids: one JSON object a line (see the module's docstring); a line torn
        by a crash is skipped (that tenant gets a new uid)."""
        if self.path is None:
            return
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise OSError(f"the tenants' uids in {self.path} cannot be read ({exc}): fix or "
                          f"remove the file (tenants then get new uids)") from None
        # the next line starts anew
        self._torn = bool(text) and not text.endswith("\n")
        for line in text.splitlines():
            self._lines += 1
            try:
                got = json.loads(line)
                self._apply(got.get("tenant"), int(got["uid"]), got.get("released") is True)
            except (ValueError, KeyError, TypeError, AttributeError):
                continue

    def _apply(self, tenant: Any, uid: int, released: bool) -> None:
        if not released:
            self._uids[str(tenant)] = uid
            self._returned.discard(uid)
            return
        if tenant is not None and self._uids.get(str(tenant)) == uid:
            del self._uids[str(tenant)]
        if self._in_range(uid) and uid not in self._uids.values():
            self._returned.add(uid)

    def _save(self, record: dict[str, Any]) -> None:
        """Append one record to the store (root's, mode 0600): one write of one line, not
        a rewrite of every tenant's (a new tenant's first call waits for it)."""
        if self.path is None:
            return
        line = "\n" * self._torn + json.dumps(record) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line.encode())
            self._torn = False
            self._lines += 1
        finally:
            os.close(fd)

    def _compact(self) -> None:
        """Rewrite the store with only what it still says (a new file renamed over it); a
        store that cannot be rewritten is kept as it is (and appended to)."""
        try:
            self._rewrite()
        except OSError as exc:
            log.warning("the tenants' uids in %s were not rewritten: %s", self.path, exc)

    def _rewrite(self) -> None:
        if self.path is None:
            return
        records = [{"tenant": t, "uid": u} for t, u in sorted(self._uids.items())]
        records += [{"uid": u, "released": True} for u in sorted(self._returned)]
        part = f"{self.path}.{os.getpid()}.part"
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write("".join(json.dumps(r) + "\n" for r in records).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(part, self.path)
        finally:
            if os.path.exists(part):
                os.unlink(part)
        self._lines, self._torn = len(records), False

    # ------------------------------------------------------------ giving and taking back
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
                self._save({"tenant": tenant, "uid": uid})
                self._uids[tenant] = uid
                self._taken.add(uid)
            return uid, uid

    def release(self, tenant: str) -> Optional[int]:
        """``tenant`` gives its uid back (its root is gone): the uid it held, or None."""
        with self._lock:
            uid = self._uids.pop(tenant, None)
            if uid is None:
                return None
            self._taken.discard(uid)
            if self._in_range(uid):
                self._returned.add(uid)
            self._save({"tenant": tenant, "uid": uid, "released": True})
            if self._lines > 2 * (len(self._uids) + len(self._returned)) + 4096:
                self._compact()
            return uid

    def tenants(self) -> list[str]:
        """The tenants that hold a uid now."""
        with self._lock:
            return sorted(self._uids)

    def _free(self, tenant: str) -> int:
        """A uid for a new tenant: one given back that nothing holds, else a new one."""
        uid = self._reusable()
        if uid is not None:
            self._returned.discard(uid)
            return uid
        if self._never_given > 0:
            start = zlib.crc32(tenant.encode()) % self.count
            for i in range(self.count):
                uid = self.first + (start + i) % self.count
                if uid not in self._taken and uid not in self._returned:
                    self._never_given -= 1
                    return uid
        held = f"; {len(self._returned)} given back still hold something" \
            if self._returned else ""
        raise OSError(f"no uid left in uid_range ({self.first}, {self.count}) for tenant "
                      f"{tenant!r}{held} (the uids of removed tenants come back once nothing "
                      f"of them remains: Supervisor.remove_tenant)")

    def _reusable(self) -> Optional[int]:
        """A uid given back of which nothing remains (None: none is, or none was looked at:
        those found held lately are left alone for HELD_RECHECK_S)."""
        now = time.monotonic()
        candidates = {u for u in self._returned
                      if now - self._held_at.get(u, -HELD_RECHECK_S) >= HELD_RECHECK_S}
        if not candidates:
            return None
        places = [self.folder] if self.folder else []
        held = holders(candidates, places)
        for uid, what in held.items():
            if uid not in self._held_at:
                log.warning("uid %d, given back, is not given again yet: %s", uid, what)
            if what.startswith(PROCESS_HELD):
                # looked at again on the next call (processes are read every time anyway)
                self._held_at[uid] = now - HELD_RECHECK_S
            else:
                # a file found costs a walk: not looked for again before HELD_RECHECK_S
                self._held_at[uid] = now
        free = sorted(candidates - set(held))
        if free:
            self._held_at.pop(free[0], None)
        return free[0] if free else None


# ---------------------------------------------------------------- what holds a uid
def holders(uids: set[int], places: list[str]) -> dict[int, str]:
    """{uid: what holds it} for those of ``uids`` that a process runs as, or that own (as
    owner or group) a file or folder under ``places`` or in the workers' temp dirs."""
    held = _processes(uids)
    rest = uids - set(held)
    if rest:
        held.update(_files(rest, [*places, *_temp_dirs()]))
    return held


def _processes(uids: set[int]) -> dict[int, str]:
    """{uid: "process <pid>"} for the processes whose real, effective, saved or file-system
    uid or gid is one of ``uids`` (from /proc/<pid>/status)."""
    held: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{entry.name}/status", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            text = os.read(fd, 8192)
        except OSError:
            continue
        finally:
            os.close(fd)
        for key in (b"\nUid:", b"\nGid:"):
            start = text.find(key) + len(key)
            ids = text[start:text.find(b"\n", start)].split()
            for uid in {int(v) for v in ids} & uids:
                held.setdefault(uid, f"{PROCESS_HELD}{entry.name} runs as it")
    return held


def _temp_dirs() -> list[str]:
    """The workers' temp dirs (and the folders they are made in) in the system's."""
    tmp = tempfile.gettempdir()
    try:
        return [e.path for e in os.scandir(tmp) if e.name.startswith(TMP_PREFIX)]
    except OSError:
        return []


def _files(uids: set[int], places: list[str]) -> dict[int, str]:
    """{uid: "<path> is its"} for the first file or folder found of each of ``uids``
    under ``places``.  Symlinks are not followed; a folder is entered only when one of
    ``uids`` could enter it.  Past WALK_BUDGET entries every uid not yet found counts
    as held."""
    held: dict[int, str] = {}
    stack = [p for p in places if os.path.isdir(p)]
    seen = 0
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            for uid in {st.st_uid, st.st_gid} & uids:
                held.setdefault(uid, f"{entry.path} is its")
            if stat.S_ISDIR(st.st_mode) and _enterable(st, uids):
                stack.append(entry.path)
        if seen > WALK_BUDGET:
            why = f"the walk under {', '.join(places)} passed {WALK_BUDGET} entries"
            return {**{u: why for u in uids}, **held}
    return held


def _enterable(st: os.stat_result, uids: set[int]) -> bool:
    """Whether a process of one of ``uids`` (no capabilities) could enter this folder."""
    mode = st.st_mode
    return bool(st.st_uid in uids or mode & stat.S_IXOTH or
                (st.st_gid in uids and mode & stat.S_IXGRP))
