"""What a tenant takes, it gives back: its workers, its disk, its root, its uid.

    stop(tenant, library)    its workers of that library stop, their slots are forgotten;
                             a disk whose root no slot uses any more is unmounted (no
                             binding of it is live: bindings stop their slots on close())
    remove_tenant(tenant, root)
        every worker of the tenant stops        (as stop(), for all its libraries)
        its disk is unmounted, its image deleted (disks.py; also one left mounted by an
                                                 earlier host)
        its root is deleted                     (a folder of its own: never tenants_root, a
                                                 folder above it or a system folder)
        its uid returns to the range            (tenant_uids.py: given again once nothing
                                                 of it remains)

The MCP server calls remove_tenant when a session ends.  A host that removes a tenant
closes its bindings first: a call still made for the tenant afterwards starts a worker
again, under a new uid.

``Leaving`` is the Supervisor's (a mixin, as endings.CallEnds): it reads the Supervisor's
``_slots``, ``_lock``, ``extras``, ``uids`` and calls ``_retire``.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
from typing import Optional

from ...core.policy import may_hand_over, path_within
from .extras import WorkerExtras
from .process import WorkerProcess
from .slot import Slot
from .tenant_uids import TenantUids

log = logging.getLogger("lcp_sandbox")


class Leaving:
    """The Supervisor's ends of tenants: stop(), remove_tenant()."""

    _slots: dict[tuple[str, str, str], Slot]
    _lock: threading.Lock
    extras: WorkerExtras
    uids: TenantUids

    def _retire(self, slot: Slot, proc: WorkerProcess, kind: str, why: str) -> None:
        raise NotImplementedError

    def stop(self, tenant: str, library_key: str) -> bool:
        """Stop the worker(s) of one library of one tenant and forget the slot(s)."""
        keys = [k for k in list(self._slots) if k[0] == tenant and k[1] == library_key]
        self._stop_slots(keys)
        return bool(keys)

    def remove_tenant(self, tenant: str, root: Optional[str] = None) -> Optional[int]:
        """Stop every worker of ``tenant``; with ``root`` (the tenant's workspace root),
        unmount its disk, delete the disk's image and the root itself; then give the
        tenant's uid back (a uid per tenant).  Returns that uid, or None.  ValueError for
        a root that is not a tenant's own folder; OSError when it cannot be deleted (the
        uid is then kept)."""
        self._stop_slots([k for k in list(self._slots) if k[0] == tenant])
        if root is not None:
            root = os.path.realpath(root)
            self._refuse_shared(root)
            self.extras.disks.remove(root)
            if os.path.ismount(root):
                raise OSError(f"tenant {tenant!r}: its root {root} is a mount point that is "
                              f"not its disk: not removed, its uid is kept")
            shutil.rmtree(root, ignore_errors=True)
            if os.path.lexists(root):
                raise OSError(f"tenant {tenant!r}: its root {root} could not be deleted "
                              f"entirely; its uid is kept until it is")
        return self.uids.release(tenant)

    def _refuse_shared(self, root: str) -> None:
        """ValueError unless ``root`` may be deleted as one tenant's own folder."""
        shared = self.uids.folder
        if shared is not None:
            shared = os.path.realpath(shared)
        if not may_hand_over(root) or (shared is not None and path_within(shared, root)):
            raise ValueError(f"{root} is not a tenant's own folder (it is or holds "
                             f"tenants_root, a system folder or the Python installation): "
                             f"not removed")

    def _stop_slots(self, keys: list[tuple[str, str, str]]) -> None:
        roots = set()
        for key in keys:
            slot = self._slots.pop(key, None)
            if slot is None:
                continue
            roots.add(slot.root)
            with slot.lock:
                proc = slot.proc
                if proc is not None:
                    self._retire(slot, proc, "stop", "stopped by the host")
                    proc.wait_gone(2.0)
        self._unmount_unused(roots)

    def _unmount_unused(self, roots: set[str]) -> None:
        """The disks of ``roots`` that no slot uses any more are unmounted (under the
        supervisor's lock: a new slot of such a root waits, then mounts it again)."""
        roots.discard("")
        if not roots:
            return
        with self._lock:
            used = {slot.root for slot in self._slots.values()}
            for root in roots - used:
                if self.extras.disks.release(root):
                    log.info("the tenant disk at %s is unmounted: no worker of it is left", root)
