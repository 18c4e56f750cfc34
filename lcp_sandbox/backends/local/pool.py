"""Worker capacity: how many processes may run, for which tenant, and who waits.

A call that needs a new worker process takes a *ticket*.  Tickets are
served max-min fair: the next one is the oldest ticket of the tenant with
the fewest live workers, so one tenant's flood of calls cannot starve
another tenant.  The head ticket takes free room, or asks the supervisor to
evict an idle worker; otherwise every ticket waits until room is released
or its own deadline passes.  When a call ends and a tenant no richer than
the call's own is waiting, the supervisor retires that call's worker
(``should_yield``), so a waiting tenant is delayed by at most one call and
a tenant's libraries take turns when it has more of them than workers.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Any, Callable, Optional


class Pool:
    def __init__(self, max_workers: Optional[int] = None,
                 max_per_tenant: Optional[int] = None) -> None:
        self.max_workers = max_workers
        self.max_per_tenant = max_per_tenant
        # (read on every call)
        self.limited = max_workers is not None or max_per_tenant is not None
        self.live: collections.Counter[str] = collections.Counter()
        self.total = 0
        self._cond = threading.Condition(threading.RLock())
        self._tickets: list[tuple[int, str]] = []
        self._seq = itertools.count()

    def _fits(self, tenant: str) -> bool:
        return ((self.max_workers is None or self.total < self.max_workers) and
                (self.max_per_tenant is None or self.live[tenant] < self.max_per_tenant))

    def _head(self) -> Optional[tuple[int, str]]:
        return min(self._tickets, key=lambda t: (self.live[t[1]], t[0]), default=None)

    def reserve(self, tenant: str, deadline: Optional[float],
                evict: Callable[[Optional[str]], bool]) -> None:
        """Room for one more process of ``tenant``; raises TimeoutError at ``deadline``.

        ``evict(tenant_or_None)`` stops one idle worker (of that tenant, or of
        anyone) and releases its room; it returns False when there is none."""
        with self._cond:
            if not self._tickets and self._fits(tenant):
                self._take(tenant)
                return
            ticket = (next(self._seq), tenant)
            self._tickets.append(ticket)
            try:
                while True:
                    if self._head() is ticket:
                        if self._fits(tenant):
                            self._take(tenant)
                            return
                        cap = self.max_per_tenant
                        own = cap is not None and self.live[tenant] >= cap
                        if evict(tenant if own else None):
                            continue
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError
                    self._cond.wait(remaining)
            finally:
                self._tickets.remove(ticket)
                self._cond.notify_all()

    def _take(self, tenant: str) -> None:
        self.live[tenant] += 1
        self.total += 1

    def release(self, tenant: str) -> None:
        with self._cond:
            self.live[tenant] -= 1
            if self.live[tenant] <= 0:
                del self.live[tenant]
            self.total -= 1
            self._cond.notify_all()

    def should_yield(self, tenant: str) -> bool:
        """A call waits for room and its tenant has no more live workers than ``tenant``
        (the same tenant included: its other libraries take turns rather than starve)."""
        with self._cond:
            mine = self.live[tenant]
            return any(self.live[t] <= mine for _, t in self._tickets)

    def waiting(self) -> collections.Counter[str]:
        with self._cond:
            return collections.Counter(t for _, t in self._tickets)

    def stats(self, calls: dict[str, int]) -> dict[str, Any]:
        """The pool as a whole and per tenant (``calls``: tenant -> calls served)."""
        waiting = self.waiting()
        tenants = set(calls) | set(self.live) | set(waiting)
        return {"max_workers": self.max_workers, "max_workers_per_tenant": self.max_per_tenant,
                "live_workers": self.total, "waiting": sum(waiting.values()),
                "tenants": {t: {"live_workers": self.live.get(t, 0), "waiting": waiting.get(t, 0),
                                "calls": calls.get(t, 0)} for t in sorted(tenants)}}
