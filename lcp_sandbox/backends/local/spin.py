"""Spin-then-block waits on the warm call path, and the windows they may last.

A blocking read costs a scheduler wake-up on each side of every call: the
sleeper is put back on a CPU only after the sender's syscall returns, tens of
microseconds on a small call.  When the answer is sure to come soon, polling
the socket for a short while is cheaper than sleeping (adaptive mutexes do the
same).  Per slot, from what its recent calls did:

    host:    send CALL(spin_us = worker's budget) ─► poll for host_window ─► block
    worker:  send RESULT ─► poll for the next CALL for spin_us ─► block

    host_window   ~ 2 x the slot's typical service time (send CALL .. RESULT there)
    worker budget ~ 2 x the slot's typical gap (RESULT there .. next CALL sent)

Both are running averages of recent calls (a long sample counts as 2 x the
cap, so a few long ones turn spinning off), capped at ``SPIN_CAP_S``, and 0
when the typical wait is longer than the cap: spinning only where it pays off.
Polls that miss twice in a row pause that side's polling for 1, 2, 4 ... 64
calls (when both sides share one CPU, a poll only delays the other side).
Nothing spins when at least as many calls are in flight in this host process
as it has usable CPUs (its affinity, or a cgroup quota; ``calls_in_flight``), and
nothing spins outside the window right after a call: an idle worker sleeps in a
blocking read.

The worker's reads are bounded by what the host told it (the host's message
is trusted); the host's by its own window and the call's deadline, never by
anything the worker says.
"""
from __future__ import annotations

import os
from typing import Optional

# The longest either side ever polls for one message.
SPIN_CAP_S = 200e-6
# Added to a window: a typical wait is not a bound.
_SLACK_S = 10e-6
# Of a new sample in the running averages.
_WEIGHT = 0.25


def usable_cpus(cgroup: str = "/sys/fs/cgroup") -> int:
    """CPUs this process may run on: its affinity, lowered by a cgroup CPU quota
    (a container limited to 1 CPU on a 2-CPU machine must not spin on both)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for quota_file, period_file in (("cpu.max", None),
                                    ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        try:
            with open(os.path.join(cgroup, quota_file)) as f:
                words = f.read().split()
            quota = words[0]
            if period_file is None:
                period = words[1]
            else:
                with open(os.path.join(cgroup, period_file)) as f:
                    period = f.read().strip()
            if quota not in ("max", "-1") and int(period) > 0:
                n = min(n, max(1, -(-int(quota) // int(period))))
            break
        except (OSError, ValueError, IndexError):
            continue
    return n


USABLE_CPUS = usable_cpus()


class InFlight:
    """Which calls are in flight in this host process (every Supervisor's): a set
    of tokens, one per call, whose add and discard the GIL makes atomic (no lock)."""

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: set[int] = set()

    def enter(self, token: int) -> int:
        """Count the call ``token`` (unique while it runs); returns the count with it."""
        calls = self._calls
        calls.add(token)
        return len(calls)

    def leave(self, token: int) -> None:
        self._calls.discard(token)


calls_in_flight = InFlight()


# (Conditional expressions, not min(): these run on every warm call, and min() costs
# several times as much.)
# A sample counts as at most this much.
_LONG_S = 2 * SPIN_CAP_S


def _window(typical: float) -> float:
    if typical > SPIN_CAP_S:
        return 0.0
    w = 2.0 * typical + _SLACK_S
    return w if w < SPIN_CAP_S else SPIN_CAP_S


class _Backoff:
    """Misses in a row pause one side's polling for 1, 2, 4 ... 64 calls; a hit ends
    the pause.  A poll that keeps missing is most likely on the CPU the other side
    needs (the scheduler put both on one CPU): it would only delay the answer."""

    __slots__ = ("streak", "hold")

    def __init__(self) -> None:
        self.streak = 0
        self.hold = 0

    def record(self, hit: bool) -> None:
        if hit:
            self.streak = 0
        else:
            self.streak += 1
            if self.streak >= 2:
                self.hold = min(64, 1 << (self.streak - 2))

    def paused(self) -> bool:
        if self.hold:
            self.hold -= 1
            return True
        return False


class SpinPolicy:
    """One slot's spin windows, learned from its calls, and what they caught.

    ``plan`` before a call is sent, ``answered`` when its RESULT arrived."""

    __slots__ = ("service", "gap", "last_answer", "host_window", "worker_budget", "host_hits",
                 "host_misses", "worker_hits", "worker_misses", "off_busy", "host_backoff",
                 "worker_backoff")

    def __init__(self) -> None:
        # Running averages (s): optimistic until measured.
        self.service = SPIN_CAP_S
        self.gap = SPIN_CAP_S
        # time.monotonic() of the last RESULT (0: none yet)
        self.last_answer = 0.0
        # Of the call in flight, s.
        self.host_window = 0.0
        # Given to the worker with the call in flight, s.
        self.worker_budget = 0.0
        self.host_hits = self.host_misses = 0
        self.worker_hits = self.worker_misses = 0
        # Calls sent with spinning off: too many calls in flight.
        self.off_busy = 0
        self.host_backoff = _Backoff()
        self.worker_backoff = _Backoff()

    def plan(self, now: float, in_flight: int) -> tuple[float, int]:
        """For a call sent at ``now`` with ``in_flight`` calls running (this one
        included): (how long the host polls for its answer in s, the worker's
        budget for the next call in us)."""
        if self.last_answer:
            gap = now - self.last_answer
            # Did the worker's poll catch this call?
            if self.worker_budget:
                hit = gap <= self.worker_budget
                # A hit after a hit changes nothing.
                if not hit or self.worker_backoff.streak:
                    self.worker_backoff.record(hit)
                if hit:
                    self.worker_hits += 1
                else:
                    self.worker_misses += 1
            self.gap += ((gap if gap < _LONG_S else _LONG_S) - self.gap) * _WEIGHT
            # A call that never answers teaches nothing.
            self.last_answer = 0.0
        if in_flight >= USABLE_CPUS:
            self.off_busy += 1
            self.host_window = self.worker_budget = 0.0
            return 0.0, 0
        # (``hold and``: no call into a back-off that holds nothing, the common case)
        host, worker = self.host_backoff, self.worker_backoff
        self.host_window = 0.0 if host.hold and host.paused() else _window(self.service)
        self.worker_budget = 0.0 if worker.hold and worker.paused() else _window(self.gap)
        return self.host_window, int(self.worker_budget * 1e6)

    def answered(self, sent: float, now: float, caught: Optional[bool]) -> None:
        """The RESULT of the call sent at ``sent`` arrived at ``now``; ``caught``:
        the host's poll got it (None: the host did not poll)."""
        took = now - sent
        self.service += ((took if took < _LONG_S else _LONG_S) - self.service) * _WEIGHT
        self.last_answer = now
        if caught is not None:
            if not caught or self.host_backoff.streak:
                self.host_backoff.record(caught)
            if caught:
                self.host_hits += 1
            else:
                self.host_misses += 1

    def stats(self) -> dict[str, float]:
        return {"host_window_us": round(self.host_window * 1e6, 1),
                "worker_window_us": round(self.worker_budget * 1e6, 1),
                "host_hits": self.host_hits, "host_misses": self.host_misses,
                "worker_hits": self.worker_hits, "worker_misses": self.worker_misses,
                "off_busy": self.off_busy}
