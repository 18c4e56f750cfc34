"""The local backend: the supervisor of this machine's worker processes, in one class.

A call, top to bottom as this module reads:

    SandboxedBinding.execute_tool ─► Supervisor.run(spec, msg, objects)
        slot = _slots[spec.key], else _slot()   one per (tenant, library, root), a FIFO lock each
        with slot.lock:
            a live worker called within the last ms (the warm case): straight on; else
            _worker_for():  closed, quarantined ─► Unavailable (503)
                            its idle worker died or spoke out of turn ─► _ended_while_idle():
                                buried (a word out of turn: a violation), a fresh one started
                            no live worker ─► _environment() (the library's own, if declared),
                                              _spawn(): _room() in the pool, the root handed
                                              over, _launch() ─► _zyg() forks or spawns it
            WorkerProcess.exchange(msg) ─► RESULT OK ─► the value, checked by invalid_answer
        after the call: a waiting tenant may take this worker's room (_retire "evict");
        a worker forked ahead that served is replaced (settle)

A failed call, in the same order:

        WorkerProcess.exchange() raised ─► _resend_or_fail():
            NeverReceived (it hung up since its last call) ─► _ended_while_idle(), the call
                          sent once more to a fresh worker from _worker_for()
            else ─► _failed():  WorkerGone ─► _bury(), WorkerDied (500), or OutOfMemory
                                             (507) when the watchdog killed it
                                BadMessage ─► _violation(): killed, buried,
                                             ProtocolViolated (500)
                                DeadlinePassed ─► buried (killed), TimedOut (504)
                                NotConfined (raised by _ready()) ─► killed before the call
                                             was sent, Unavailable (503)
                                PayloadError ─► nothing was sent, the worker kept, 500
                                anything else ─► killed, buried, CallFailed (500)
        RESULT other than OK ─► _outcome():  TIMED_OUT ─► Cancelled (499) or TimedOut (504),
                                                         the worker kept
                                             OUT_OF_MEMORY ─► OutOfMemory (507), kept
                                             LOAD_FAILED ─► buried; the value, or raised
                                             RAISED ─► the module function's exception
        RESULT OK, its value malformed (invalid_answer) ─► _violation(): ProtocolViolated (500)
        every outcome is a SandboxEvent: run()'s outer except counts it and raises it on;
        SandboxedBinding.execute_tool returns its .result

    a worker's end:  _retire() (idle, evicted, stopped: asked to exit), _bury() (dead or
                     killed: reaped, counted towards quarantine); both _detach() it from its
                     slot (its room in the pool, its template, its cgroup, its temp dir);
                     _on_exit() is the zygote's or spawner's word that a pid ended

How workers start (start(), _zyg(), _launch()):

    start_method "zygote" (Linux; zygote_client.py)   a pre-started process forks each worker;
                   the host keeps one forked ahead; library templates (templates.py);
                   one output pump thread (epoll) for every worker's log pipe
    start_method "spawn" (everywhere; spawn.py)   a fresh interpreter per worker, spares
                   spawned ahead; no templates (fork-only); a thread per worker's output

A library that declares its dependencies (core/requirements.py) starts its workers with
its own environment: found in the store or built (backends/envs/) before the worker
starts, waited for outside the call's timeout (``env_wait_s``), named in INIT and
readable by a confined worker (its folder joins the read paths).

What a tenant takes, it gives back (stop(), remove_tenant()): its workers stop; with its
root, its disk is unmounted and its image deleted (confine/disks.py), its root deleted (a folder
of its own: never tenants_root, a folder above it or a system folder), and its uid
returns to the range (confine/tenant_uids.py).  The MCP server calls remove_tenant when a session
ends; a host that removes a tenant closes its bindings first.

What it tells a host (stats(), pool_stats(), metrics()): per worker slot, the pool and the
templates, and the counters kept as events happen (backends/metrics.py) beside gauges read
from its own records, so a scrape reads no /proc file.

Calls to one worker are served one at a time in arrival order; calls to different
slots never wait for each other: no global lock is held while a call runs.  The other
modules of backends/local/ are the supervisor's collaborators; its __init__.py says what
each holds.
"""
from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any, Callable, NoReturn, Optional, Union

