"""What the supervisor tells a host: per worker, per tenant, and its running numbers.

    stats(tenant)   one dict per worker slot (Slot.stats: state, calls, memory samples...)
    pool_stats()    the pool as a whole and per tenant, the templates, the open-files limit
    metrics()       the counters kept as events happen (backends/metrics.py: calls by
                    library, tool and status, their durations, worker starts and ends,
                    refusals) and gauges read from the supervisor's own records (live
                    workers by state, the watchdog's last memory samples): no /proc read,
                    so a scrape stays cheap however many workers live

``Reports`` is the Supervisor's (a mixin): it reads its slots, pool, templates,
open-files record and counters.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from ..envs import Environments
from ..metrics import Metrics
from .pool import Pool
from .slot import Slot
from .templates import Templates


class Reports:
    """The Supervisor's reports."""

    _slots: dict[tuple[str, str, str], Slot]
    pool: Pool
    templates: Templates
    open_files: dict[str, Any]
    counters: Metrics
    start_method: str
    environments: Environments

    def stats(self, tenant: Optional[str] = None) -> list[dict[str, Any]]:
        """One dict per worker slot (only ``tenant``'s when given); see Slot.stats."""
        now = time.monotonic()
        return [slot.stats(now) for slot in list(self._slots.values())
                if tenant is None or slot.tenant == tenant]

    def pool_stats(self) -> dict[str, Any]:
        """The pool as a whole and per tenant: live workers, calls waiting for room; the
        library templates (not counted in max_workers; "fork-only" on the spawn path);
        the host's open-files limit; the start method."""
        calls: dict[str, int] = {}
        for slot in list(self._slots.values()):
            calls[slot.tenant] = calls.get(slot.tenant, 0) + slot.calls
        return {**self.pool.stats(calls), "templates": self.templates.stats()
                if self.start_method == "zygote" else "fork-only",
                "open_files": self.open_files, "start_method": self.start_method}

    def metrics(self) -> dict[str, Any]:
        """The engine's numbers for a host to export: ``calls`` (library, tool, status,
        count), ``call_duration_s`` (a histogram: cumulative buckets, sum, count),
        ``worker_starts`` by kind (fresh, forked ahead, template, spawn), ``worker_ends`` by
        cause (crash, timeout, memory, violation, load failed, host error, idle, evict,
        stop), ``refusals`` by reason (busy, pool_full, quarantine, closed, no_start),
        ``workers`` by state (idle, busy) and ``worker_uss_bytes`` (the sum of the
        watchdog's last samples), ``env_builds`` (the libraries' environments built by
        outcome, their total and longest durations, builds in flight).  Counters are kept
        as events happen."""
        workers = {"idle": 0, "busy": 0}
        uss = 0
        for slot in list(self._slots.values()):
            proc = slot.proc
            if proc is not None and proc.exit_status is None:
                workers["busy" if slot.busy else "idle"] += 1
                uss += slot.mem_uss
        return {**self.counters.snapshot(), "workers": workers, "worker_uss_bytes": uss,
                "templates": self.templates.ready(),
                "env_builds": self.environments.snapshot()}
