"""The spawn start path: a fresh interpreter per worker, with only what every OS has.

    Spawner (the Supervisor's in place of the zygote: start_method="spawn", the default
    off Linux)
      start(slot, init, deadline, tool)
          confinement this system cannot give ─► 503 naming it (platforms.py), unless
                                                 the host said confine="best-effort"
          a spare of the same kind that is up (it said BOOTED: interpreter up, engine
          imported, waiting for its INIT), else the first of the kind's spares to come
          up; INIT held, to go out with the first call in one send ─► WorkerProcess
          (its Child as parent), slot "spawn"
          Two kinds, never mixed: unconfined spares start with the host's environment
          (parity), confined ones with the allowlisted part only (boot.py), so a
          confined worker's process never held the host's secrets.
      settle()  after the call a spare served: its replacement is spawned a moment
                later, by the spawner's thread (it would take the new worker's CPU)
      the reserve: SPARES per kind.  A start that finds none up (calls come faster than
                interpreters start) grows it to one interpreter per usable CPU (2 to
                SPARES_MAX), the missing ones spawned at once; the start takes the first
                up and the next start finds the others up or nearly.  After SHRINK_AFTER_S
                without a hand-out it is SPARES again (the extra spares killed: one
                wake-up, not a timer)
      close()   every child's tree killed

    Child (spawned_child.py): one spawned process, what WorkerProcess, the slot and the
    watchdog ask of a parent
"""
from __future__ import annotations

import select
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Optional

from ... import protocol as P
from ...core.outcomes import Unavailable
from .output import Stream
from .platforms import refusal
from .process import WorkerProcess
from .slot import Slot
from .spawned_child import Child
from .spin import usable_cpus

# Workers spawned ahead, per kind (unconfined, confined)
SPARES = 2
# The most a burst of new libraries grows a kind's reserve to (burst_reserve()).
SPARES_MAX = 8
# Without a hand-out for this long, a grown reserve is SPARES again.
SHRINK_AFTER_S = 60.0
# After a hand-out: its replacement does not compete with the new worker.
RESERVE_DELAY_S = 0.005
# The longest a start waiting for a spare to come up sleeps before it looks again.
WAIT_S = 0.25


def burst_reserve(cpus: int) -> int:
    """A kind's reserve once a start found none of its spares up: as many interpreters as
    there are CPUs to start them side by side (at least 2, at most SPARES_MAX).  More
    than that, and each start of a burst waits for all of them at once."""
    return max(2, min(SPARES_MAX, cpus))


def _known(pid: int) -> Future[int]:
    fut: Future[int] = Future()
    fut.set_result(pid)
    return fut