from ... import protocol as P
from ...core.keywords import checked_keywords
from ...core.limits import Limits, confine_setting
from ...core.normalize import OUT_OF_MEMORY
from ...core.outcomes import (
    CallFailed,
    Cancelled,
    OutOfMemory,
    ProtocolViolated,
    SandboxEvent,
    TimedOut,
    Unavailable,
    WorkerDied,
)
from ...core.policy import (
    BEST_EFFORT,
    DEFAULT_TENANT_PROCESSES,
    DEFAULT_UID_RANGE,
    default_run_as,
    may_hand_over,
    not_in_force,
    path_within,
    refusal_text,
    run_as_setting,
)
from ...protocol import OK, Call, Outcome, invalid_answer, is_error, rebuild_error
from ..base import Closing, Lent, WorkerSpec, emit
from ..envs import Environments
from ..metrics import Metrics
from .confine import cgroups
from .confine.confined import compiled_by_host
from .confine.extras import WorkerExtras
from .confine.handover import hand_over_root
from .confine.temp_dirs import Leaving, private_tmpdir, remove_tmpdir
from .confine.tenant_uids import TenantUids
from .descriptors import out_of_descriptors, raise_open_files_limit
from .output import OutputPump
from .platforms import start_method as start_method_of
from .pool import Pool
from .process import DeadlinePassed, KillReason, NeverReceived, WorkerGone, WorkerProcess
from .slot import CrashPolicy, Slot, evict_one
from .spawn import Spawner
from .templates import Templates
from .watchdog import Watchdog
from .zygote_client import ZygoteClient, ZygoteGone

log = logging.getLogger("lcp_sandbox")

_live_supervisors: "weakref.WeakSet[Supervisor]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for sup in list(_live_supervisors):
        sup.close()


class NotConfined(Exception):
    """Raised by Supervisor._ready: a protection the worker was asked for is not in force.
    The call is not sent and the worker is stopped; the text says what is missing."""


