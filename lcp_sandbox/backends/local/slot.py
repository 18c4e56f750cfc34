"""A slot: the place of one worker, keyed by (tenant, library, confinement root).

A slot outlives its workers.  It serves its calls one at a time in arrival
order (:class:`FifoLock`), holds the worker process of the moment (or none),
counts calls and restarts, and owns the crash policy's bookkeeping: workers
that keep dying put the library in quarantine, for a back-off that doubles.

    deaths ──► record_death()
                 K fresh workers died in a row, or more than N deaths in T s?
                   └─► quarantined for backoff_s (5 s, 10 s, ... 300 s)
    call ───► refuse_if_quarantined() ─► 503 while it lasts
    a call served ──► served(): the fresh-death count and the back-off start over

Its fields are written by its own methods only; the supervisor, the templates
and the watchdog read them and call these:

    configure(limits)  begin_call()  end_call(now)        a call (supervisor)
    attach(proc, start, template)  started_fresh(why)     a worker started (templates)
    uses_environment(environment)                         its library's own (starts)
    detach(proc)  ended(how)                              a worker gone (supervisor)
    measured(...)                                         a memory sample (watchdog)
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from ... import protocol as P
from ...core.discovery import Library
from ...core.limits import Limits
from ...core.outcomes import Unavailable
from ...system.proc import tree_memory
from .spin import SpinPolicy

if TYPE_CHECKING:
    from .process import WorkerProcess


class FifoLock:
    """A lock granted in arrival order (threading.Lock makes no such promise).

    ``_held`` is a plain lock held by the owner; it passes from owner to waiter
    without being released.  Uncontended, acquire is one non-blocking
    ``_held.acquire`` (no waiter queued: nobody arrived first); a queued waiter
    keeps later callers off that path, and release hands over under ``_mutex``."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._waiters: collections.deque[threading.Lock] = collections.deque()
        self._held = threading.Lock()

    def acquire(self, timeout: Optional[float] = None) -> bool:
        if not self._waiters and self._held.acquire(False):
            return True
        with self._mutex:
            if not self._waiters and self._held.acquire(False):
                return True
            gate = threading.Lock()
            gate.acquire()
            self._waiters.append(gate)
        if gate.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            return True
        with self._mutex:
            try:
                self._waiters.remove(gate)
                return False
            except ValueError:
                # Handed over just as we gave up: we own it.
                return True

    def release(self) -> None:
        with self._mutex:
            if self._waiters:
                # Ownership passes directly.
                self._waiters.popleft().release()
            else:
                self._held.release()

    def __enter__(self) -> "FifoLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


@dataclass
class CrashPolicy:
    # K fresh workers dying in a row before serving a call.
    fresh_deaths: int = 5
    # Or N deaths ...
    deaths: int = 50
    # ... within T seconds.
    window_s: float = 60.0
    # First quarantine; doubles up to backoff_max_s.
    backoff_s: float = 5.0
    backoff_max_s: float = 300.0


