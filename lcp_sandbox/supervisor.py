"""The supervisor: worker slots keyed by (tenant, library), routing, limits.

    SandboxedBinding.execute_tool ─► Supervisor.run(tenant, library, msg)
        slot = slots[(tenant, library.key)]            one FIFO lock per slot
        with slot.lock:
            quarantined? ─► 503
            no live worker? ─► Zygote.fork() + INIT      (fresh worker)
            send msg; loop on the worker's connection:
                REQUEST  ─► run it here (handler / host object), REPLY; clock paused
                RESULT   ─► done (events: timeout 504, MemoryError 507)
                deadline ─► SIGUSR1 (soft) ... grace ... kill tree (hard, 504)
                EOF      ─► worker died: exit status from the zygote, 500 / 507
    watchdog thread: RSS of each worker's process tree vs memory_mb ─► kill, 507;
                     idle workers past idle_timeout_s ─► stopped
    output thread:   worker stdout/stderr ─► logging (output.py)
    pool (pool.py):  max_workers / max_workers_per_tenant, fair queue, LRU eviction

Calls to one worker are served one at a time in arrival order; calls to
different slots never wait for each other (no global lock is held while a
call runs).  Sandbox events raise :class:`SandboxEvent` carrying the LCP
failure result to return.
"""
from __future__ import annotations

import atexit
import collections
import logging
import os
import shutil
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import normalize
from . import protocol as P
from .confine import DEFAULT_RUN_AS, hand_over, in_force, may_hand_over, private_tmpdir, run_as_ids
from .discovery import Library
from .limits import Limits, describe_exit, tree_rss
from .output import OutputPump
from .pool import Pool
from .proxies import HostObjects, rebuild_error
from .zygote import Zygote, ZygoteGone

log = logging.getLogger("lcp_sandbox")
events_log = logging.getLogger("lcp_sandbox.events")


class SandboxEvent(Exception):
    """A call ended by the sandbox, not by the tool; ``result`` is what to return."""

    def __init__(self, result: dict) -> None:
        super().__init__(result.get("error"))
        self.result = result


class FifoLock:
    """A lock granted in arrival order (threading.Lock makes no such promise)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._waiters: collections.deque = collections.deque()
        self._held = False

    def acquire(self, timeout: Optional[float] = None) -> bool:
        with self._mutex:
            if not self._held and not self._waiters:
                self._held = True
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
                return True            # handed over just as we gave up: we own it

    def release(self) -> None:
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().release()   # ownership passes directly
            else:
                self._held = False

    def __enter__(self) -> "FifoLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


@dataclass
class _Process:
    forked: Future                         # the zygote's answer: the pid
    zygote: Zygote                         # its parent: reaps it, kills it, signals it
    conn: P.Connection
    started: float
    tmpdir: Optional[str] = None           # made by the host, removed by the host
    calls: int = 0
    exit_status: Optional[int] = None      # set when the zygote reports it
    kill_reason: Optional[dict] = None     # set by whoever killed it on purpose
    ready: bool = False                    # its READY arrived (exactly once, first)
    report: dict = field(default_factory=dict)   # READY: protections in force

    @property
    def pid(self) -> int:
        return self.forked.result(30.0)

    @property
    def known_pid(self) -> Optional[int]:
        """The pid if the zygote already said it (never waits)."""
        f = self.forked
        return f.result() if f.done() and f.exception() is None else None


@dataclass
class Slot:
    tenant: str
    library: Library
    limits: Limits
    root: str = ""                         # confinement root ("" when not confined)
    lock: FifoLock = field(default_factory=FifoLock)
    proc: Optional[_Process] = None
    busy: bool = False
    caller: Optional[int] = None           # the host thread whose call runs (interrupt() targets it)
    interrupted: bool = False              # interrupt() signalled the call in flight
    calls: int = 0
    starts: int = 0
    last_exit: Optional[str] = None
    peak_rss: int = 0
    # crash-loop bookkeeping
    fresh_deaths: int = 0
    deaths: collections.deque = field(default_factory=collections.deque)
    quarantined_until: float = 0.0
    backoff_s: float = 0.0
    last_used: float = 0.0

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)


@dataclass
class CrashPolicy:
    fresh_deaths: int = 5          # K fresh workers dying in a row before serving a call
    deaths: int = 50               # or N deaths ...
    window_s: float = 60.0         # ... within T seconds
    backoff_s: float = 5.0         # first quarantine; doubles up to backoff_max_s
    backoff_max_s: float = 300.0


_KIND = {P.Call: P.CALL, P.Prompt: P.PROMPT, P.ModCall: P.MODCALL, P.Load: P.LOAD}
_READY_CAPS = {P.READY: P.READY_CAP}


def _is_error(v: Any) -> bool:
    return type(v) is list and len(v) == 2 and type(v[0]) is str and type(v[1]) is list


def _invalid_value(msg: tuple, value: Any) -> Optional[str]:
    """Why a RESULT's value cannot be the answer to ``msg`` (None when it can)."""
    t = type(msg)
    if t is P.Call:
        if (type(value) is not dict or type(value.get("status_code")) is not int
                or not (value.get("success") is None or type(value.get("success")) is bool)):
            return "a tool result that is not an LCP result dict"
    elif t is P.Prompt:
        if value is not None and type(value) is not str:
            return "a prompt that is not text"
    elif t is P.Load:
        if value is not None and not (type(value) is list and len(value) == 2
                                      and all(type(x) is str for x in value)):
            return "a malformed load answer"
    return None


