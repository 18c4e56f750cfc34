"""The local backend: the supervisor of this machine's worker processes.

    SandboxedBinding.execute_tool ─► Supervisor.run(spec, msg, objects)
        slot = slots[spec.key]                  (tenant, library, root): one FIFO lock each
        with slot.lock:
            a live worker, called within the last ms (the warm case)? straight on; else
            _worker_for():  closed / quarantined? ─► 503
                            idle worker died or spoke out of turn? ─► buried
                            no live worker? ─► pool room, root handed over, WorkerProcess.start()
            WorkerProcess.exchange(msg) ─► RESULT OK ─► the value (checked), inline
                                           RESULT other ─► _outcome(): the value, or an outcome
                  raised ─► _resend_or_fail(): never received ─► sent to a fresh worker
                           _failed(): WorkerGone ─► buried, 500 (507 if the watchdog killed it)
                           ProtocolViolation ─► _violation()  killed, 500
                           DeadlinePassed ─► 504 (killed); a soft timeout obeyed: 504, kept
                  (_outcome, _failed, _violation: endings.py, what each end means)
        after the call: a waiting tenant may take this worker's room (pool fairness)

    (the other modules of backends/local/: its __init__.py says what each holds)
Calls to one worker are served one at a time in arrival order; calls to
different slots never wait for each other (no global lock is held while a
call runs).
"""
from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any, Callable, Optional, Union

from ... import protocol as P
from ...core.keywords import checked_keywords
from ...core.limits import Limits, confine_setting
from ...core.outcomes import SandboxEvent, Unavailable
from ...core.policy import (
    BEST_EFFORT,
    DEFAULT_TENANT_PROCESSES,
    DEFAULT_UID_RANGE,
    default_run_as,
    not_in_force,
    refusal_text,
    run_as_setting,
)
from ...protocol import OK, Call, invalid_answer
from ..base import Closing, Lent, WorkerSpec, emit
from ..envs import Environments
from ..metrics import Metrics
from .descriptors import out_of_descriptors, raise_open_files_limit
from .endings import CallEnds, NotConfined
from .extras import WorkerExtras
from .handover import hand_over_root
from .leaving import Leaving
from .output import OutputPump
from .platforms import start_method as start_method_of
from .pool import Pool
from .process import WorkerProcess
from .reports import Reports
from .slot import CrashPolicy, Slot, evict_one
from .spawn import Spawner
from .starts import Starts
from .templates import Templates
from .tenant_uids import TenantUids
from .watchdog import Watchdog
from .zygote import Zygote, ZygoteGone

log = logging.getLogger("lcp_sandbox")

_live_supervisors: "weakref.WeakSet[Supervisor]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for sup in list(_live_supervisors):
        sup.close()