class Supervisor(Closing):
    """Owns the zygote, the worker slots and the threads that watch them (a Backend).

    A new supervisor has no worker yet: the first call, or start(), starts them.

    Every keyword is checked before anything starts: a wrong value raises TypeError or
    ValueError naming it (core/keywords.py).

    Args:
        max_workers: worker processes at most (None: no cap); a call that needs one
            more evicts an idle worker or waits in the pool's fair queue (pool.py).
        max_workers_per_tenant: worker processes of one tenant at most (None: no cap).
        idle_timeout_s: a worker idle this long is stopped, and so is a template none
            of whose workers lived that long; None: never.
        confine: the confinement of bindings that do not say: True, False or
            "best-effort" (worker/confine/).
        on_event: called with a dict per lifecycle event (start, stop, evict, idle,
            crash, violation, timeout, interrupt, memory, quarantine, refused); each
            is also logged on lcp_sandbox.events.
        crash_policy: when a crashing library is quarantined; None: CrashPolicy().
        watch_interval_s: how often the watchdog samples the memory of a call that
            has a memory limit (watchdog.py).
        run_as: the (uid, gid) of a root host's confined workers, or "per-tenant": a
            uid of its own per tenant, from uid_range, kept in tenants_root
            (confine/tenant_uids.py).  None: "per-tenant" for a root host with a
            tenants_root, else nobody.
        tenants_root: the folder of every tenant's root; the confined workers of roots
            beneath it start from shared templates (templates.py, confine/confined.py).
        start_method: "zygote" or "spawn" (platforms.py); None: the environment's
            LCP_SANDBOX_START_METHOD, else "zygote" on Linux and "spawn" elsewhere.
        uid_range: (first uid, count) the "per-tenant" uids come from.
        max_processes_per_tenant: RLIMIT_NPROC of a per-tenant uid: the processes and
            threads of all of one tenant's workers together; None: no cap.
        network: the network of bindings that do not say: True, False, or a policy
            (core/egress_rules.py).
        envs_dir: the store of the libraries' own environments (backends/envs/); None:
            LCP_SANDBOX_ENVS_DIR, else the user's cache folder.
        env_wait_s: how long a call waits for its library's environment to be built;
            the wait does not count against the call's timeout.
        secrets: {name: value} the egress proxy puts in the requests of workers whose
            policy binds the name to the request's host; the workers hold placeholders
            (core/secrets.py, confine/egress_secrets.py).
        upstream_ca_file: the CAs the proxy checks the servers of bound hosts against
            (None: the system's trust store).
    """

    def __init__(self, max_workers: Optional[int] = None,
                 max_workers_per_tenant: Optional[int] = None,
                 idle_timeout_s: Optional[float] = None, confine: Union[bool, str] = False,
                 on_event: Optional[Callable[[dict], None]] = None,
                 crash_policy: Optional[CrashPolicy] = None, watch_interval_s: float = 0.05,
                 run_as: Union[tuple[int, int], str, None] = None,
                 tenants_root: Optional[str] = None, start_method: Optional[str] = None,
                 uid_range: tuple[int, int] = DEFAULT_UID_RANGE,
                 max_processes_per_tenant: Optional[int] = DEFAULT_TENANT_PROCESSES,
                 network: Union[bool, dict[str, Any]] = True, envs_dir: Optional[str] = None,
                 env_wait_s: float = 600.0, secrets: Optional[dict[str, str]] = None,
                 upstream_ca_file: Optional[str] = None) -> None:
        """Check every setting (the class's Args say what each is); start nothing."""
        checked = checked_keywords("Supervisor", locals())
        self.start_method = start_method_of(start_method)
        self.crash_policy = crash_policy or CrashPolicy()
        self.confine = confine_setting(confine)
        # Checked by Limits, as a library's own "network" setting is.
        self.network = Limits(confine=True, network=network).network
        self.run_as = run_as_setting(default_run_as(tenants_root) if run_as is None else run_as)
        # TenantUids checks uid_range and max_processes_per_tenant.
        self.uids = TenantUids(uid_range, tenants_root, max_processes_per_tenant)
        self.idle_timeout_s = idle_timeout_s
        self.on_event = on_event
        self.pool = Pool(max_workers, max_workers_per_tenant)
        self._slots: dict[tuple[str, str, str], Slot] = {}
        self._by_pid: dict[int, Slot] = {}
        self._lock = threading.Lock()
        # The parent of workers, a ZygoteClient or a Spawner: started by _zyg().
        self._zygote: Optional[Union[ZygoteClient, Spawner]] = None
        self._pump: Optional[OutputPump] = None
        self._closed = False
        # The temp dirs of workers detached while they still ran: removed at their end
        self._leaving = Leaving()
        self.templates = Templates(idle_timeout_s, tenants_root)
        self.open_files = raise_open_files_limit()
        self._watchdog = Watchdog(self._retire, idle_timeout_s, watch_interval_s,
                                  self._templates_due)
        self.templates.on_idle = self._watchdog.tick_at
        self._warned: set[str] = set()
        # Set by tests only, through lcp_sandbox.testing.
        self.protections_off: frozenset[str] = frozenset()
        # The counters of metrics(), kept as events happen.
        self.counters = Metrics()
        # What a confined worker may get beyond its root: pids cgroups, disks, egress proxy.
        self.extras = WorkerExtras(self.counters)
        self.egress = self.extras.egress
        self.egress.secrets.hold(checked.get("secrets") or {}, upstream_ca_file)
        self.environments = Environments(envs_dir, env_wait_s)
        _live_supervisors.add(self)

    def _event(self, kind: str, slot: Slot, **details: Any) -> None:
        """A lifecycle event of ``slot``: logged, and given to ``on_event``."""
        emit(self.on_event, {"event": kind, "tenant": slot.tenant, "library": slot.library.name,
                             **details})

    # ------------------------------------------------------------ a call
    def run(self, spec: WorkerSpec, msg: tuple, objects: Lent, *, tool: str,  # noqa: C901
            timeout_s: Optional[float] = None) -> Any:
        """Send ``msg`` (a protocol.Call, Prompt, ModCall or Load) to the worker of
        ``spec`` and return the value of its RESULT; SandboxEvent when the sandbox
        ended the call.  A Call is counted in ``metrics()`` (its status, its duration).

        Waiting for the worker (its queue, or room in the pool) counts against the
        call's timeout from the moment the call was made.  The warm path is one frame
        on purpose: a helper call would cost more than its body."""
        start = time.monotonic()
        timeout = spec.limits.timeout_s if timeout_s is None else timeout_s
        slot = self._slots.get(spec.key) or self._slot(spec)
        # A binding keeps its specs: new limits for a slot are seldom.
        if slot.limits is not spec.limits:
            slot.configure(spec.limits, spec.secrets)
        try:
            if not slot.lock.acquire(timeout=timeout if timeout else None):
                raise Unavailable.not_run(spec.library.name, tool, f"its worker stayed busy "
                                          f"with earlier calls for the whole {timeout:g} s "
                                          f"timeout.", "busy")
            try:
                proc = slot.proc
                now = time.monotonic()
                # The common case, back to back calls to a live worker, skips every check.
                if (proc is None or proc.exit_status is not None or now - slot.last_used > 0.001
                        or slot.quarantined_until > now or self._closed):
                    proc = self._worker_for(slot, spec, tool, start + timeout if timeout
                                            else None, now)
                slot.begin_call()
                # The watchdog samples the memory of a limited worker while its call runs.
                if slot.limits.memory_mb:
                    self._watchdog.call_started(slot)
                try:
                    result = proc.exchange(msg, objects, slot.limits, timeout, slot.spin)
                except BaseException as exc:
                    # Raises the call's outcome, or sends the call anew to a fresh worker.
                    proc, result = self._resend_or_fail(slot, spec, proc, msg, objects, tool,
                                                        timeout, start, exc)
                proc.calls += 1
                slot.served()
                value, outcome, _ = result
                if outcome != OK:
                    value = self._outcome(slot, proc, msg, result, tool, timeout)
                elif why := invalid_answer(msg, value):
                    self._violation(slot, proc, tool, why)
            finally:
                slot.end_call(time.monotonic())
                if (slot.proc is not None and self.pool.limited
                        and self.pool.should_yield(spec.tenant)):
                    self._retire(slot, slot.proc, "evict",
                                 "stopped to give its room to a waiting tenant")
                # Called holding the slot's lock, as Watchdog._idle requires.
                self._watchdog.call_ended(slot)
                slot.lock.release()
                zyg = self._zygote
                # A worker forked ahead served this call: fork its replacement.
                if zyg is not None and zyg.owed:
                    zyg.settle()
        except SandboxEvent as ev:
            if isinstance(ev, Unavailable) and ev.reason:
                self.counters.refused(ev.reason)
            if type(msg) is Call:
                self.counters.call(spec.library.name, tool, ev.result.get("status_code", 500),
                                   time.monotonic() - start)
            raise
        if type(msg) is Call:
            self.counters.call(spec.library.name, tool, value.get("status_code", 200),
                               time.monotonic() - start)
        return value

    def _slot(self, spec: WorkerSpec) -> Slot:
        """The slot of ``spec``'s key, made on its first call."""
        with self._lock:
            return self._slots.setdefault(spec.key, Slot(spec.tenant, spec.library, spec.limits,
                                                         spec.root, secrets=spec.secrets))

    def _worker_for(self, slot: Slot, spec: WorkerSpec, tool: str,
                    queue_deadline: Optional[float], now: float) -> WorkerProcess:
        """The slot's worker, alive and idle, started if need be (503: closed, quarantined)."""
        if self._closed:
            raise Unavailable.not_run(slot.library.name, tool, "the sandbox supervisor is closed.",
                                      "closed")
        slot.refuse_if_quarantined(tool, now)
        proc = slot.proc
        # Did it die, or speak out of turn, while idle?  The zygote says so within a moment;
        # a worker idle for over a millisecond is also asked (poll): that word may be on its way.
        if proc is not None and (proc.exit_status is not None or
                                 (now - slot.last_used > 0.001 and proc.conn.readable_now())):
            self._ended_while_idle(slot, proc)
            proc = None if slot.proc is not proc else proc
        if proc is None:
            assert spec.init is not None, "a spec run here says how its worker starts"
            init = spec.init()
            if init.environment is not None or slot.environment is not None:
                init, queue_deadline = self._environment(slot, init, tool, queue_deadline)
            proc = self._spawn(slot, init, queue_deadline, tool)
        return proc

    # ------------------------------------------------------------ the ends of a call
    def _resend_or_fail(self, slot: Slot, spec: WorkerSpec, proc: WorkerProcess, msg: tuple,
                        objects: Lent, tool: str, timeout: Optional[float], start: float,
                        exc: BaseException) -> tuple[WorkerProcess, P.Result]:
        """The exchange raised ``exc``.  A call its worker never received (it hung up since
        its last call, too recently for run()'s fast path to have asked) goes once to a
        fresh worker, as it would have had the end been seen first; else _failed."""
        if not isinstance(exc, NeverReceived):
            self._failed(slot, proc, tool, timeout, exc)
        self._ended_while_idle(slot, proc)
        proc = self._worker_for(slot, spec, tool, start + timeout if timeout else None,
                                time.monotonic())
        try:
            return proc, proc.exchange(msg, objects, slot.limits, timeout, slot.spin)
        except BaseException as again:
            self._failed(slot, proc, tool, timeout, again)

    def _failed(self, slot: Slot, proc: WorkerProcess, tool: str, timeout: Optional[float],
                exc: BaseException) -> NoReturn:
        """The exchange raised ``exc``: the worker's fate; raises the call's SandboxEvent,
        or ``exc`` itself when it is no Exception (KeyboardInterrupt, SystemExit)."""
        name = slot.library.name
        if isinstance(exc, WorkerGone):
            how = self._bury(slot, proc, served_a_call=proc.calls > 0)
            reason = proc.kill_reason
            if self._closed:
                raise Unavailable(f"[{name}] tool '{tool}' was stopped: the sandbox supervisor "
                                  "was closed while it ran.")
            if reason is not None and reason.code == OUT_OF_MEMORY:
                self._event("memory", slot, pid=proc.known_pid, tool=tool, reason=reason.why)
                raise OutOfMemory.killed(name, tool, reason.why)
            raise WorkerDied(name, tool, how)
        if isinstance(exc, P.BadMessage):
            self._violation(slot, proc, tool, str(exc))
        if isinstance(exc, DeadlinePassed):
            how = self._bury(slot, proc, served_a_call=True)
            self._event("timeout", slot, pid=proc.known_pid, tool=tool, stage="hard",
                        seconds=timeout)
            if proc.kill_reason is not None and proc.kill_reason.cause == "kill refused":
                raise WorkerDied(name, tool, f"ran past its {timeout or 0.0:g} s timeout and "
                                 f"{how}") from None
            raise TimedOut(name, tool, timeout or 0.0, killed=True) from None
        if isinstance(exc, NotConfined):
            proc.kill(KillReason("stopped: its confinement is not all in force", counts=False,
                                 cause="not confined"))
            self._bury(slot, proc, served_a_call=True)
            self._event("refused", slot, pid=proc.known_pid, tool=tool, reason=str(exc))
            raise Unavailable.not_run(name, tool, str(exc), "not_confined") from None
        if isinstance(exc, P.PayloadError):
            raise CallFailed.not_run(name, tool, f"its parameters could not be sent to the worker "
                                     f"({exc}); the worker was kept.") from None
        # Whatever went wrong here, the stream may be out of step: never reuse it.
        proc.kill(KillReason(f"stopped after an error in the host ({type(exc).__name__})",
                             counts=False, cause="host error"))
        self._bury(slot, proc, served_a_call=True)
        if not isinstance(exc, Exception):
            raise exc
        log.exception("internal error while %s ran %s", name, tool)
        raise CallFailed(f"[{name}] tool '{tool}': the host failed while handling the call "
                         f"({type(exc).__name__}: {exc}); the worker was stopped and will be "
                         f"replaced on the next call.") from None

    def _outcome(self, slot: Slot, proc: WorkerProcess, msg: tuple[Any, ...], result: P.Result,
                 tool: str, timeout: Optional[float]) -> Any:
        """A RESULT other than OK: what the call's caller gets."""
        name = slot.library.name
        value, wire, detail = result
        # The codec let only an Outcome's number through.
        outcome = Outcome(wire)
        if outcome is Outcome.TIMED_OUT:
            if slot.interrupted:
                self._event("interrupt", slot, pid=proc.known_pid, tool=tool)
                raise Cancelled(name, tool)
            self._event("timeout", slot, pid=proc.known_pid, tool=tool, stage="soft",
                        seconds=timeout)
            raise TimedOut(name, tool, timeout or 0.0, killed=False)
        if outcome is Outcome.OUT_OF_MEMORY:
            raise OutOfMemory.uncaught(name, tool, detail[:500], slot.limits.memory_mb)
        if outcome is Outcome.LOAD_FAILED:
            # The worker exits after a failed load: the next call starts a fresh one.
            proc.exiting("library failed to load")
            self._bury(slot, proc, served_a_call=True)
            if type(msg) is P.Call:
                if invalid_answer(msg, value):
                    self._violation(slot, proc, tool, "malformed load failure")
                return value
            if type(msg) is P.Load:
                return value
            if is_error(value):
                raise rebuild_error(*value)
            raise RuntimeError(f"library {name} failed to load")
        # Outcome.RAISED: a module function called by the host raised.
        if type(msg) is not P.ModCall:
            self._violation(slot, proc, tool, "an exception result for a call that cannot raise")
        raise rebuild_error(*value)

    def _violation(self, slot: Slot, proc: WorkerProcess, tool: Optional[str], what: str) -> None:
        """The worker broke the protocol: kill its tree and never believe it; during a call,
        end the call with ProtocolViolated."""
        proc.kill(KillReason(f"broke the protocol ({what})", counts=True, cause="violation"))
        self._bury(slot, proc, served_a_call=proc.calls > 0)
        self._event("violation", slot, pid=proc.known_pid, tool=tool, reason=what)
        if tool is not None:
            raise ProtocolViolated(slot.library.name, tool, what)

    # ------------------------------------------------------------ the worker's fate
    def _ended_while_idle(self, slot: Slot, proc: WorkerProcess) -> None:
        """``proc`` hung up or spoke while it had no call: a word is a violation, an end
        a death; either way it is buried."""
        if proc.exit_status is None and proc.conn.sent_while_idle():
            self._violation(slot, proc, None, "it sent a message while no call was running")
        else:
            self._bury(slot, proc, served_a_call=proc.calls > 0)

    def _bury(self, slot: Slot, proc: WorkerProcess, served_a_call: bool) -> str:
        """The worker is gone or going: reap it, record how, free the slot."""
        how = proc.reap()
        reason = proc.kill_reason
        slot.ended(how if reason is None else reason.why)
        self.counters.ended("crash" if reason is None else reason.cause)
        # reaped: gone, unless its kill was refused or its zygote died
        self._detach(slot, proc, ended=proc.zygote.alive and (
            reason is None or reason.cause != "kill refused"))
        if reason is None or reason.counts:
            self._event("crash", slot, pid=proc.known_pid, reason=how)
            backoff = slot.record_death(self.crash_policy, fresh=not served_a_call)
            if backoff is not None:
                log.error("library %s (tenant %s) quarantined for %.0f s after repeated worker "
                          "deaths", slot.library.name, slot.tenant, backoff)
                self._event("quarantine", slot, seconds=backoff)
        return how

    def _retire(self, slot: Slot, proc: WorkerProcess, kind: str, why: str) -> None:
        """Stop an idle worker on purpose (eviction, idle timeout, host request)."""
        proc.shut_down(why)
        slot.ended(why)
        self._detach(slot, proc)
        self._watchdog.retiring(proc)
        self.counters.ended(kind)
        self._event(kind, slot, pid=proc.known_pid, reason=why)

    def _detach(self, slot: Slot, proc: WorkerProcess, ended: bool = False) -> None:
        """``proc`` no longer serves ``slot``: give its room back to the pool (``ended``:
        it is gone, its temp dir goes now; else once it is)."""
        if slot.detach(proc):
            # A worker still ending keeps its cgroup; a later start or close removes it.
            cgroups.remove(slot.cgroup)
            self.pool.release(slot.tenant)
            self.templates.released(slot.template)
            if proc.tmpdir:
                self._leaving.when_gone(proc, f"worker {proc.known_pid} of {slot.library.name}",
                                        ended)

    def _on_exit(self, pid: int, status: int) -> None:
        """The zygote or the spawner says process ``pid`` ended: a worker, or a template."""
        self._leaving.gone(pid)
        slot = self._by_pid.pop(pid, None)
        if slot is not None and slot.proc is not None and slot.proc.pid == pid:
            slot.proc.exited(status)
        elif slot is None:
            self.templates.exited(pid)

    # ------------------------------------------------------------ starting workers
    def start(self) -> None:
        """Start the zygote (or the spawner's first spare) now, else the first call does."""
        self._zyg()

    def _zyg(self) -> tuple[Union[ZygoteClient, Spawner], Optional[OutputPump]]:
        """The zygote (or the spawner), started if need be, and the pump of its workers'
        output; a spawned worker's output has a thread of its own."""
        with self._lock:
            if self._closed:
                raise Unavailable("The sandbox supervisor is closed.")
            if self._zygote is None or not self._zygote.alive:
                try:
                    self._zygote = (Spawner(self._on_exit) if self.start_method == "spawn"
                                    else ZygoteClient(on_exit=self._on_exit))
                except ZygoteGone as exc:
                    raise Unavailable(f"The sandbox could not start: {exc}") from None
            if isinstance(self._zygote, ZygoteClient):
                self._pump = self._pump or OutputPump()
            self._watchdog.start()
            return self._zygote, self._pump

    def _templates_due(self, now: float) -> Optional[float]:
        """The watchdog's tick: idle templates retired; when the next may be."""
        zyg = self._zygote
        return self.templates.tick(now, zyg if isinstance(zyg, ZygoteClient) else None)

    def _environment(self, slot: Slot, init: P.Init, tool: str,
                     deadline: Optional[float]) -> tuple[P.Init, Optional[float]]:
        """INIT with the library's environment built and named, and the call's queue
        deadline moved by the wait: it does not count against the call's timeout.  A
        library that no longer declares anything gets INIT as it is; its slot says so."""
        if init.environment is None:
            slot.uses_environment(None)
            return init, deadline
        declared = init.environment
        start = time.monotonic()
        requirements = tuple(declared["requirements"])
        built = self.environments.ensure(requirements, declared["where"], slot.library.name,
                                         tool)
        env = {**built.for_worker(requirements), "where": declared["where"],
               "use": "layered over the engine's interpreter (site-packages first)"}
        slot.uses_environment({k: env[k] for k in ("key", "prefix", "where", "versions", "use")})
        confine = init.confine
        # A confined worker may read its own environment, nothing else of the store.
        if confine is not None:
            confine = {**confine, "read_paths": [*confine.get("read_paths", ()), built.prefix]}
        moved = None if deadline is None else deadline + (time.monotonic() - start)
        return init._replace(environment=env, confine=confine), moved

    def _room(self, slot: Slot, deadline: Optional[float], tool: str) -> None:
        """Room in the pool for one more worker of ``slot``'s tenant (503 at ``deadline``)."""
        pool = self.pool
        if not pool.limited:
            return pool.reserve(slot.tenant, None, lambda tenant: False)
        try:
            pool.reserve(slot.tenant, deadline, lambda tenant: evict_one(
                list(self._slots.values()), slot, tenant, self._retire))
        except TimeoutError:
            raise Unavailable.not_run(slot.library.name, tool, f"no worker became free in time "
                                      f"(pool of {pool.max_workers} workers, "
                                      f"{pool.max_per_tenant} per tenant, all busy).",
                                      "pool_full") from None

    def _spawn(self, slot: Slot, init: P.Init, deadline: Optional[float],
               tool: str) -> WorkerProcess:
        """``slot``'s worker started with ``init``: room taken in the pool, a confined
        worker's uid, disk, root and extras handed over first (503 when it cannot start)."""
        name = slot.library.name
        self._room(slot, deadline, tool)
        try:
            try:
                if self.protections_off:
                    init = init._replace(disabled=sorted(self.protections_off))
                # A confined worker's temp dir is made later, by _launch or templates.start.
                if init.confine is not None:
                    run_as, own = self.uids.worker_ids(slot.limits.run_as or self.run_as,
                                                       slot.tenant, slot.limits.confine,
                                                       name, tool)
                    self.extras.disk(init, slot, tool)
                    init = hand_over_root(init, run_as, name, tool, own, self.uids.max_processes)
                    init = self.extras.give(init, slot)
                init = compiled_by_host(init, slot.limits, self.templates.tenants_root)
                proc = self._launch(slot, init, deadline, tool)
            except (ZygoteGone, OSError) as exc:
                raise Unavailable.not_run(name, tool, f"could not start a worker: {exc}" + (
                    out_of_descriptors(exc) or ""), "no_start") from None
        except BaseException:
            self.pool.release(slot.tenant)
            raise
        proc.on_ready = functools.partial(self._ready, slot, init)
        proc.forked.add_done_callback(functools.partial(self._forked, slot))
        return proc

    def _launch(self, slot: Slot, init: P.Init, deadline: Optional[float],
                tool: str) -> WorkerProcess:
        """Start ``slot``'s worker, attached to the slot: forked (from its library's
        template when one may serve it) or spawned."""
        zyg, pump = self._zyg()
        # A spawned confined worker's temp dir is made here; a forked one's by templates.start.
        if isinstance(zyg, Spawner):
            if init.confine is not None:
                init = init._replace(tmpdir=private_tmpdir(init.confine["run_as"]))
            try:
                return zyg.start(slot, init, deadline, tool)
            except BaseException:
                if init.tmpdir:
                    remove_tmpdir(init.tmpdir, f"a worker of {slot.library.name}")
                raise
        assert pump is not None
        return self.templates.start(zyg, slot, init, pump, deadline)

    def _forked(self, slot: Slot, forked: Future[int]) -> None:
        """The zygote said the pid of ``slot``'s worker: its end will be told by it."""
        if forked.exception() is None:
            self._by_pid[forked.result()] = slot

    def _ready(self, slot: Slot, init: P.Init, proc: WorkerProcess) -> None:
        """The worker's READY: what protections are in force.  One that was asked for
        and is not ends the call before it is sent (NotConfined: 503), unless the host
        said confine="best-effort": then one clear warning per kind."""
        self.counters.started(proc.start_kind)
        self._event("start", slot, pid=proc.pid, protections=proc.protections)
        missing = not_in_force(proc.report, init.confine is not None, slot.limits.network,
                               slot.limits.max_processes, slot.limits.disk_mb)
        if missing and slot.limits.confine != BEST_EFFORT:
            raise NotConfined(refusal_text(missing))
        for kind, state in missing:
            if kind not in self._warned:
                self._warned.add(kind)
                log.warning("%s confinement requested for %s (tenant %s) is not in force: %s. "
                            "The worker runs without it (confine=\"best-effort\"); stats() "
                            "shows what is active.", kind, slot.library.name, slot.tenant, state)

    # ------------------------------------------------------------ leaving
    def stop(self, tenant: str, library_key: str) -> bool:
        """Stop the worker(s) of one library of one tenant and forget the slot(s).  A disk
        whose root no slot uses any more is unmounted: no binding of it is live, since
        bindings stop their slots on close()."""
        keys = [k for k in list(self._slots) if k[0] == tenant and k[1] == library_key]
        self._stop_slots(keys)
        return bool(keys)

    @property
    def secret_names(self) -> frozenset[str]:
        """(Backend) the names of the secrets it holds; their values never leave it."""
        return frozenset(self.egress.secrets.values)

    def set_secret(self, name: str, value: str) -> None:
        """Hold ``value`` as the secret ``name``: each worker started from now on puts it in
        its requests (one that runs keeps the value it started with)."""
        self.egress.secrets.set(name, value)

    def remove_tenant(self, tenant: str, root: Optional[str] = None) -> Optional[int]:
        """Stop every worker of ``tenant``; with ``root`` (the tenant's workspace root),
        unmount its disk, delete the disk's image and the root itself; then give the
        tenant's uid back (a uid per tenant).  Returns that uid, or None.  ValueError for
        a root that is not a tenant's own folder; OSError when it cannot be deleted (the
        uid is then kept).  A call still made for the tenant afterwards starts a worker
        again, under a new uid."""
        self._stop_slots([k for k in list(self._slots) if k[0] == tenant])
        if root is not None:
            root = os.path.realpath(root)
            self._refuse_shared(root)
            self.extras.disks.remove(root)
            if os.path.ismount(root):
                raise OSError(f"tenant {tenant!r}: its root {root} is a mount point that is "
                              f"not its disk: not removed, its uid is kept")
            shutil.rmtree(root, ignore_errors=True)
            if os.path.lexists(root):
                raise OSError(f"tenant {tenant!r}: its root {root} could not be deleted "
                              f"entirely; its uid is kept until it is")
        return self.uids.release(tenant)

    def _refuse_shared(self, root: str) -> None:
        """ValueError unless ``root`` may be deleted as one tenant's own folder."""
        shared = self.uids.folder
        if shared is not None:
            shared = os.path.realpath(shared)
        if not may_hand_over(root) or (shared is not None and path_within(shared, root)):
            raise ValueError(f"{root} is not a tenant's own folder (it is or holds "
                             f"tenants_root, a system folder or the Python installation): "
                             f"not removed")

    def _stop_slots(self, keys: list[tuple[str, str, str]]) -> None:
        """Retire the workers of the slots of ``keys``, forget the slots, unmount the
        disks no slot uses any more."""
        roots = set()
        for key in keys:
            slot = self._slots.pop(key, None)
            if slot is None:
                continue
            roots.add(slot.root)
            with slot.lock:
                proc = slot.proc
                if proc is not None:
                    self._retire(slot, proc, "stop", "stopped by the host")
                    self._leaving.wait_gone(proc, 2.0)
        self._unmount_unused(roots)

    def _unmount_unused(self, roots: set[str]) -> None:
        """The disks of ``roots`` that no slot uses any more are unmounted, under the
        supervisor's lock: a new slot of such a root waits, then mounts it again."""
        roots.discard("")
        if not roots:
            return
        with self._lock:
            used = {slot.root for slot in self._slots.values()}
            for root in roots - used:
                if self.extras.disks.release(root):
                    log.info("the tenant disk at %s is unmounted: no worker of it is left", root)

    # ------------------------------------------------------------ reports
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
                "open_files": self.open_files, "start_method": self.start_method,
                "uid_record": self.uids.where}

    def metrics(self) -> dict[str, Any]:
        """The engine's numbers for a host to export: ``calls`` (library, tool, status,
        count), ``call_duration_s`` (a histogram: cumulative buckets, sum, count),
        ``worker_starts`` by kind (fresh, forked ahead, template, spawn), ``worker_ends`` by
        cause (crash, timeout, memory, violation, load failed, host error, idle, evict,
        stop), ``refusals`` by reason (busy, pool_full, quarantine, closed, no_start),
        ``workers`` by state (idle, busy) and ``worker_uss_bytes`` (the sum of the
        watchdog's last samples), ``env_builds`` (the libraries' environments built by
        outcome, their total and longest durations, builds in flight).  Counters are kept
        as events happen; the gauges are read from the supervisor's own records, so a
        scrape stays cheap however many workers live."""
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

    # ------------------------------------------------------------ interrupt, close
    def interrupt(self, tenant: str, thread_id: int) -> bool:
        """Interrupt ``tenant``'s call that host thread ``thread_id`` waits for, as its
        soft timeout would: the tool gets ToolTimeout (once back from the host if it was
        asking it), the worker is kept, the call fails with 499."""
        return any(s.interrupt() for s in list(self._slots.values())
                   if s.tenant == tenant and s.caller == thread_id)

    def close(self) -> None:
        """Stop every worker and the zygote; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._watchdog.stop()
        idle = [slot.proc for slot in list(self._slots.values())
                if slot.proc is not None and not slot.busy]
        for proc in idle:
            proc.shut_down("the supervisor was closed")
        if self._zygote is not None:
            self._leaving.end(idle, [slot.proc for slot in list(self._slots.values())
                                     if slot.proc is not None])
            self._zygote.close()
        for slot in list(self._slots.values()):
            if slot.proc is not None:
                slot.proc.conn.close()
                self._detach(slot, slot.proc)
        self._leaving.close()
        if self._pump is not None:
            self._pump.close()
        self.templates.close()
        self.extras.close()
        _live_supervisors.discard(self)
