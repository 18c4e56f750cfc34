"""The engine's own numbers, kept as events happen, so a scrape costs no work.

    Supervisor.run ──► call(library, tool, status, seconds)     a counter and a histogram
    worker started ──► started(kind)        template, forked ahead, fresh, spawn
    worker ended   ──► ended(cause)         crash, timeout kill, memory, idle, eviction, ...
    refused call   ──► refused(reason)      pool full, quarantine, closed, ...
    snapshot()     ──► plain dicts: what metrics() returns, what a front exports

A call costs one lock round trip and a few dict operations (the lock keeps
counts exact when many threads call at once).  Nothing here reads /proc or
walks workers: gauges (live workers by state, memory) are the supervisor's,
from its own records and the watchdog's samples.
"""
from __future__ import annotations

import bisect
import threading
from typing import Any

#: Upper bounds of the call-duration histogram, seconds (Prometheus' ``le``).
DURATION_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                         0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """Counters of one supervisor (all tenants together)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[tuple[str, str, int], int] = {}
        self._buckets = [0] * (len(DURATION_BUCKETS_S) + 1)       # the last: +Inf
        self._duration_sum = 0.0
        self._starts: dict[str, int] = {}
        self._ends: dict[str, int] = {}
        self._refusals: dict[str, int] = {}

    def call(self, library: str, tool: str, status: int, seconds: float) -> None:
        """One call ended with ``status`` after ``seconds`` (from the caller's view)."""
        i = bisect.bisect_left(DURATION_BUCKETS_S, seconds)
        key = (library, tool, status)
        with self._lock:
            self._calls[key] = self._calls.get(key, 0) + 1
            self._buckets[i] += 1
            self._duration_sum += seconds

    def started(self, kind: str) -> None:
        """A worker started: ``kind`` is how (template, forked ahead, fresh, spawn)."""
        self._bump(self._starts, kind)

    def ended(self, cause: str) -> None:
        """A worker ended: ``cause`` is why (crash, timeout, memory, idle, evict, stop...)."""
        self._bump(self._ends, cause)

    def refused(self, reason: str) -> None:
        """A call was refused before it ran (pool full, quarantine, closed...)."""
        self._bump(self._refusals, reason)

    def _bump(self, table: dict[str, int], key: str) -> None:
        with self._lock:
            table[key] = table.get(key, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """Copies of every counter; the histogram's buckets cumulative, as exported."""
        with self._lock:
            calls = dict(self._calls)
            buckets = list(self._buckets)
            total = self._duration_sum
            starts, ends, refusals = dict(self._starts), dict(self._ends), dict(self._refusals)
        cumulative, running = [], 0
        for le, n in zip((*DURATION_BUCKETS_S, float("inf")), buckets, strict=True):
            running += n
            cumulative.append((le, running))
        return {"calls": [{"library": lib, "tool": tool, "status": status, "count": n}
                          for (lib, tool, status), n in sorted(calls.items())],
                "call_duration_s": {"buckets": cumulative, "sum": total, "count": running},
                "worker_starts": starts, "worker_ends": ends, "refusals": refusals}