class Supervisor(CallEnds, Reports, Starts, Leaving, Closing):
    """Owns the zygote, the worker slots and the threads that watch them (a Backend)."""

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
                 env_wait_s: float = 600.0) -> None:
        """``confine``: the default of bindings that do not say (True, False, "best-effort";
        worker/confine/); ``run_as``: the (uid, gid) of a root host's confined workers, or
        "per-tenant" (a uid per tenant from ``uid_range``, kept in tenants_root:
        tenant_uids.py), None: "per-tenant" for a root host with a tenants_root, else
        nobody; ``max_processes_per_tenant``: RLIMIT_NPROC of a per-tenant uid;
        ``tenants_root``: the folder of every tenant's root, whose confined workers start
        from shared templates (templates.py, confined.py); ``on_event`` gets a dict per
        lifecycle event (start, stop, evict, idle, crash, violation, timeout, interrupt,
        memory, quarantine), also logged on lcp_sandbox.events; ``start_method`` "zygote"
        or "spawn" (platforms.py; None: LCP_SANDBOX_START_METHOD, else "zygote" on Linux);
        ``network``: the default of bindings that do not say (True, False, or a policy:
        core/egress_rules.py); ``envs_dir``: the store of the libraries' own environments
        (None: LCP_SANDBOX_ENVS_DIR, else the user's cache), ``env_wait_s`` how long a call
        waits for its library's environment to be built (backends/envs/)."""
        checked_keywords("Supervisor", locals())
        self.start_method = start_method_of(start_method)
        self.crash_policy = crash_policy or CrashPolicy()
        self.confine = confine_setting(confine)
        self.network = Limits(confine=True, network=network).network      # (checked)
        self.run_as = run_as_setting(default_run_as(tenants_root) if run_as is None else run_as)
        self.uids = TenantUids(uid_range, tenants_root, max_processes_per_tenant)  # (checked)
        self.idle_timeout_s = idle_timeout_s
        self.on_event = on_event
        self.pool = Pool(max_workers, max_workers_per_tenant)
        self._slots: dict[tuple[str, str, str], Slot] = {}
        self._by_pid: dict[int, Slot] = {}
        self._lock = threading.Lock()
        self._zygote: Optional[Union[Zygote, Spawner]] = None     # (starts.py)
        self._pump: Optional[OutputPump] = None
        self._closed = False
        self.templates = Templates(idle_timeout_s, tenants_root)
        self.open_files = raise_open_files_limit()
        self._watchdog = Watchdog(self._retire, idle_timeout_s, watch_interval_s,
                                  self._templates_due)
        self.templates.on_idle = self._watchdog.tick_at
        self._warned: set[str] = set()
        self.protections_off: frozenset[str] = frozenset()   # tests only: lcp_sandbox.testing
        self.counters = Metrics()                 # metrics(): kept as events happen
        self.extras = WorkerExtras(self.counters)  # pids cgroups, disks, the egress proxy
        self.egress = self.extras.egress
        self.environments = Environments(envs_dir, env_wait_s)
        _live_supervisors.add(self)

    def _event(self, kind: str, slot: Slot, **details: Any) -> None:
        emit(self.on_event, {"event": kind, "tenant": slot.tenant, "library": slot.library.name,
                             **details})

    # ------------------------------------------------------------ calling
    def run(self, spec: WorkerSpec, msg: tuple, objects: Lent, *, tool: str,  # noqa: C901
            timeout_s: Optional[float] = None) -> Any:
        """Send ``msg`` (a protocol.Call, Prompt, ModCall or Load) to the worker of
        ``spec`` and return the value of its RESULT; SandboxEvent when the sandbox
        ended the call.  A Call is counted in ``metrics()`` (its status, its duration).

        Waiting for the worker (its queue, or room in the pool) counts against the
        call's timeout from the moment the call was made.  (One frame on purpose: it is
        the warm path; a helper call costs more than its body.)"""
        start = time.monotonic()
        timeout = spec.limits.timeout_s if timeout_s is None else timeout_s
        slot = self._slots.get(spec.key) or self._slot(spec)
        if slot.limits is not spec.limits:       # (the binding keeps its specs: seldom)
            slot.configure(spec.limits)
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
                if slot.limits.memory_mb:           # (the watchdog samples it while it runs)
                    self._watchdog.call_started(slot)
                try:
                    result = proc.exchange(msg, objects, slot.limits, timeout, slot.spin)
                except BaseException as exc:  # (raises the call's outcome, or sends it anew)
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
                self._watchdog.call_ended(slot)     # (holding the lock: see Watchdog._idle)
                slot.lock.release()
                zyg = self._zygote
                if zyg is not None and zyg.owed:    # a worker forked ahead served: replace it
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
        with self._lock:
            return self._slots.setdefault(spec.key, Slot(spec.tenant, spec.library, spec.limits,
                                                         spec.root))

    def _worker_for(self, slot: Slot, spec: WorkerSpec, tool: str,
                    queue_deadline: Optional[float], now: float) -> WorkerProcess:
        """The slot's worker, alive and idle, started if need be (503: closed, quarantined)."""
        if self._closed:
            raise Unavailable.not_run(slot.library.name, tool, "the sandbox supervisor is closed.",
                                      "closed")
        slot.refuse_if_quarantined(tool, now)
        proc = slot.proc
        # Did it die (or speak out of turn) while idle?  The zygote says so within a moment; a
        # worker idle for over a millisecond is also asked (poll): that word may be on its way.
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

    # ------------------------------------------------------------ workers
    def _on_exit(self, pid: int, status: int) -> None:
        slot = self._by_pid.pop(pid, None)
        if slot is not None and slot.proc is not None and slot.proc.pid == pid:
            slot.proc.exited(status)
        elif slot is None:
            self.templates.exited(pid)

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
        name = slot.library.name
        self._room(slot, deadline, tool)
        try:
            try:
                if self.protections_off:
                    init = init._replace(disabled=sorted(self.protections_off))
                if init.confine is not None:      # (its temp dir: templates.start makes it)
                    run_as, own = self.uids.worker_ids(slot.limits.run_as or self.run_as,
                                                       slot.tenant, slot.limits.confine,
                                                       name, tool)
                    self.extras.disk(init, slot, tool)
                    init = hand_over_root(init, run_as, name, tool, own, self.uids.max_processes)
                    init = self.extras.give(init, slot)
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

    # ------------------------------------------------------------ lifecycle
    def interrupt(self, tenant: str, thread_id: int) -> bool:
        """Interrupt ``tenant``'s call that host thread ``thread_id`` waits for, as its
        soft timeout would (the tool gets ToolTimeout, once back from the host if it
        was asking it; the worker is kept; the call fails with 499)."""
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
            deadline = time.monotonic() + 1.0
            for proc in idle:
                if proc.known_pid is not None:
                    proc.zygote.wait_exit(proc.pid, max(0.0, deadline - time.monotonic()))
            self._zygote.close()
        for slot in list(self._slots.values()):
            if slot.proc is not None:
                slot.proc.conn.close()
                self._detach(slot, slot.proc)
        if self._pump is not None:
            self._pump.close()
        self.templates.close()
        self.extras.close()
        _live_supervisors.discard(self)
