"""What each end of a call means: the worker's fate and what the caller gets.

    Supervisor.run ─► exchange()
        NeverReceived (it hung up since its last call) ─► _resend_or_fail(): buried, the
                                     call sent once more, to a fresh worker
        RESULT OK ─► the value (checked inline in run(): a malformed one is a violation)
        RESULT other ─► _outcome():  TIMED_OUT  ─► 499 (interrupted) or 504, worker kept
                                     OUT_OF_MEMORY ─► 507, worker kept
                                     LOAD_FAILED ─► buried (it exits); the value, or raised
                                     RAISED ─► the module function's exception, rebuilt
        raised ─► _failed():  WorkerGone ─► buried, 500 (507 if the watchdog killed it)
                              ProtocolViolation ─► _violation(): killed, buried, 500
                              DeadlinePassed ─► buried (killed), 504
                              NotConfined ─► killed before the call was sent, 503
                              PayloadError ─► nothing was sent, worker kept, 500
                              anything else ─► killed, buried (the stream may be out of step)

    a worker's end:  _retire() (idle, evicted, stopped: asked to exit), _bury() (dead or
                     killed: reaped, counted towards quarantine), both _detach() it from
                     its slot (its room in the pool, its template, its temp dir)

``CallEnds`` is the Supervisor's (a mixin): it reads ``_closed``, the pool, the
templates, the watchdog, the crash policy and the counters, and calls ``_event`` and
``_worker_for``, which the Supervisor defines.
"""
from __future__ import annotations

import logging
import time
from typing import Any, NoReturn, Optional

from ... import protocol as P
from ...core.normalize import OUT_OF_MEMORY
from ...core.outcomes import (
    CallFailed,
    Cancelled,
    OutOfMemory,
    ProtocolViolated,
    TimedOut,
    Unavailable,
    WorkerDied,
)
from ...protocol import Outcome, invalid_answer, is_error, rebuild_error
from ..base import Lent, WorkerSpec
from ..metrics import Metrics
from . import cgroups
from .handover import remove_tmpdir
from .pool import Pool
from .process import DeadlinePassed, KillReason, NeverReceived, WorkerGone, WorkerProcess
from .slot import CrashPolicy, Slot
from .templates import Templates
from .watchdog import Watchdog

log = logging.getLogger("lcp_sandbox")


class NotConfined(Exception):
    """(Supervisor._ready) A protection the worker was asked for is not in force: the
    call is not sent, the worker is stopped; the text says what is missing."""


