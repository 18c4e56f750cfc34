"""The watchdog: one thread that looks at every worker every ``interval`` seconds.

    each tick (50 ms):
        workers asked to shut down, past their grace ─► killed
        each slot with a live worker:
            idle past idle_timeout_s (and its lock free now) ─► retired ("idle")
            memory of its process tree (busy with a memory limit: every tick;
            the rest: once a second) ─► peak_rss, peak_uss; USS over memory_mb ─►
            tree killed, kill_reason 507 (the call in flight reads the EOF and says so)
        on_tick(now): library templates nobody used for idle_timeout_s ─► retired

A worker is charged for its own pages (USS: private clean + dirty, from
/proc/<pid>/smaps_rollup), not for the pages it shares copy-on-write with the
zygote or its library's template: a hundred workers forked from one numpy
template are not each charged numpy.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterable, Optional

from ..core.normalize import OUT_OF_MEMORY
from ..proc import tree_memory
from .process import WorkerProcess
from .slot import Slot

#: How long a worker asked to shut down has for its atexit work.
SHUTDOWN_GRACE_S = 2.0


class Watchdog:
    def __init__(self, slots: Callable[[], Iterable[Slot]],
                 retire: Callable[[Slot, WorkerProcess, str, str], None],
                 idle_timeout_s: Optional[float], interval: float,
                 on_tick: Optional[Callable[[float], None]] = None) -> None:
        self._slots = slots                 # the slots of the moment
        self._on_tick = on_tick
        self._retire = retire               # retire(slot, proc, event kind, why)
        self.idle_timeout_s = idle_timeout_s
        self._interval = interval
        self._wake = threading.Event()
        self._stopped = False
        self._lock = threading.Lock()
        self._retiring: list[tuple[WorkerProcess, float]] = []   # (worker, kill if still alive at)
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lcp-sandbox-watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    def retiring(self, proc: WorkerProcess) -> None:
        """``proc`` was asked to shut down: kill it if it is still there after the grace."""
        with self._lock:
            self._retiring.append((proc, time.monotonic() + SHUTDOWN_GRACE_S))

    def _run(self) -> None:
        tick = 0
        while not self._stopped:
            self._wake.wait(self._interval)
            tick += 1
            now = time.monotonic()
            if self._retiring:
                self._reap_retiring(now)
            if self._on_tick is not None and tick % 20 == 0:
                self._on_tick(now)
            for slot in list(self._slots()):
                proc = slot.proc
                if proc is None or proc.exit_status is not None:
                    continue
                if self._idle(slot, proc, now):
                    continue
                limit = slot.limits.memory_mb
                # Busy workers with a limit are measured every tick; the rest once a
                # second (a /proc walk per worker is not free, and it holds the GIL).
                if not ((slot.busy and limit) or tick % 20 == 0):
                    continue
                pid = proc.known_pid
                if pid is None:
                    continue
                rss, uss = tree_memory(pid)
                slot.peak_rss = max(slot.peak_rss, rss)
                slot.peak_uss = max(slot.peak_uss, uss)
                if limit and uss > limit * 1048576:
                    proc.kill({"why": f"went over its memory limit of {limit:g} MB (observed "
                                      f"{uss / 1048576:.0f} MB of its own memory in its process tree)",
                               "code": OUT_OF_MEMORY, "counts": False})

    def _idle(self, slot: Slot, proc: WorkerProcess, now: float) -> bool:
        """Retire ``proc`` if it sat idle past the idle timeout; True if it did."""
        idle_s = self.idle_timeout_s
        if (idle_s is None or slot.busy or now - slot.last_used <= idle_s
                or not slot.lock.acquire(timeout=0)):
            return False
        try:
            if slot.proc is proc and not slot.busy:
                self._retire(slot, proc, "idle", f"stopped after {idle_s:g} s idle")
                return True
        finally:
            slot.lock.release()
        return False

    def _reap_retiring(self, now: float) -> None:
        with self._lock:
            due = [proc for proc, at in self._retiring if at <= now]
            self._retiring = [(proc, at) for proc, at in self._retiring if at > now]
        for proc in due:
            proc.zygote.kill(proc.pid)
