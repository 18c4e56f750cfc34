"""run_as="per-tenant": a uid (and the same gid) of its own for each tenant, given back.

    of(tenant)       its uid: the one the record says it holds, else the next uid of
                     uid_range never given, else one given back and found clean that no
                     process runs as (never from its name: a name cannot aim at another's
                     uid)
    release(tenant)  its uid given back (Supervisor.remove_tenant, once the tenant's root
                     is gone), swept at once (sweep.py), under the uid's own lock (the
                     record's is free meanwhile: other tenants get uids): what the uid
                     left where a worker could leave something is removed, then looked for
                     again.  Nothing left: clean, it may serve another tenant.  Something
                     left (a file it could not remove, an object it could not destroy, a
                     walk too long): retired, never given again.  A process not gone yet,
                     or a file in the tenants' folder (the host's to delete): looked at
                     again before the uid is given (at most every HELD_RECHECK_S)
    tenants()        the tenants of this engine that hold a uid
    where            where the record is (uid_record.py)

The record (uid_record.py) is the machine's, read and written under a lock: two engines
on one machine (two supervisors, two host processes, a test run beside a server) never
give one uid to two tenants.  A tenant keeps its uid across restarts of the engine of its
tenants' folder; an engine without one gives uids for its process's life.

Then the kernel's own rules keep tenants apart too: each tenant's root is its uid's, mode
0700, so another tenant's worker cannot read it whatever else holds, and signals,
priorities and affinity need the same uid; and RLIMIT_NPROC of that uid caps the processes
and threads of all the tenant's workers together (``max_processes_per_tenant``, 1024 by
default: a fork bomb's end, whatever the start kind: no cgroup, so templates still serve).
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from typing import Any, Optional

from ....core.limits import count_setting
from ....core.outcomes import Unavailable
from ....core.policy import BEST_EFFORT, PER_TENANT, run_as_ids, uid_range_setting
from . import sweep as sweeping
from .uid_record import (
    CLEAN,
    GIVEN,
    RELEASED,
    RETIRED,
    UidRecord,
    engine_owner,
    owner_gone,
    record_folder,
)

log = logging.getLogger("lcp_sandbox")

#: Seconds a uid found held is not looked at again (a new tenant then gets another uid).
HELD_RECHECK_S = 60.0
_serial = itertools.count()


class TenantUids:
    def __init__(self, uid_range: tuple[int, int], folder: Optional[str],
                 max_processes: Optional[int] = None) -> None:
        """The supervisor's ``uid_range`` and ``max_processes_per_tenant``, checked
        (ValueError/TypeError naming the setting), and LCP_SANDBOX_UIDS_DIR's value.  The
        record is opened when a uid is first asked for."""
        self.first, self.count = uid_range_setting(uid_range)
        # per tenant: its uid's RLIMIT_NPROC
        self.max_processes = count_setting("max_processes_per_tenant", max_processes)
        self.folder = folder
        record_folder()
        self.owner = f"root {os.path.realpath(folder)}" if folder else engine_owner(
            next(_serial))
        self._lock = threading.Lock()
        self._record: Optional[UidRecord] = None
        # uid -> when it was last found held (not looked at again for HELD_RECHECK_S)
        self._held_at: dict[int, float] = {}

    def _in_range(self, uid: int) -> bool:
        return self.first <= uid < self.first + self.count

    @property
    def record(self) -> UidRecord:
        """The record, opened now if need be (OSError: its folder is not root's alone)."""
        with self._lock:
            if self._record is None:
                self._record = UidRecord(self.folder)
            return self._record

    @property
    def where(self) -> str:
        """Where the uids are recorded (the machine's, or this supervisor's only: why);
        never opens the record."""
        record = self._record
        return record.where if record is not None else "not opened (no uid given yet)"

    def _given(self, tenant: str) -> dict[str, Any]:
        kind, _, who = self.owner.partition(" ")
        return {kind: who, "tenant": tenant}

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
        """``tenant``'s (uid, gid), given now if it has none (OSError: none left).  When
        only uids being swept are left, it waits for a sweep to end and looks again."""
        while True:
            with self.record.locked() as rec:
                uid = rec.given.get((self.owner, tenant))
                if uid is not None:
                    return uid, uid
                try:
                    uid = self._free(rec, tenant)
                except _Sweeping as busy:
                    swept = busy.uid
                else:
                    rec.append({"uid": uid, **self._given(tenant)})
                    return uid, uid
            # (the record's lock let go: that sweep records its end under it)
            with self.record.sweeping(swept, wait=True):
                pass

    def release(self, tenant: str) -> Optional[int]:
        """``tenant`` gives its uid back (its root is gone): swept, then clean or retired
        (the module's docstring); the uid it held, or None.  The sweep (a walk of the
        shared folders: long on a host with a full temp dir) holds the uid's own lock, not
        the record's, so other tenants get uids meanwhile: a released uid is given by no
        engine before its own sweep, which waits for this one's."""
        with contextlib.ExitStack() as held:
            with self.record.locked() as rec:
                uid = rec.given.get((self.owner, tenant))
                if uid is None:
                    return None
                rec.append({"uid": uid, "released": True})
                # Taken before the record's is let go: no one sweeps (and gives) it first.
                held.enter_context(rec.sweeping(uid, wait=True))
            left = sweeping.sweep(uid, [self.folder] if self.folder else [])
            with self.record.locked() as rec:
                self._note(rec, uid, left)
        return uid

    def tenants(self) -> list[str]:
        """The tenants of this engine that hold a uid now."""
        with self.record.locked() as rec:
            return sorted(t for o, t in rec.given if o == self.owner)

    def _swept(self, rec: UidRecord, uid: int) -> Optional[bool]:
        """(The record locked) Sweep ``uid`` (given back) and record what it is now: whether
        it is clean; None at once while another sweeps it (a release())."""
        with rec.sweeping(uid, wait=False) as mine:
            if not mine:
                return None
            return self._note(rec, uid, sweeping.sweep(uid, [self.folder] if self.folder else []))

    def _note(self, rec: UidRecord, uid: int, left: sweeping.Left) -> bool:
        """(The record locked) What the sweep of ``uid`` left, recorded: whether it is clean."""
        if left.stuck:
            log.warning("uid %d is retired, never given again: not all it left could be "
                        "removed (%s)", uid, left.why())
            rec.append({"uid": uid, "retired": left.why()[:500]})
            return False
        if left:
            if uid not in self._held_at:
                log.warning("uid %d, given back, is not given again yet: %s", uid, left.why())
            self._held_at[uid] = time.monotonic()
            return False
        self._held_at.pop(uid, None)
        rec.append({"uid": uid, "clean": True})
        return True

    def _free(self, rec: UidRecord, tenant: str) -> int:
        """The next free uid of the range (the module's docstring); a given-back one is
        swept first."""
        for uid in range(self.first, self.first + self.count):
            if uid not in rec.entries:
                return uid
        running = _process_uids()
        for uid, entry in sorted(rec.entries.items()):
            if self._in_range(uid) and entry.state == CLEAN and uid not in running:
                return uid
        now = time.monotonic()
        dirty = [u for u, e in sorted(rec.entries.items()) if self._in_range(u) and (
            e.state == RELEASED or e.state == GIVEN and owner_gone(e.owner))]
        busy = []
        for uid in dirty:
            if now - self._held_at.get(uid, -HELD_RECHECK_S) < HELD_RECHECK_S:
                continue
            clean = self._swept(rec, uid)
            if clean:
                return uid
            if clean is None:
                busy.append(uid)
        if busy:
            raise _Sweeping(busy[0])
        retired = sum(1 for u, e in rec.entries.items() if self._in_range(u) and
                      e.state == RETIRED)
        held = f"; {len(dirty)} given back still hold something" if dirty else ""
        held += f"; {retired} retired" if retired else ""
        raise OSError(f"no uid left in uid_range ({self.first}, {self.count}) for tenant "
                      f"{tenant!r}{held} (the uids of removed tenants come back once nothing "
                      f"of them remains: Supervisor.remove_tenant)")


class _Sweeping(Exception):
    """(_free) No uid is free but ``uid``, given back, is being swept (by a release())."""

    def __init__(self, uid: int) -> None:
        super().__init__(uid)
        self.uid = uid


def _process_uids() -> set[int]:
    """Every uid and gid some process runs as (from /proc/<pid>/status)."""
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as f:
                text = f.read(8192)
        except OSError:
            continue
        for line in text.split(b"\n"):
            if line.startswith((b"Uid:", b"Gid:")):
                found.update(int(v) for v in line.split()[1:])
    return found
