"""The engine's own numbers, kept as events happen, so a scrape costs no work.

    Supervisor.run ──► call(library, tool, status, seconds)     a counter and a histogram
    worker started ──► started(kind)        template, forked ahead, fresh, spawn
    worker ended   ──► ended(cause)         crash, timeout kill, memory, idle, eviction, ...
    refused call   ──► refused(reason)      pool full, quarantine, closed, ...
    egress proxy   ──► egress(admitted, rule)   a worker's connection through the host's
                                            proxy, admitted or refused, by rule
    snapshot()     ──► plain dicts: what metrics() returns, what a front exports

A call costs a dict lookup and two list additions in a table of the calling
thread's own (about 0.25 us): no lock, and no count lost when many threads call
at once; snapshot() adds the threads' tables up.  Nothing here reads /proc or
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


# The last bucket: +Inf; then the sum of seconds.
_SLOTS = len(DURATION_BUCKETS_S) + 1


class Metrics:
    """Counters of one supervisor (all tenants together)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        # One per thread.
        self._tables: list[dict[tuple[str, str, int], list[Any]]] = []
        self._starts: dict[str, int] = {}
        self._ends: dict[str, int] = {}
        self._refusals: dict[str, int] = {}
        self._egress: dict[str, dict[str, int]] = {"admitted": {}, "refused": {}}

    def call(self, library: str, tool: str, status: int, seconds: float) -> None:
        """One call ended with ``status`` after ``seconds`` (from the caller's view)."""
        try:
            table = self._local.table
        except AttributeError:
            table = self._local.table = {}
            with self._lock:
                self._tables.append(table)
        row = table.get((library, tool, status))
        if row is None:
            row = table[(library, tool, status)] = [0] * _SLOTS + [0.0]
        row[bisect.bisect_left(DURATION_BUCKETS_S, seconds)] += 1
        row[_SLOTS] += seconds

    def started(self, kind: str) -> None:
        """A worker started: ``kind`` is how (template, forked ahead, fresh, spawn)."""
        self._bump(self._starts, kind)

    def ended(self, cause: str) -> None:
        """A worker ended: ``cause`` is why (crash, timeout, memory, idle, evict, stop...)."""
        self._bump(self._ends, cause)

    def refused(self, reason: str) -> None:
        """A call was refused before it ran (pool full, quarantine, closed...)."""
        self._bump(self._refusals, reason)

    def egress(self, admitted: bool, rule: str) -> None:
        """A connection through the egress proxy: ``rule`` is what decided it."""
        self._bump(self._egress["admitted" if admitted else "refused"], rule)

    def _bump(self, table: dict[str, int], key: str) -> None:
        with self._lock:
            table[key] = table.get(key, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """Copies of every counter; the histogram's buckets cumulative, as exported."""
        with self._lock:
            # A dict copies in one step.
            tables = [dict(t) for t in self._tables]
            starts, ends, refusals = dict(self._starts), dict(self._ends), dict(self._refusals)
            egress = {k: dict(v) for k, v in self._egress.items()}
        calls: dict[tuple[str, str, int], int] = {}
        buckets = [0] * _SLOTS
        total = 0.0
        for table in tables:
            for key, row in table.items():
                counts = row[:_SLOTS]
                calls[key] = calls.get(key, 0) + sum(counts)
                buckets = [a + b for a, b in zip(buckets, counts, strict=True)]
                total += row[_SLOTS]
        cumulative, running = [], 0
        for le, n in zip((*DURATION_BUCKETS_S, float("inf")), buckets, strict=True):
            running += n
            cumulative.append((le, running))
        return {"calls": [{"library": lib, "tool": tool, "status": status, "count": n}
                          for (lib, tool, status), n in sorted(calls.items())],
                "call_duration_s": {"buckets": cumulative, "sum": total, "count": running},
                "worker_starts": starts, "worker_ends": ends, "refusals": refusals,
                "egress": egress}