@dataclass
class Slot:
    tenant: str
    library: Library
    limits: Limits
    # Confinement root ("" when not confined)
    root: str = ""
    lock: FifoLock = field(default_factory=FifoLock)
    proc: Optional["WorkerProcess"] = None
    busy: bool = False
    # The host thread whose call runs (interrupt())
    caller: Optional[int] = None
    # interrupt() signalled the call in flight.
    interrupted: bool = False
    calls: int = 0
    starts: int = 0
    last_exit: Optional[str] = None
    peak_rss: int = 0
    peak_uss: int = 0
    # How its worker started: "template" | "fresh (why)".
    start: str = ""
    # The template it came from (templates.py's)
    template: Any = None
    # Its library's own (backends/envs/)
    environment: Optional[dict[str, Any]] = None
    # crash-loop bookkeeping
    fresh_deaths: int = 0
    deaths: collections.deque[float] = field(default_factory=collections.deque)
    quarantined_until: float = 0.0
    backoff_s: float = 0.0
    last_used: float = 0.0
    # memory: the last sample of its worker's tree (backends/local/watchdog.py takes them)
    # The worker it was taken of.
    mem_pid: int = 0
    mem_rss: int = 0
    mem_uss: int = 0
    # When (time.monotonic())
    mem_at: float = 0.0
    # Its last worker's pids cgroup (max_processes)
    cgroup: Optional[str] = None
    # Its binding's own secrets (WorkerSpec.secrets): for its workers' egress proxy
    secrets: Mapping[str, str] = field(default_factory=dict)
    # Its warm calls' spin windows.
    spin: SpinPolicy = field(default_factory=SpinPolicy)

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)

    # ------------------------------------------------------------ calls
    def configure(self, limits: Limits, secrets: Mapping[str, str]) -> None:
        """The library's settings as the call that arrives says them."""
        self.limits = limits
        self.secrets = secrets

    def begin_call(self) -> None:
        """Its worker is about to get a call from this thread."""
        self.busy = True
        self.interrupted = False
        self.caller = threading.get_ident()

    def end_call(self, now: float) -> None:
        """The call ended (answered or not) at ``now``."""
        self.busy = False
        self.caller = None
        self.last_used = now

    # ------------------------------------------------------------ its worker
    def attach(self, proc: "WorkerProcess", start: str, template: Any = None) -> None:
        """``proc`` serves it now; ``start`` says how it started ("template", "base (why)",
        "fresh (why)")."""
        self.proc, self.start, self.template = proc, start, template
        self.starts += 1

    def uses_environment(self, environment: Optional[dict[str, Any]]) -> None:
        """Its next worker starts with ``environment`` (None: the host's)."""
        self.environment = environment

    def started_fresh(self, why: str) -> None:
        """Its worker imported the library itself after all (``why``)."""
        self.start = f"fresh ({why})"

    def detach(self, proc: "WorkerProcess") -> bool:
        """``proc`` no longer serves it; False when it was not its worker (any more)."""
        if self.proc is not proc:
            return False
        self.proc = None
        return True

    def ended(self, how: str) -> None:
        """How its last worker ended, in words."""
        self.last_exit = how

    def interrupt(self) -> bool:
        """Signal the call in flight as its soft timeout would (the host cancelled it).
        Not a call still queued.  A worker whose READY the host has not read yet is
        signalled when it is (its handler is in place by then: backends/local/process.py)."""
        proc = self.proc
        if not self.busy or proc is None or proc.exit_status is not None:
            return False
        self.interrupted = proc.interrupted = True
        if proc.ready:
            proc.zygote.signal(proc.pid, P.SOFT_TIMEOUT_SIGNAL)
        return True

    def measured(self, pid: int, rss: int, uss: int, at: float) -> None:
        """A sample of the memory of worker ``pid``'s tree."""
        self.mem_pid, self.mem_rss, self.mem_uss, self.mem_at = pid, rss, uss, at
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_uss = max(self.peak_uss, uss)

    def memory(self, pid: int, now: float) -> tuple[int, int, float]:
        """(rss, uss, age in s) of worker ``pid``'s tree: the last sample if none of its
        calls ended since (an idle worker's memory is bounded inside it, RLIMIT_DATA),
        else read now (/proc, about 0.1 ms per process of the tree) and kept."""
        if self.mem_pid != pid or self.mem_at < self.last_used:
            rss, uss = tree_memory(pid)
            self.measured(pid, rss, uss, now)
        return self.mem_rss, self.mem_uss, max(0.0, now - self.mem_at)

    def stats(self, now: float) -> dict[str, Any]:
        """What Supervisor.stats() says of this slot: ``library``, ``tenant``, ``pid``
        (None when no worker runs), ``state`` (idle, busy, stopped or quarantined),
        ``calls``, ``restarts``, ``last_exit`` (how the last worker ended),
        ``rss``/``peak_rss`` and ``uss``/``peak_uss`` (bytes, the worker's whole process
        tree; USS: its own pages only), ``memory_age_s`` (how old ``rss``/``uss`` are),
        ``start`` ("template" or "fresh (why)"), ``protections`` (the confinement in
        force), ``workspace_root``, ``environment`` (None: the host's; else its key,
        folder, declaration, pinned versions and how it is used), and ``spin``
        (backends/local/spin.py):
        ``host_window_us`` / ``worker_window_us``, how long the host
        polled for the last call's answer and the worker for the next call after it
        (0: not at all); ``host_hits`` / ``host_misses``, calls whose answer the
        host's poll caught / did not; ``worker_hits`` / ``worker_misses``, calls sent
        within / after the worker's window; ``off_busy``, calls sent with spinning
        off because as many calls as usable CPUs were in flight.

        ``rss``/``uss`` are a sample: the one taken about a second after its last call
        ended (or every 50 ms during a call with a memory limit), else read now when a
        call ended since; the peaks are the largest samples."""
        proc = self.proc
        pid = proc.known_pid if proc is not None and proc.exit_status is None else None
        rss, uss = 0, 0
        age: Optional[float] = None
        if pid is not None:
            rss, uss, age = self.memory(pid, now)
        return {
            "library": self.library.name, "tenant": self.tenant,
            "pid": pid,
            "state": ("quarantined" if self.quarantined_until > now else
                      "busy" if self.busy else "idle" if pid is not None else "stopped"),
            "calls": self.calls, "restarts": self.restarts, "last_exit": self.last_exit,
            "rss": rss, "peak_rss": max(self.peak_rss, rss),
            "uss": uss, "peak_uss": max(self.peak_uss, uss),
            "memory_age_s": age, "start": self.start or None,
            "protections": proc.protections if proc is not None and pid is not None else {},
            "workspace_root": self.root or None,
            "environment": self.environment,
            "spin": self.spin.stats(),
        }

    def refuse_if_quarantined(self, tool: str, now: float) -> None:
        if self.quarantined_until > now:
            raise Unavailable.not_run(
                self.library.name, tool, f"the library is quarantined after its workers died "
                f"repeatedly ({self.last_exit}); it will be retried in "
                f"{self.quarantined_until - now:.0f} s.", "quarantine")

    def served(self) -> None:
        """A worker answered a call: the crash loop, if any, is over."""
        self.calls += 1
        self.fresh_deaths = 0
        self.backoff_s = 0.0

    def record_death(self, policy: CrashPolicy, fresh: bool) -> Optional[float]:
        """Count a worker's death; returns the quarantine's length when one starts now."""
        now = time.monotonic()
        self.fresh_deaths = self.fresh_deaths + 1 if fresh else 0
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > policy.window_s:
            self.deaths.popleft()
        if self.fresh_deaths >= policy.fresh_deaths or len(self.deaths) > policy.deaths:
            self.backoff_s = min(policy.backoff_max_s,
                                 self.backoff_s * 2 if self.backoff_s else policy.backoff_s)
            self.quarantined_until = now + self.backoff_s
            return self.backoff_s
        return None


def evict_one(slots: list[Slot], asking: Slot, tenant: Optional[str],
              retire: Callable[[Slot, "WorkerProcess", str, str], None]) -> bool:
    """Retire the least recently used idle worker (of ``tenant`` if given) to make
    room for ``asking``'s; False when none is idle."""
    candidates = sorted((s for s in slots if s is not asking and s.proc is not None
                         and not s.busy and (tenant is None or s.tenant == tenant)),
                        key=lambda s: s.last_used)
    for victim in candidates:
        if victim.lock.acquire(timeout=0):
            try:
                proc = victim.proc
                if proc is not None and not victim.busy:
                    retire(victim, proc, "evict", "evicted to make room for another worker")
                    return True
            finally:
                victim.lock.release()
    return False
