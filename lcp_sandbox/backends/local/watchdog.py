"""The watchdog: one thread that sleeps until something is due.

    due, kept in a heap by time:
        a retiring worker's grace is over            ─► killed
        a slot's idle deadline (last_used + idle_timeout_s)
              still idle, its lock free ─► retired ("idle"); called since ─► due again later
        SAMPLE_DELAY_S after a call ended (once per slot until taken)
              ─► its tree's memory sampled (what stats() shows, peak_rss, peak_uss);
                 over memory_mb ─► killed; with a memory limit and processes the tool
                 left in its tree ─► sampled again each SAMPLE_DELAY_S while they are there
        templates (on_tick(now), which says when it is next due)
              ─► library templates nobody used for idle_timeout_s retired
    while calls with a memory limit run: every ``interval`` (50 ms) their trees' USS;
        over memory_mb ─► tree killed, kill_reason 507 (the call reads the EOF, says so)
    nothing due, no such call ─► it blocks: no CPU at all

A call starting or ending (``call_started`` / ``call_ended``), a worker retiring
and a template going idle add what they make due, and wake the thread only when
that is due before it would wake anyway.  The cost of a wakeup is what is due
then plus the memory-limited calls in flight: idle workers cost nothing however
many there are (their memory is bounded inside them by RLIMIT_DATA, see
worker/rlimits.py, and is sampled after their last call).  The exception is a
memory-limited worker whose tool left processes behind: each of them may grow to
its own RLIMIT_DATA, so their sum is watched while they live.

A worker is charged for its own pages (USS: private clean + dirty, from
/proc/<pid>/smaps_rollup), not for the pages it shares copy-on-write with the
zygote or its library's template: a hundred workers forked from one numpy
template are not each charged numpy.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from typing import Any, Callable, Optional

from ...core.normalize import OUT_OF_MEMORY
from ...system.proc import tree_usage
from .process import KillReason, WorkerProcess
from .slot import Slot

log = logging.getLogger("lcp_sandbox")

#: How long a worker asked to shut down has for its atexit work.
SHUTDOWN_GRACE_S = 2.0
#: A slot's memory is sampled this long after a call ended (calls in between share the sample).
SAMPLE_DELAY_S = 1.0

_GRACE, _IDLE, _SAMPLE, _TICK = range(4)


class Watchdog:
    def __init__(self, retire: Callable[[Slot, WorkerProcess, str, str], None],
                 idle_timeout_s: Optional[float], interval: float,
                 on_tick: Optional[Callable[[float], Optional[float]]] = None) -> None:
        # retire(slot, proc, event kind, why)
        self._retire = retire
        # on_tick(now) -> when it is next due (None: not)
        self._on_tick = on_tick
        self.idle_timeout_s = idle_timeout_s
        self._interval = interval
        self._cond = threading.Condition(threading.Lock())
        # Due at, seq, what, slot | proc.
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        # Id -> slot busy with a memory-limited call.
        self._limited: dict[int, Slot] = {}
        # Ids of the slots whose memory sample is in the heap (a call ended since the last).
        self._sample_owed: set[int] = set()
        # Ids of the slots whose idle deadline is in the heap.
        self._idle_kept: set[int] = set()
        # Next sample of the memory-limited calls.
        self._busy_due = math.inf
        # Next on_tick already in the heap.
        self._tick_due = math.inf
        # When the thread wakes next (-inf: it is awake)
        self._wakes_at = -math.inf
        self._stopped = False
        self._thread: Optional[threading.Thread] = None
        # Times the thread woke (tests read it)
        self.wakeups = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lcp-sandbox-watchdog",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    # ------------------------------------------------------------ what becomes due
    def _due(self, at: float, what: int, obj: Any) -> None:
        """(holding the condition) ``obj`` is due ``at``; wake the thread if it would sleep
        past it."""
        heapq.heappush(self._heap, (at, next(self._seq), what, obj))
        if at < self._wakes_at:
            self._cond.notify()

    def retiring(self, proc: WorkerProcess) -> None:
        """``proc`` was asked to shut down: kill it if it is still there after the grace."""
        with self._cond:
            self._due(time.monotonic() + SHUTDOWN_GRACE_S, _GRACE, proc)

    def tick_at(self, at: float) -> None:
        """on_tick has something due ``at`` (a template went idle)."""
        with self._cond:
            if at < self._tick_due:
                self._tick_due = at
                self._due(at, _TICK, None)

    def call_started(self, slot: Slot) -> None:
        """A call with a memory limit is sent to ``slot``'s worker (it is busy): its tree
        is sampled every interval until it ends (the supervisor calls this only then)."""
        if slot.limits.memory_mb:
            with self._cond:
                self._limited[id(slot)] = slot
                if self._busy_due == math.inf:
                    self._busy_due = time.monotonic() + self._interval
                    if self._busy_due < self._wakes_at:
                        self._cond.notify()

    def call_ended(self, slot: Slot) -> None:
        """``slot``'s call ended (``last_used`` is set): its memory sample and its idle
        deadline become due, unless they already are (the common case: nothing to do)."""
        key = id(slot)
        if key in self._limited or key not in self._sample_owed or (
                key not in self._idle_kept and self.idle_timeout_s is not None):
            with self._cond:
                self._limited.pop(key, None)
                if key not in self._sample_owed:
                    self._sample_owed.add(key)
                    self._due(slot.last_used + SAMPLE_DELAY_S, _SAMPLE, slot)
                if self.idle_timeout_s is not None and key not in self._idle_kept:
                    self._idle_kept.add(key)
                    self._due(slot.last_used + self.idle_timeout_s, _IDLE, slot)

    def sample_owed(self, slot: Slot) -> bool:
        """A memory sample of ``slot`` is due (a call ended since the last was taken)."""
        return id(slot) in self._sample_owed

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                if not self._limited:
                    self._busy_due = math.inf
                nxt = min(self._heap[0][0] if self._heap else math.inf, self._busy_due)
                now = time.monotonic()
                if nxt > now:
                    self._wakes_at = nxt
                    self._cond.wait(None if nxt == math.inf else nxt - now)
                    self._wakes_at = -math.inf
                    if self._stopped:
                        return
                self.wakeups += 1
                now = time.monotonic()
                due = []
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap))
                busy = list(self._limited.values()) if self._busy_due <= now else []
                if busy:
                    self._busy_due = now + self._interval
                if any(what == _TICK for _, _, what, _ in due):
                    self._tick_due = math.inf
            for _, _, what, obj in due:
                self._guarded(self._handle, what, obj, now)
            for slot in busy:
                self._guarded(self._measure, slot)

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        # The watchdog outlives any one worker's trouble.
        except Exception:
            log.exception("watchdog: %s failed", fn.__name__)

    def _handle(self, what: int, obj: Any, now: float) -> None:
        if what == _GRACE:
            # Most have exited long before.
            if not obj.zygote.reaped(obj.pid):
                obj.zygote.kill(obj.pid)
        elif what == _SAMPLE:
            self._sample_owed.discard(id(obj))
            # Its tool left processes.
            if self._measure(obj) > 1 and obj.limits.memory_mb:
                with self._cond:
                    if id(obj) not in self._sample_owed:
                        self._sample_owed.add(id(obj))
                        self._due(now + SAMPLE_DELAY_S, _SAMPLE, obj)
        elif what == _IDLE:
            self._idle(obj, now)
        elif self._on_tick is not None:
            nxt = self._on_tick(now)
            if nxt is not None:
                self.tick_at(nxt)

    def _measure(self, slot: Slot) -> int:
        """Sample the memory of ``slot``'s worker tree; over its limit, kill it (507).
        Returns how many processes the tree has (0: no worker)."""
        proc = slot.proc
        pid = None if proc is None or proc.exit_status is not None else proc.known_pid
        if proc is None or pid is None:
            return 0
        rss, uss, processes = tree_usage(pid)
        slot.measured(pid, rss, uss, time.monotonic())
        limit = slot.limits.memory_mb
        if limit and uss > limit * 1048576:
            proc.kill(KillReason(f"went over its memory limit of {limit:g} MB (observed "
                                 f"{uss / 1048576:.0f} MB of its own memory in its process tree)",
                                 counts=False, code=OUT_OF_MEMORY, cause="memory"))
        return processes

    def _idle(self, slot: Slot, now: float) -> None:
        """The idle deadline of ``slot`` came: retire its worker if it is still idle.

        Decided holding the slot's lock: no call is then between its start and its
        call_ended, so its mark in ``_idle_kept`` cannot be dropped while a call would
        count on it."""
        idle_s = self.idle_timeout_s
        if idle_s is None:
            return
        # A call runs: look again later.
        if not slot.lock.acquire(timeout=0):
            with self._cond:
                self._due(now + idle_s, _IDLE, slot)
            return
        try:
            proc = slot.proc
            if proc is None or proc.exit_status is not None:
                # The next call's end keeps it again.
                self._idle_kept.discard(id(slot))
            elif time.monotonic() - slot.last_used <= idle_s:
                with self._cond:
                    self._due(slot.last_used + idle_s, _IDLE, slot)
            else:
                self._idle_kept.discard(id(slot))
                self._retire(slot, proc, "idle", f"stopped after {idle_s:g} s idle")
        finally:
            slot.lock.release()