class CallEnds:
    """The Supervisor's decisions at the end of a call that did not simply succeed."""

    _closed: bool
    pool: Pool
    templates: Templates
    crash_policy: CrashPolicy
    counters: Metrics
    _watchdog: Watchdog

    def _event(self, kind: str, slot: Slot, **details: Any) -> None:
        raise NotImplementedError

    def _worker_for(self, slot: Slot, spec: WorkerSpec, tool: str,
                    queue_deadline: Optional[float], now: float) -> WorkerProcess:
        raise NotImplementedError

    def _detach(self, slot: Slot, proc: WorkerProcess) -> None:
        """``proc`` no longer serves ``slot``: give its room back to the pool."""
        if slot.detach(proc):
            cgroups.remove(slot.cgroup)           # (a worker still ending keeps it: later)
            self.pool.release(slot.tenant)
            self.templates.released(slot.template)
            if proc.tmpdir:
                remove_tmpdir(proc.tmpdir, f"worker {proc.known_pid} of {slot.library.name}")

    def _retire(self, slot: Slot, proc: WorkerProcess, kind: str, why: str) -> None:
        """Stop an idle worker on purpose (eviction, idle timeout, host request)."""
        proc.shut_down(why)
        slot.ended(why)
        self._detach(slot, proc)
        self._watchdog.retiring(proc)
        self.counters.ended(kind)
        self._event(kind, slot, pid=proc.pid, reason=why)

    def _bury(self, slot: Slot, proc: WorkerProcess, served_a_call: bool) -> str:
        """The worker is gone or going: reap it, record how, free the slot."""
        how = proc.reap()
        reason = proc.kill_reason
        slot.ended(how if reason is None else reason.why)
        self.counters.ended("crash" if reason is None else reason.cause)
        self._detach(slot, proc)
        if reason is None or reason.counts:
            self._event("crash", slot, pid=proc.pid, reason=how)
            backoff = slot.record_death(self.crash_policy, fresh=not served_a_call)
            if backoff is not None:
                log.error("library %s (tenant %s) quarantined for %.0f s after repeated worker "
                          "deaths", slot.library.name, slot.tenant, backoff)
                self._event("quarantine", slot, seconds=backoff)
        return how

    def _ended_while_idle(self, slot: Slot, proc: WorkerProcess) -> None:
        """``proc`` hung up or spoke while it had no call: a word is a violation, an end
        a death; either way it is buried."""
        if proc.exit_status is None and proc.conn.sent_while_idle():
            self._violation(slot, proc, None, "it sent a message while no call was running")
        else:
            self._bury(slot, proc, served_a_call=proc.calls > 0)

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
        """The exchange raised ``exc``: the worker's fate; raises the call's SandboxEvent
        (or ``exc``)."""
        name = slot.library.name
        if isinstance(exc, WorkerGone):
            how = self._bury(slot, proc, served_a_call=proc.calls > 0)
            reason = proc.kill_reason
            if self._closed:
                raise Unavailable(f"[{name}] tool '{tool}' was stopped: the sandbox supervisor "
                                  "was closed while it ran.")
            if reason is not None and reason.code == OUT_OF_MEMORY:
                self._event("memory", slot, pid=proc.pid, tool=tool, reason=reason.why)
                raise OutOfMemory.killed(name, tool, reason.why)
            raise WorkerDied(name, tool, how)
        if isinstance(exc, P.ProtocolViolation):
            self._violation(slot, proc, tool, str(exc))
        if isinstance(exc, DeadlinePassed):
            how = self._bury(slot, proc, served_a_call=True)
            self._event("timeout", slot, pid=proc.pid, tool=tool, stage="hard", seconds=timeout)
            if proc.kill_reason is not None and proc.kill_reason.cause == "kill refused":
                raise WorkerDied(name, tool, f"ran past its {timeout or 0.0:g} s timeout and "
                                 f"{how}") from None
            raise TimedOut(name, tool, timeout or 0.0, killed=True) from None
        if isinstance(exc, NotConfined):
            proc.kill(KillReason("stopped: its confinement is not all in force", counts=False,
                                 cause="not confined"))
            self._bury(slot, proc, served_a_call=True)
            self._event("refused", slot, pid=proc.pid, tool=tool, reason=str(exc))
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
        outcome = Outcome(wire)                   # (the codec checked it is one)
        if outcome is Outcome.TIMED_OUT:
            if slot.interrupted:
                self._event("interrupt", slot, pid=proc.pid, tool=tool)
                raise Cancelled(name, tool)
            self._event("timeout", slot, pid=proc.pid, tool=tool, stage="soft", seconds=timeout)
            raise TimedOut(name, tool, timeout or 0.0, killed=False)
        if outcome is Outcome.OUT_OF_MEMORY:
            raise OutOfMemory.uncaught(name, tool, detail[:500], slot.limits.memory_mb)
        if outcome is Outcome.LOAD_FAILED:        # the worker exits: start fresh next time
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
        # Outcome.RAISED: a module function called by the host raised
        if type(msg) is not P.ModCall:
            self._violation(slot, proc, tool, "an exception result for a call that cannot raise")
        raise rebuild_error(*value)

    def _violation(self, slot: Slot, proc: WorkerProcess, tool: Optional[str], what: str) -> None:
        """The worker broke the protocol: kill its tree, never believe it (and, during
        a call, end the call)."""
        proc.kill(KillReason(f"broke the protocol ({what})", counts=True, cause="violation"))
        self._bury(slot, proc, served_a_call=proc.calls > 0)
        self._event("violation", slot, pid=proc.known_pid, tool=tool, reason=what)
        if tool is not None:
            raise ProtocolViolated(slot.library.name, tool, what)

