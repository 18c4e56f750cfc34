"""What a confined worker may get beyond its root and uid, each asked for by a setting.

    disk_mb          its root, a file system of its own (disks.py): made before the root
                     is handed over, so the hand-over is the new file system's
    max_processes    a pids cgroup of its own (cgroups.py)
    network policy   its token for the host's egress proxy (egress_proxy.py)

One object a supervisor holds (``Supervisor.extras``), closed with it.
"""
from __future__ import annotations

import os

from .... import protocol as P
from ....core.outcomes import Unavailable
from ....core.policy import BEST_EFFORT, may_hand_over
from ...metrics import Metrics
from ..slot import Slot
from .cgroups import WorkerCgroups
from .disks import TenantDisks
from .egress_proxy import EgressProxy


class WorkerExtras:
    def __init__(self, metrics: Metrics) -> None:
        self.cgroups = WorkerCgroups()
        self.egress = EgressProxy(metrics)
        self.disks = TenantDisks()

    def disk(self, init: P.Init, slot: Slot, tool: str) -> None:
        """(disk_mb) the worker's root on a file system of its own, before it is handed over;
        Unavailable (503) when this host cannot make one, unless best effort (the worker
        then reports its disk cap not in force)."""
        mb = slot.limits.disk_mb
        if not mb:
            return
        root = os.path.realpath((init.confine or {})["root"])
        # (hand_over_root() refuses that one)
        if not may_hand_over(root):
            return
        try:
            self.disks.ensure(root, mb)
        except OSError as exc:
            if slot.limits.confine != BEST_EFFORT:
                raise Unavailable.not_run(slot.library.name, tool, f"its disk cap (disk_mb="
                                          f"{mb}) is not in force: {exc}. Nothing was run.",
                                          "not_confined") from None

    def give(self, init: P.Init, slot: Slot) -> P.Init:
        """The INIT of ``slot``'s next (confined) worker with its pids cgroup and its token."""
        if slot.limits.max_processes:
            init = self.cgroups.give(init, slot)
        if isinstance(slot.limits.network, dict):
            init = self.egress.give(init, slot)
        return init

    def close(self) -> None:
        self.cgroups.close()
        self.egress.close()
        self.disks.close()