def _check_root(slot: Slot, root: str, tool: str) -> None:
    """A confinement root must not hold the engine or the Python installation: a
    confined tool could rewrite code that later runs unconfined (the zygote)."""
    if not may_hand_over(os.path.realpath(root)):
        raise SandboxEvent(normalize.failure(
            f"[{slot.library.name}] tool '{tool}' not run: its confinement root {root!r} is or holds a "
            f"system directory, the sandbox engine or the Python installation, which a confined tool "
            f"must not be able to write. Use a workspace of its own.", normalize.FORBIDDEN))


_live_supervisors: "weakref.WeakSet[Supervisor]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for sup in list(_live_supervisors):
        sup.close()


class Supervisor:
    """Owns the zygote, the worker slots and the threads that watch them."""

    def __init__(self, max_workers: Optional[int] = None, max_workers_per_tenant: Optional[int] = None,
                 idle_timeout_s: Optional[float] = None, confine: bool = False,
                 on_event: Optional[Callable[[dict], None]] = None,
                 crash_policy: Optional[CrashPolicy] = None, watch_interval_s: float = 0.05,
                 run_as: tuple = DEFAULT_RUN_AS) -> None:
        """``confine`` is the default for bindings that do not say (see confine.py);
        ``run_as`` is the (uid, gid) a confined worker of a root host runs as (per
        library: ``"sandbox": {"run_as": ...}``); ``on_event`` gets a dict per
        lifecycle event (start, stop, evict, idle, crash, timeout, interrupt, memory,
        quarantine), also logged on ``lcp_sandbox.events``."""
        self.crash_policy = crash_policy or CrashPolicy()
        self.confine = confine
        self.run_as = run_as_ids(run_as)
        self.idle_timeout_s = idle_timeout_s
        self.on_event = on_event
        self.pool = Pool(max_workers, max_workers_per_tenant)
        self._slots: dict[tuple, Slot] = {}
        self._by_pid: dict[int, Slot] = {}
        self._lock = threading.Lock()
        self._zygote: Optional[Zygote] = None
        self._pump: Optional[OutputPump] = None
        self._closed = False
        self._watch_interval = watch_interval_s
        self._watcher: Optional[threading.Thread] = None
        self._wake = threading.Event()
        self._retiring: list[tuple[_Process, float]] = []   # (worker, kill if still alive at)
        self._warned: set[str] = set()
        _live_supervisors.add(self)

    def _event(self, kind: str, slot: Slot, **details: Any) -> None:
        event = {"event": kind, "tenant": slot.tenant, "library": slot.library.name, **details}
        events_log.info("%s", event)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("on_event callback failed")

    # ------------------------------------------------------------ plumbing
    def _zyg(self) -> Zygote:
        with self._lock:
            if self._closed:
                raise SandboxEvent(normalize.failure("The sandbox supervisor is closed.", normalize.UNAVAILABLE))
            if self._zygote is None or not self._zygote.alive:
                try:
                    self._zygote = Zygote(on_exit=self._on_exit)
                except ZygoteGone as exc:
                    raise SandboxEvent(normalize.failure(f"The sandbox could not start: {exc}",
                                                         normalize.UNAVAILABLE)) from None
                self._pump = self._pump or OutputPump()
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="lcp-sandbox-watchdog", daemon=True)
                self._watcher.start()
            return self._zygote

    def start(self) -> None:
        """Start the zygote now and wait until it can fork (else the first call does)."""
        self._zyg()

    def _on_exit(self, pid: int, status: int) -> None:
        slot = self._by_pid.pop(pid, None)
        if slot is not None and slot.proc is not None and slot.proc.pid == pid:
            slot.proc.exit_status = status

    def slot(self, tenant: str, library: Library, limits: Limits, root: str = "") -> Slot:
        key = (tenant, library.key, root)
        s = self._slots.get(key)
        if s is None:
            with self._lock:
                s = self._slots.get(key)
                if s is None:
                    s = self._slots[key] = Slot(tenant, library, limits, root)
        else:
            s.limits = limits
        return s

    # ------------------------------------------------------------ workers
    def _spawn(self, slot: Slot, init: P.Init, deadline: Optional[float], tool: str) -> _Process:
        if self.pool.limited:
            try:
                self.pool.reserve(slot.tenant, deadline, lambda tenant: self._evict_one(slot, tenant))
            except TimeoutError:
                raise SandboxEvent(normalize.failure(
                    f"[{slot.library.name}] tool '{tool}' not run: no worker became free in time "
                    f"(pool of {self.pool.max_workers} workers, {self.pool.max_per_tenant} per tenant, "
                    f"all busy).", normalize.UNAVAILABLE)) from None
        else:
            self.pool.reserve(slot.tenant, None, lambda tenant: False)
        tmpdir = None
        try:
            zyg = self._zyg()
            if init.confine is not None:
                root = init.confine["root"]
                _check_root(slot, root, tool)
                run_as = slot.limits.run_as or self.run_as
                # It will drop to run_as: give it its root.  Its private temp dir is the
                # host's to make and to remove: no path a worker names is ever deleted.
                try:
                    hand_over(root, *run_as)
                except OSError as exc:
                    raise SandboxEvent(normalize.failure(
                        f"[{slot.library.name}] tool '{tool}' not run: could not start a worker: {exc}",
                        normalize.UNAVAILABLE)) from None
                tmpdir = private_tmpdir(run_as)
                init = init._replace(confine={**init.confine, "run_as": run_as}, tmpdir=tmpdir)
            host_sock, worker_sock = P.pair()
            log_r, log_w = os.pipe()
            conn = P.Connection(host_sock)
            try:
                # INIT waits in the socket; the worker reads it as soon as it runs.
                # The call itself follows at once: nobody waits for the fork.
                conn.send(P.INIT, init)
                forked = zyg.fork(worker_sock.fileno(), log_w)
            except (ZygoteGone, OSError) as exc:
                conn.close()
                os.close(log_r)
                raise SandboxEvent(normalize.failure(
                    f"[{slot.library.name}] tool '{tool}' not run: could not start a worker: {exc}",
                    normalize.UNAVAILABLE))
            finally:
                worker_sock.close()
                os.close(log_w)
        except BaseException:
            self.pool.release(slot.tenant)
            if tmpdir:
                shutil.rmtree(tmpdir, ignore_errors=True)
            raise
        self._pump.add(log_r, slot.library.name, slot.limits.log_bytes_per_s)
        proc = _Process(forked, zyg, conn, time.monotonic(), tmpdir)
        slot.proc = proc
        slot.starts += 1

        def known(f: Future) -> None:
            if f.exception() is None:
                with self._lock:
                    self._by_pid[f.result()] = slot
        forked.add_done_callback(known)
        return proc

    def _ready(self, slot: Slot, proc: _Process, init: Optional[P.Init], report: dict) -> None:
        """The worker's READY: what protections are in force."""
        proc.ready = True
        proc.report = report
        self._event("start", slot, pid=proc.pid, protections=self._protections(proc))
        self._warn_missing(slot, proc, init)

    def _warn_missing(self, slot: Slot, proc: _Process, init: Optional[P.Init]) -> None:
        """One clear warning per kind when a requested protection is not in force."""
        wanted = []
        if init is not None and init.confine is not None:
            wanted += ["filesystem", "privileges"] + ([] if slot.limits.network else ["unix_sockets"])
        if not slot.limits.network:
            wanted.append("network")
        for kind in wanted:
            state = str(proc.report.get(kind, "unknown"))
            if not in_force(kind, state) and kind not in self._warned:
                self._warned.add(kind)
                log.warning("%s confinement requested for %s (tenant %s) is not in force: %s. "
                            "The worker runs without it; stats() shows what is active.",
                            kind, slot.library.name, slot.tenant, state)

    @staticmethod
    def _protections(proc: _Process) -> dict:
        return {k: v for k, v in proc.report.items()
                if k in ("env", "network", "filesystem", "privileges", "unix_sockets")}

    def _detach(self, slot: Slot, proc: _Process) -> None:
        """``proc`` no longer serves ``slot``: give its room back to the pool."""
        if slot.proc is proc:
            slot.proc = None
            self.pool.release(slot.tenant)
            if proc.tmpdir:
                shutil.rmtree(proc.tmpdir, ignore_errors=True)

    def _retire(self, slot: Slot, proc: _Process, kind: str, why: str) -> None:
        """Stop an idle worker on purpose (eviction, idle timeout, host request)."""
        proc.kill_reason = {"why": why, "counts": False}
        try:
            proc.conn.send(P.SHUTDOWN)
        except OSError:
            pass
        proc.conn.close()
        slot.last_exit = why
        self._detach(slot, proc)
        with self._lock:
            self._retiring.append((proc, time.monotonic() + 2.0))
        self._event(kind, slot, pid=proc.pid, reason=why)

    def _evict_one(self, asking: Slot, tenant: Optional[str]) -> bool:
        """Stop the least recently used idle worker (of ``tenant`` if given)."""
        candidates = sorted((s for s in list(self._slots.values())
                             if s is not asking and s.proc is not None and not s.busy
                             and (tenant is None or s.tenant == tenant)),
                            key=lambda s: s.last_used)
        for victim in candidates:
            if victim.lock.acquire(timeout=0):
                try:
                    proc = victim.proc
                    if proc is not None and not victim.busy:
                        self._retire(victim, proc, "evict", "evicted to make room for another worker")
                        return True
                finally:
                    victim.lock.release()
        return False

    def _kill(self, proc: _Process, reason: Optional[dict] = None) -> None:
        if reason is not None and proc.kill_reason is None:
            proc.kill_reason = reason
        proc.zygote.kill(proc.pid)

    def _bury(self, slot: Slot, proc: _Process, served_a_call: bool) -> str:
        """The worker is gone or going: reap it, record how, free the slot."""
        proc.conn.close()
        status = proc.exit_status
        if status is None and proc.zygote.alive:     # (a dead zygote's workers died with it)
            status = proc.zygote.wait_exit(proc.pid, 5.0)
            if status is None:                       # still there? make sure.
                proc.zygote.kill(proc.pid)
                status = proc.zygote.wait_exit(proc.pid, 5.0)
        how = describe_exit(status)
        slot.last_exit = how if proc.kill_reason is None else proc.kill_reason["why"]
        self._detach(slot, proc)
        if proc.kill_reason is None or proc.kill_reason.get("counts", True):
            self._event("crash", slot, pid=proc.pid, reason=how)
            self._record_death(slot, fresh=not served_a_call)
        return how

    def _record_death(self, slot: Slot, fresh: bool) -> None:
        pol = self.crash_policy
        now = time.monotonic()
        slot.fresh_deaths = slot.fresh_deaths + 1 if fresh else 0
        slot.deaths.append(now)
        while slot.deaths and now - slot.deaths[0] > pol.window_s:
            slot.deaths.popleft()
        if slot.fresh_deaths >= pol.fresh_deaths or len(slot.deaths) > pol.deaths:
            slot.backoff_s = min(pol.backoff_max_s, slot.backoff_s * 2 if slot.backoff_s else pol.backoff_s)
            slot.quarantined_until = now + slot.backoff_s
            log.error("library %s (tenant %s) quarantined for %.0f s after repeated worker deaths",
                      slot.library.name, slot.tenant, slot.backoff_s)
            self._event("quarantine", slot, seconds=slot.backoff_s)

    # ------------------------------------------------------------ calling
    def run(self, tenant: str, library: Library, msg: tuple, *, init: Callable[[], P.Init],
            limits: Limits, objects: HostObjects, tool: str, timeout_s: Optional[float] = None,
            root: str = "") -> Any:
        """Send ``msg`` (a protocol.Call, Prompt, ModCall or Load) to the (tenant,
        library, root) worker and return the value of its RESULT.

        Waiting for the worker (its queue, or room in the pool) counts against the
        call's timeout from the moment the call was made."""
        timeout = limits.timeout_s if timeout_s is None else timeout_s
        queue_deadline = time.monotonic() + timeout if timeout else None
        slot = self.slot(tenant, library, limits, root)
        if not slot.lock.acquire(timeout=timeout if timeout else None):
            raise SandboxEvent(normalize.failure(
                f"[{library.name}] tool '{tool}' not run: its worker stayed busy with earlier calls "
                f"for the whole {timeout:g} s timeout.", normalize.UNAVAILABLE))
        try:
            return self._run_locked(slot, msg, init, objects, tool, timeout, queue_deadline)
        finally:
            slot.busy = False
            slot.caller = None
            slot.last_used = time.monotonic()
            proc = slot.proc
            if proc is not None and self.pool.limited and self.pool.should_yield(tenant):
                self._retire(slot, proc, "evict", "stopped to give its room to a waiting tenant")
            slot.lock.release()

    def _run_locked(self, slot: Slot, msg: tuple, init: Callable[[], P.Init], objects: HostObjects,
                    tool: str, timeout: Optional[float], queue_deadline: Optional[float]) -> Any:
        name = slot.library.name
        if self._closed:
            raise SandboxEvent(normalize.failure(
                f"[{name}] tool '{tool}' not run: the sandbox supervisor is closed.", normalize.UNAVAILABLE))
        now = time.monotonic()
        if slot.quarantined_until > now:
            raise SandboxEvent(normalize.failure(
                f"[{name}] tool '{tool}' not run: the library is quarantined after its workers died "
                f"repeatedly ({slot.last_exit}); it will be retried in {slot.quarantined_until - now:.0f} s.",
                normalize.UNAVAILABLE))
        proc = slot.proc
        # Did it die (or speak out of turn) while idle?  The zygote says so within a
        # moment; a worker that sat idle for over a millisecond is also asked (poll)
        # in case the zygote's word is still on its way.  Back-to-back calls skip that.
        if proc is not None and (proc.exit_status is not None or
                                 (now - slot.last_used > 0.001 and proc.conn.readable_now())):
            self._idle_check(slot, proc)
            proc = None if slot.proc is not proc else proc
        init_msg = None
        if proc is None:
            init_msg = init()
            proc = self._spawn(slot, init_msg, queue_deadline, tool)
        slot.busy = True
        slot.interrupted = False
        slot.caller = threading.get_ident()
        try:
            result = self._exchange(slot, proc, msg, init_msg, objects, tool, timeout)
        except SandboxEvent:
            raise
        except BaseException as exc:
            # Whatever went wrong here, the stream may be out of step: never reuse it.
            self._kill(proc, {"why": f"stopped after an error in the host ({type(exc).__name__})",
                              "counts": False})
            self._bury(slot, proc, served_a_call=True)
            if not isinstance(exc, Exception):
                raise
            log.exception("internal error while %s ran %s", name, tool)
            raise SandboxEvent(normalize.failure(
                f"[{name}] tool '{tool}': the host failed while handling the call "
                f"({type(exc).__name__}: {exc}); the worker was stopped and will be replaced on "
                f"the next call.")) from None
        return self._outcome(slot, proc, msg, result, tool, timeout)

    def _idle_check(self, slot: Slot, proc: _Process) -> None:
        """An idle worker is readable: it is gone, or it sent what nobody asked for."""
        if proc.exit_status is None and proc.conn.sent_while_idle():
            what = "it sent a message while no call was running"
            self._kill(proc, {"why": f"broke the protocol ({what})", "counts": True})
            self._event("violation", slot, pid=proc.known_pid, reason=what)
        self._bury(slot, proc, served_a_call=proc.calls > 0)

    def _exchange(self, slot: Slot, proc: _Process, msg: tuple, init_msg: Optional[P.Init],
                  objects: HostObjects, tool: str, timeout: Optional[float]) -> P.Result:
        """Send the call and serve the worker until its RESULT: READY first (once),
        REQUESTs answered meanwhile; anything else, or a frame over its cap, is a
        protocol violation.  Every read ends by the call's hard deadline."""
        name = slot.library.name
        conn = proc.conn
        try:
            conn.send(_KIND[type(msg)], msg)
        except P.PayloadError as exc:
            raise SandboxEvent(normalize.failure(
                f"[{name}] tool '{tool}' not run: its parameters could not be sent to the worker "
                f"({exc}); the worker was kept.")) from None
        except OSError:
            pass                                  # the worker is gone: the read below tells how

        call_caps = {P.REQUEST: P.REQUEST_CAP,
                     P.RESULT: int(slot.limits.max_result_mb * 1048576) + P.RESULT_OVERHEAD}
        grace = slot.limits.grace_s
        deadline = time.monotonic() + timeout if timeout else None
        soft_sent = False
        objects.conn = conn
        try:
            while True:
                try:
                    kind, payload = conn.recv_frame(deadline, call_caps if proc.ready else _READY_CAPS)
                    reply = P.parse_from_worker(kind, payload, conn.decoder)
                except TimeoutError:
                    if not soft_sent:
                        soft_sent = True
                        proc.zygote.signal(proc.pid, P.SOFT_TIMEOUT_SIGNAL)
                        deadline = time.monotonic() + grace
                        continue
                    self._kill(proc, {"why": f"killed after its {timeout:g} s timeout", "counts": False})
                    self._bury(slot, proc, served_a_call=True)
                    self._event("timeout", slot, pid=proc.pid, tool=tool, stage="hard", seconds=timeout)
                    raise SandboxEvent(normalize.failure(
                        f"[{name}] tool '{tool}' timed out after {timeout:g} s and did not stop when "
                        f"interrupted; its worker was killed and will be replaced on the next call "
                        f"(module state was lost).", normalize.TIMED_OUT)) from None
                except (EOFError, OSError):
                    self._died(slot, proc, tool)
                except P.ProtocolViolation as exc:
                    self._violation(slot, proc, tool, str(exc))
                if kind == P.RESULT:
                    if reply.outcome == P.TIMED_OUT and not soft_sent and not slot.interrupted:
                        self._violation(slot, proc, tool, "it reported a timeout nobody signalled")
                    if conn.pending():
                        self._violation(slot, proc, tool, "it sent more after its RESULT")
                    return reply
                if kind == P.READY:
                    self._ready(slot, proc, init_msg, reply.report)
                    continue
                t0 = time.monotonic()             # a REQUEST
                objects.deadline = None if deadline is None else deadline + (0 if soft_sent else grace)
                answer = objects.handle(reply, conn.decoder.saw_ref)
                if conn.broken:                   # during a callback into the tool
                    self._violation(slot, proc, tool, conn.broken)
                try:
                    conn.send(P.REPLY, answer)
                except P.PayloadError as exc:
                    conn.send(P.REPLY, (False, ["TypeError", [f"the host's answer cannot be sent: {exc}"]]))
                except OSError:
                    pass
                if deadline is not None:          # time waiting for the host does not count
                    deadline += time.monotonic() - t0
        finally:
            objects.release()

    def _outcome(self, slot: Slot, proc: _Process, msg: tuple, result: P.Result, tool: str,
                 timeout: Optional[float]) -> Any:
        name = slot.library.name
        proc.calls += 1
        slot.calls += 1
        slot.fresh_deaths = 0
        slot.backoff_s = 0.0
        outcome, value = result.outcome, result.value
        if outcome == P.OK:
            why = _invalid_value(msg, value)
            if why:
                self._violation(slot, proc, tool, why)
            return value
        if outcome == P.TIMED_OUT and slot.interrupted:
            self._event("interrupt", slot, pid=proc.pid, tool=tool)
            raise SandboxEvent(normalize.failure(
                f"[{name}] tool '{tool}' was cancelled by the host; it was interrupted and its "
                f"worker (with its module state) was kept.", normalize.CANCELLED))
        if outcome == P.TIMED_OUT:
            self._event("timeout", slot, pid=proc.pid, tool=tool, stage="soft", seconds=timeout)
            raise SandboxEvent(normalize.failure(
                f"[{name}] tool '{tool}' timed out after {timeout:g} s; it was interrupted and its "
                f"worker (with its module state) was kept.", normalize.TIMED_OUT))
        if outcome == P.OUT_OF_MEMORY:
            limit = slot.limits.memory_mb
            detail = result.detail[:500]
            raise SandboxEvent(normalize.failure(
                f"[{name}] tool '{tool}' ran out of memory: an allocation failed"
                + (f" ({detail})" if detail else "")
                + (f" against the {limit:g} MB limit" if limit else "")
                + "; the tool did not catch the MemoryError and the worker was kept.", normalize.OUT_OF_MEMORY))
        if outcome == P.LOAD_FAILED:              # the worker exits: start fresh next time
            proc.kill_reason = {"why": "library failed to load", "counts": False}
            self._bury(slot, proc, served_a_call=True)
            if type(msg) is P.Call:
                if _invalid_value(msg, value):
                    self._violation(slot, proc, tool, "malformed load failure")
                return value
            if type(msg) is P.Load:
                return value
            raise rebuild_error(*value) if _is_error(value) else RuntimeError(f"library {name} failed to load")
        # RAISED: a module function called by the host raised
        if type(msg) is not P.ModCall:
            self._violation(slot, proc, tool, "an exception result for a call that cannot raise")
        raise rebuild_error(*value)

    def _violation(self, slot: Slot, proc: _Process, tool: str, what: str) -> None:
        """The worker broke the protocol: kill its tree, never believe it."""
        self._kill(proc, {"why": f"broke the protocol ({what})", "counts": True})
        self._bury(slot, proc, served_a_call=proc.calls > 0)
        self._event("violation", slot, pid=proc.known_pid, tool=tool, reason=what)
        raise SandboxEvent(normalize.failure(
            f"[{slot.library.name}] protocol violation by the worker running tool '{tool}': {what}. "
            f"Its process tree was killed and a fresh worker will be started on the next call "
            f"(module state was lost).", normalize.TOOL_FAILED))

    def _died(self, slot: Slot, proc: _Process, tool: str) -> None:
        how = self._bury(slot, proc, served_a_call=proc.calls > 0)
        name = slot.library.name
        reason = proc.kill_reason
        if self._closed:
            raise SandboxEvent(normalize.failure(
                f"[{name}] tool '{tool}' was stopped: the sandbox supervisor was closed while it ran.",
                normalize.UNAVAILABLE))
        if reason and reason.get("code") == normalize.OUT_OF_MEMORY:
            self._event("memory", slot, pid=proc.pid, tool=tool, reason=reason["why"])
            raise SandboxEvent(normalize.failure(
                f"[{name}] tool '{tool}': {reason['why']}; the worker's process tree was killed and "
                f"will be replaced on the next call (module state was lost).", normalize.OUT_OF_MEMORY))
        raise SandboxEvent(normalize.failure(
            f"[{name}] the worker running tool '{tool}' {how}. The host is unaffected; a fresh worker "
            f"will be started on the next call (module state was lost).", normalize.TOOL_FAILED))

    # ------------------------------------------------------------ watchdog
    def _watch(self) -> None:
        tick = 0
        while not self._closed:
            self._wake.wait(self._watch_interval)
            tick += 1
            now = time.monotonic()
            if self._retiring:
                self._reap_retiring(now)
            for slot in list(self._slots.values()):
                proc = slot.proc
                if proc is None or proc.exit_status is not None:
                    continue
                if (self.idle_timeout_s is not None and not slot.busy
                        and now - slot.last_used > self.idle_timeout_s and slot.lock.acquire(timeout=0)):
                    try:
                        if slot.proc is proc and not slot.busy:
                            self._retire(slot, proc, "idle", f"stopped after {self.idle_timeout_s:g} s idle")
                            continue
                    finally:
                        slot.lock.release()
                limit = slot.limits.memory_mb
                # Busy workers with a limit are measured every tick; the rest once a
                # second (a /proc walk per worker is not free, and it holds the GIL).
                if not ((slot.busy and limit) or tick % 20 == 0):
                    continue
                pid = proc.known_pid
                if pid is None:
                    continue
                rss = tree_rss(pid)
                if rss > slot.peak_rss:
                    slot.peak_rss = rss
                if limit and rss > limit * 1048576:
                    self._kill(proc, {"why": f"went over its memory limit of {limit:g} MB (observed "
                                             f"{rss / 1048576:.0f} MB in its process tree)",
                                      "code": normalize.OUT_OF_MEMORY, "counts": False})

    def _reap_retiring(self, now: float) -> None:
        # Workers asked to shut down get a grace period for their atexit work, then a kill.
        with self._lock:
            due = [proc for proc, at in self._retiring if at <= now]
            self._retiring = [(proc, at) for proc, at in self._retiring if at > now]
        for proc in due:
            proc.zygote.kill(proc.pid)

    # ------------------------------------------------------------ lifecycle
    def stop(self, tenant: str, library_key: str) -> bool:
        """Stop the worker(s) of one library of one tenant and forget the slot(s)."""
        keys = [k for k in list(self._slots) if k[0] == tenant and k[1] == library_key]
        for key in keys:
            slot = self._slots.pop(key, None)
            if slot is None:
                continue
            with slot.lock:
                proc = slot.proc
                if proc is not None:
                    self._retire(slot, proc, "stop", "stopped by the host")
                    if proc.zygote.wait_exit(proc.pid, 2.0) is None:
                        self._kill(proc)
                        proc.zygote.wait_exit(proc.pid, 2.0)
        return bool(keys)

    def interrupt(self, tenant: str, thread_id: int) -> bool:
        """Interrupt the call of ``tenant`` that the host thread ``thread_id`` is waiting
        for, as its soft timeout would: ``ToolTimeout`` is raised in the tool (once it
        is back from the host, if it was waiting for it), the worker and its module
        state are kept, and the call fails with 499.  A call still queued for its
        worker, or whose worker is not ready yet, is not touched; a tool that does not
        stop runs on under its own timeout.  Returns whether a call was signalled."""
        for slot in list(self._slots.values()):
            proc = slot.proc
            if (slot.tenant == tenant and slot.caller == thread_id and slot.busy and proc is not None
                    and proc.ready and proc.exit_status is None):
                slot.interrupted = True
                proc.zygote.signal(proc.pid, P.SOFT_TIMEOUT_SIGNAL)
                return True
        return False

    def stats(self, tenant: Optional[str] = None) -> list[dict]:
        """One dict per worker slot (only ``tenant``'s when given): ``library``,
        ``tenant``, ``pid`` (None when no worker runs), ``state`` (idle, busy,
        stopped or quarantined), ``calls``, ``restarts``, ``last_exit`` (how the
        last worker ended), ``rss`` and ``peak_rss`` (bytes, the worker's whole
        process tree), ``protections`` (the confinement in force) and
        ``workspace_root``."""
        out = []
        for slot in list(self._slots.values()):
            if tenant is not None and slot.tenant != tenant:
                continue
            proc = slot.proc
            alive = proc is not None and proc.exit_status is None and proc.known_pid is not None
            rss = tree_rss(proc.pid) if alive else 0
            out.append({
                "library": slot.library.name, "tenant": slot.tenant,
                "pid": proc.pid if alive else None,
                "state": ("quarantined" if slot.quarantined_until > time.monotonic() else
                          "busy" if slot.busy else "idle" if alive else "stopped"),
                "calls": slot.calls, "restarts": slot.restarts, "last_exit": slot.last_exit,
                "rss": rss, "peak_rss": max(slot.peak_rss, rss),
                "protections": self._protections(proc) if alive else {},
                "workspace_root": slot.root or None,
            })
        return out

    def pool_stats(self) -> dict:
        """The pool as a whole and per tenant: live workers, calls waiting for room."""
        waiting = self.pool.waiting()
        tenants = {s.tenant for s in self._slots.values()} | set(self.pool.live) | set(waiting)
        return {"max_workers": self.pool.max_workers, "max_workers_per_tenant": self.pool.max_per_tenant,
                "live_workers": self.pool.total, "waiting": sum(waiting.values()),
                "tenants": {t: {"live_workers": self.pool.live.get(t, 0), "waiting": waiting.get(t, 0),
                                "calls": sum(s.calls for s in self._slots.values() if s.tenant == t)}
                            for t in sorted(tenants)}}

    def close(self) -> None:
        """Stop every worker and the zygote; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        for slot in list(self._slots.values()):
            proc = slot.proc
            if proc is not None and not slot.busy:
                try:
                    proc.conn.send(P.SHUTDOWN)
                except OSError:
                    pass
        if self._zygote is not None:
            deadline = time.monotonic() + 1.0
            for slot in list(self._slots.values()):
                proc = slot.proc
                if proc is not None and not slot.busy and proc.known_pid is not None:
                    proc.zygote.wait_exit(proc.pid, max(0.0, deadline - time.monotonic()))
            self._zygote.close()
        for slot in list(self._slots.values()):
            if slot.proc is not None:
                slot.proc.conn.close()
                self._detach(slot, slot.proc)
        if self._pump is not None:
            self._pump.close()
        _live_supervisors.discard(self)

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