class Spawner:
    """The spares and children of one Supervisor on the spawn path.  Thread-safe."""

    def __init__(self, on_exit: Callable[[int, int], None]) -> None:
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._spares: dict[bool, list[Child]] = {False: [], True: []}
        # The kinds kept in reserve (confined: once asked for)
        self._kinds = {False}
        # Spares wanted, per kind.
        self._reserve = {False: SPARES, True: SPARES}
        # ... and once a start found none up.
        self._burst = max(SPARES, burst_reserve(usable_cpus()))
        # Starts waiting for a spare to come up, and the spares they are spawning.
        self._waiting = {False: 0, True: 0}
        self._pending = {False: 0, True: 0}
        # The last hand-out (a grown reserve shrinks after)
        self._handed = time.monotonic()
        # The kinds started at least once (a kind's first start is no burst).
        self._started: set[bool] = set()
        # Starts that found none of their kind's spares up (a kind's first start aside).
        self.misses = 0
        self._children: dict[int, Child] = {}
        # When the thread spawns what is missing (0: not owed)
        self._due = time.monotonic()
        # A spare was handed out: settle() owes its replacement.
        self.owed = False
        self.alive = True
        self._thread = threading.Thread(target=self._run, name="lcp-sandbox-spawner", daemon=True)
        self._thread.start()

    def start(self, slot: Slot, init: P.Init, deadline: Optional[float],
              tool: str) -> WorkerProcess:
        """Start ``slot``'s worker and attach it to the slot (503: confinement this
        system cannot give; OSError: it could not be spawned)."""
        confined = init.confine is not None
        why = refusal(confined, slot.limits.network, slot.limits.confine)
        if why:
            raise Unavailable.not_run(slot.library.name, tool, why, "no_start")
        child = self._take(confined, deadline)
        conn = child.conn
        try:
            try:
                # Sent with the call: the worker wakes once.
                conn.hold(P.INIT, init)
            except P.PayloadError:
                conn.send(P.INIT, init, deadline)
        except BaseException:
            child.kill()
            raise
        child.stream = Stream(slot.library.name, slot.limits.log_bytes_per_s)
        if child.job is not None:
            child.job.limit_memory(slot.limits.memory_mb)
        proc = WorkerProcess(_known(child.pid), child, conn, init.tmpdir, "spawn")
        child.proc = proc
        slot.attach(proc, "spawn")
        return proc

    def _spawn(self, confined: bool, ahead: bool) -> Child:
        child = Child(confined, self._ended, ahead)
        with self._lock:
            if not self.alive:
                child.kill()
                raise OSError("the supervisor is closing")
            self._children[child.pid] = child
        return child

    def _ended(self, pid: int, status: int) -> None:
        with self._lock:
            child = self._children.pop(pid, None)
            if child is not None and child in self._spares[child.confined]:
                self._spares[child.confined].remove(child)
        self._on_exit(pid, status)

    def _take(self, confined: bool, deadline: Optional[float]) -> Child:
        """A spare of the kind that is up, else the first to come up (TimeoutError: none
        by ``deadline``).  None up: the reserve grows, its missing spares spawned now."""
        with self._cond:
            first = confined not in self._started
            self._started.add(confined)
            self._kinds.add(confined)
            self.owed = True
            self._handed = time.monotonic()
            child = self._up(confined)
            if child is not None:
                return child
            if not first:
                # Calls come faster than interpreters start.
                self.misses += 1
                self._reserve[confined] = self._burst
            self._waiting[confined] += 1
        try:
            return self._first_up(confined, deadline, 1 if first else self._reserve[confined])
        finally:
            with self._lock:
                self._waiting[confined] -= 1

    def _first_up(self, confined: bool, deadline: Optional[float], want: int) -> Child:
        """The first of the kind's spares to come up, with ``want`` of them starting side by
        side (this start takes the first up, the next ones find the others up or nearly),
        and never fewer than the starts waiting for one."""
        while True:
            with self._cond:
                child = self._up(confined)
                if child is not None:
                    return child
                spares = self._spares[confined]
                short = (max(want, self._waiting[confined]) - len(spares)
                         - self._pending[confined])
                self._pending[confined] += max(0, short)
                left = None if deadline is None else deadline - time.monotonic()
                if short <= 0 and (left is None or left > 0) and not spares:
                    # Spawned by another start, not yet among the spares.
                    self._cond.wait(left)
                    continue
                starting = [c.conn.sock for c in spares]
            if short > 0:
                self._add_spares(confined, short)
                continue
            if left is not None and left <= 0:
                raise TimeoutError(f"no spawned interpreter was up before the call's deadline "
                                   f"({len(starting)} starting)")
            try:
                # A bounded wait: a spare taken by another start meanwhile may be closed.
                select.select(starting, [], [], WAIT_S if left is None else min(WAIT_S, left))
            except (OSError, ValueError):
                pass

    def _up(self, confined: bool) -> Optional[Child]:
        """(holding the lock) The kind's first spare that is up, taken from the spares;
        those that ended are dropped."""
        spares = self._spares[confined]
        for child in list(spares):
            up = child.up()
            if up is not False:
                spares.remove(child)
            if up:
                return child
        return None

    def _add_spares(self, confined: bool, n: int) -> None:
        """The ``n`` spares a start counted as pending, spawned and added; when one cannot
        be spawned, it and those after it are pending no more."""
        for left in range(n, 0, -1):
            child: Optional[Child] = None
            try:
                child = self._spawn(confined, ahead=False)
            finally:
                with self._cond:
                    self._pending[confined] -= 1 if child is not None else left
                    if child is not None:
                        self._spares[confined].append(child)
                    self._cond.notify_all()

    def settle(self) -> None:
        """Spawn what the last hand-outs used, a moment from now."""
        if self.owed:
            with self._cond:
                self.owed = False
                self._due = self._due or time.monotonic() + RESERVE_DELAY_S
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self.alive and (not self._due or self._due > time.monotonic()):
                    if self._shrink():
                        continue
                    self._cond.wait(self._wait_s())
                if not self.alive:
                    return
                self._due = 0.0
                missing = [(k, n < SPARES) for k in self._kinds
                           for n in range(len(self._spares[k]), self._reserve[k])]
            for confined, ahead in missing:
                try:
                    child = self._spawn(confined, ahead)
                except OSError:
                    continue
                with self._lock:
                    self._spares[confined].append(child)

    def _wait_s(self) -> Optional[float]:
        """(holding the lock) How long the thread may sleep: until what is owed is due, or
        until a grown reserve shrinks; None: until notified."""
        now = time.monotonic()
        waits = [self._due - now] if self._due else []
        if max(self._reserve.values()) > SPARES:
            waits.append(self._handed + SHRINK_AFTER_S - now)
        return max(0.0, min(waits)) if waits else None

    def _shrink(self) -> bool:
        """(holding the lock) After SHRINK_AFTER_S without a hand-out, a grown reserve is
        SPARES again and its extra spares are killed; True when it shrank."""
        if (max(self._reserve.values()) <= SPARES
                or time.monotonic() - self._handed < SHRINK_AFTER_S):
            return False
        for kind, spares in self._spares.items():
            self._reserve[kind] = SPARES
            while len(spares) > SPARES:
                spares.pop().kill()
        return True

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"spares": sum(len(s) for s in self._spares.values()),
                    "children": len(self._children),
                    "reserve": {"unconfined": self._reserve[False],
                                "confined": self._reserve[True]},
                    "misses": self.misses}

    def close(self, timeout: float = 5.0) -> None:
        """Kill every child's tree and stop the spawner's thread."""
        with self._cond:
            self.alive = False
            self._cond.notify()
            children = list(self._children.values())
        for child in children:
            child.kill()
        for child in children:
            child.wait_exit(child.pid, timeout)
        self._thread.join(timeout)
