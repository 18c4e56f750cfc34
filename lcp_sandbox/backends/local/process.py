"""One worker process as the host sees it: its connection, its pid, its end.

    start()     INIT to a worker the zygote forked ahead (backends/local/zygote_client.py take()),
                held to go with the first call (one send, one wake-up),
                or else FORK to the zygote with a fresh socketpair and INIT into it
                (the pid comes later, as a Future: the call is sent at once);
                stdout/stderr to the output pump
    exchange()  one call, as a protocol state machine:

        send:     CALL | PROMPT | MODCALL | LOAD  (a CALL carries the worker's spin budget)
        wait:     poll the socket for the slot's spin window (spin.py), then read:
                  a RESULT ─► checked, returned (the warm call: all of it in exchange())
        _serve(): anything else, until the RESULT (reading with _next()):
               READY (first, exactly once)  ─► on_ready(report); an interrupt() that
                                               came before it is signalled now
               REQUEST ─► _answer(): HostObjects.handle(), REPLY  (clock paused past 5 ms)
               deadline ─► SIGUSR1 (soft) ... grace_s ... kill the tree (hard): DeadlinePassed
        EOF ─► WorkerGone;  anything else, a frame over its cap ─► protocol.BadMessage

    kill()      the zygote kills its tree (``kill_reason``, a KillReason, says why)
    shut_down() SHUTDOWN, then the connection is closed (a retired worker)
    reap()      wait for the zygote's word of its end; how it ended, in words

What a slot, the pool and the crash policy make of an end is not decided
here (see supervisor.py and slot.py).

A warm call end to end, the common case (a CALL answered by an OK RESULT, no
REQUEST), each step one Python frame or less:

    host    SandboxedBinding.execute_tool: route, params, workspace, the CALL
            ─► Supervisor.run: FifoLock (uncontended: one non-blocking acquire);
               a live worker called within the last ms needs no other check
            ─► exchange(): spin plan ─► pickle + send ─► poll ─► recv_frame (cap)
               ─► parse_from_worker (decode + every check) ─► RESULT
            ─► back in run: invalid_answer(), the value
    worker  serve_calls: recv_frame ─► loads_from_host ─► Worker.call (workspace,
            params, the tool, normalize) ─► reply: Encoder (plain check, msgpack)
            ─► send ─► poll for the next CALL for its spin_us
"""
from __future__ import annotations

import os
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Union

from ... import protocol as P
from ...core.limits import Limits
from ...core.policy import PROTECTIONS
from ...protocol import TIMED_OUT
from ...system.proc import describe_exit
from ..base import Lent
from .confine import pid_guard
from .output import OutputPump
from .spin import SpinPolicy, calls_in_flight
from .zygote_client import ZygoteClient, ZygoteGone

_READY_CAPS = {P.READY: P.READY_CAP}
# Of each REQUEST's answer, this much counts against the deadline.
HOST_WAIT_COUNTS_S = 0.005


@dataclass(frozen=True)
class KillReason:
    """Why a worker ended on purpose, for the record (its slot's ``last_exit``)."""
    # In words: "killed after its 30 s timeout"...
    why: str
    # A death the crash policy counts (a violation does)
    counts: bool = True
    # The status its call ends with (507: over its memory limit)
    code: Optional[int] = None
    # For the metrics: timeout, memory, violation, load failed...
    cause: str = "killed"


class Parent(Protocol):
    """What a worker's parent does for the host: the zygote (zygote_client.py), or a spawned
    worker's own handle (spawn.py's Child)."""
    alive: bool

    def kill(self, pid: int) -> None: ...
    def kill_refused(self, pid: int) -> Optional[str]: ...
    def signal(self, pid: int, sig: int) -> None: ...
    def reaped(self, pid: int) -> bool: ...
    def wait_exit(self, pid: int, timeout: float) -> Optional[int]: ...


class WorkerGone(Exception):
    """The worker's connection ended (EOF) during a call."""


class NeverReceived(WorkerGone):
    """A worker that had served had hung up before the call was sent: nothing of the call
    reached it (the send failed, the read found only the end), so it never ran."""


class DeadlinePassed(Exception):
    """The call ran past its timeout and its grace: the worker's tree was killed."""


class WorkerProcess:
    __slots__ = ("forked", "zygote", "conn", "started", "tmpdir", "calls", "exit_status",
                 "kill_reason", "ready", "report", "on_ready", "interrupted", "_caps", "_caps_mb",
                 "_pid", "start_kind", "guard")

    def __init__(self, forked: Future[int], zygote: Parent, conn: P.Connection,
                 tmpdir: Optional[str] = None, start_kind: str = "fresh") -> None:
        # The zygote's answer: the pid.
        self.forked = forked
        # How it started, for the metrics: fresh,
        self.start_kind = start_kind
                                               # forked ahead, template
        # Its parent: reaps it, kills it, signals it.
        self.zygote = zygote
        self.conn = conn
        self.started = time.monotonic()
        # Made by the host, removed by the host.
        self.tmpdir = tmpdir
        self.calls = 0
        # Set when the zygote reports it.
        self.exit_status: Optional[int] = None
        # Set by whoever ended it on purpose.
        self.kill_reason: Optional[KillReason] = None
        # Its READY arrived (exactly once, first)
        self.ready = False
        # READY: protections in force.
        self.report: dict[str, str] = {}
        self.on_ready: Callable[["WorkerProcess"], Any] = lambda proc: None
        # The host cancelled the call in flight.
        self.interrupted = False
        # Frame caps during a call, for ...
        self._caps: dict[int, int] = {}
        # ... this max_result_mb.
        self._caps_mb: Optional[float] = None
        # The pid, once the zygote said it.
        self._pid: Optional[int] = None
        # the host's guard of its processes (confine/pid_guard.py): True until its first byte came
        self.guard: Union[pid_guard.Watch, pid_guard.Member, str, bool, None] = None

    @classmethod
    def start(cls, zygote: ZygoteClient, init: P.Init, pump: OutputPump, library: str,
              log_bytes_per_s: int, template: int = 0) -> "WorkerProcess":
        """Fork a worker that will serve ``init`` (from the library's ``template``
        process when given, see backends/local/templates.py); raises ZygoteGone or OSError.
        Without a template, a worker forked ahead serves an unconfined INIT when there
        is one."""
        # Not for a confined worker: the one forked ahead holds the host's environment.
        reserved = None if template or init.confine is not None else zygote.take()
        if reserved is not None:
            host_sock, log_r, forked = reserved
            conn = P.Connection(host_sock)
            try:
                # EOF: it died waiting; a fresh one below.
                if conn.readable_now():
                    raise OSError("the reserved worker is gone")
                # Sent with the call: the worker wakes once.
                conn.hold(P.INIT, init)
            except BaseException as exc:
                conn.close()
                os.close(log_r)
                if not isinstance(exc, OSError):
                    raise
            else:
                pump.add(log_r, library, log_bytes_per_s)
                return cls(forked, zygote, conn, init.tmpdir, "forked ahead")
        # a fresh confined worker may need the host's guard of its processes (confine/pid_guard.py)
        guarded = init.confine is not None and not template
        if guarded:
            init = init._replace(confine={**(init.confine or {}), "pid_guard": True})
        host_sock, worker_sock = P.pair()
        log_r, log_w = os.pipe()
        conn = P.Connection(host_sock)
        try:
            # The zygote hands the descriptors to a waiting spare while INIT is encoded
            # and sent here; the call itself follows at once: nobody waits for the fork.
            forked = (zygote.fork(worker_sock.fileno(), log_w, template) if template
                      else zygote.fork(worker_sock.fileno(), log_w, pidns=init.confine is not None
                                       and "pidns" not in (init.disabled or ())))
            conn.send(P.INIT, init)
        except BaseException:
            conn.close()
            os.close(log_r)
            raise
        finally:
            worker_sock.close()
            os.close(log_w)
        pump.add(log_r, library, log_bytes_per_s)
        proc = cls(forked, zygote, conn, init.tmpdir, "template" if template else "fresh")
        proc.guard = pid_guard.member_of(template) if template else guarded
        return proc

    @property
    def pid(self) -> int:
        return self.forked.result(30.0)

    def _forked_pid(self) -> int:
        """Its pid, for its first call; NeverReceived when its zygote died before forking
        it (no worker ever read what it was sent: the call may go to another)."""
        try:
            return self.pid
        except ZygoteGone:
            raise NeverReceived from None

    @property
    def known_pid(self) -> Optional[int]:
        """The pid if the zygote already said it (never waits)."""
        if self._pid is None:
            f = self.forked
            if f.done() and f.exception() is None:
                self._pid = f.result()
        return self._pid

    @property
    def protections(self) -> dict[str, str]:
        """What its READY said is in force."""
        return {k: v for k, v in self.report.items() if k in PROTECTIONS}

    # ------------------------------------------------------------ its end
    def kill(self, reason: Optional[KillReason] = None) -> None:
        """Kill its process tree; the first ``reason`` given is the one recorded."""
        if reason is not None and self.kill_reason is None:
            self.kill_reason = reason
        try:
            pid = self.pid
        except ZygoteGone:
            # never forked: nothing to kill
            return
        self.zygote.kill(pid)

    def exiting(self, why: str) -> None:
        """It ends on its own (its library failed to load): ``why`` is the record."""
        self.kill_reason = KillReason(why, counts=False, cause="load failed")

    def exited(self, status: int) -> None:
        """The zygote reaped it: its Popen-style return code."""
        self.exit_status = status

    def shut_down(self, why: str) -> None:
        """Ask it to exit (it is idle) and let go of it."""
        self.kill_reason = KillReason(why, counts=False)
        try:
            self.conn.send(P.SHUTDOWN)
        except OSError:
            pass
        self.conn.close()

    def wait_gone(self, timeout: float) -> None:
        """Wait for its end; kill it if it lingers."""
        if self.zygote.wait_exit(self.pid, timeout) is None:
            self.kill()
            self.zygote.wait_exit(self.pid, timeout)

    def reap(self) -> str:
        """It is gone or going: close the connection, wait for the zygote's word
        (kill it if it lingers) and say how it ended."""
        self.conn.close()
        pid_guard.release(self.guard)
        status = self.exit_status
        # A dead zygote's workers died with it.
        if status is None and self.zygote.alive:
            status = self.zygote.wait_exit(self.pid, 5.0)
            # Still there? make sure.
            if status is None:
                self.zygote.kill(self.pid)
                status = self.zygote.wait_exit(self.pid, 5.0)
            refused = self.zygote.kill_refused(self.pid) if status is None else None
            if refused:
                # never reported as killed: it may still run
                self.kill_reason = KillReason(f"could not be killed ({refused}): it may still "
                                              f"be running", counts=False, cause="kill refused")
                return self.kill_reason.why
        return describe_exit(status)

    # ------------------------------------------------------------ a call
    # (The warm call's path is exchange() alone, in one frame: send, poll, one read, its
    # checks; a helper's call on it costs more than the branches it would hide.)
    def exchange(self, msg: tuple[Any, ...], objects: Lent,  # noqa: C901
                 limits: Limits, timeout: Optional[float],
                 spin: Optional[SpinPolicy] = None) -> P.Result:
        """Send ``msg`` and serve the worker until its RESULT: READY first (once),
        REQUESTs answered meanwhile; anything else, or a frame over its cap, is a
        protocol violation.  Every read ends by the call's hard deadline.  With
        ``spin`` (the slot's), the first wait polls before it blocks (spin.py).

        Raises PayloadError (``msg`` could not be sent: nothing was), WorkerGone
        (NeverReceived: it had hung up before ``msg`` was sent),
        DeadlinePassed (the tree was killed) or protocol.BadMessage."""
        conn = self.conn
        grace = limits.grace_s
        sent = time.monotonic()
        deadline = sent + timeout if timeout else None
        if self._caps_mb != limits.max_result_mb:
            self._set_caps(limits.max_result_mb)
        if not self.ready:
            # Its first call starts it: nothing to learn.
            spin = None
            # Its first byte: the guard's listener.
            if self.guard is True:
                self.guard = pid_guard.receive(conn.sock, deadline, self._forked_pid())
            elif isinstance(self.guard, pid_guard.Member) and not self.guard.pid:
                # Its template's guard: a tree of its own.
                self.guard.join(self._forked_pid())
        objects.conn = conn
        # One call at a time per worker.
        token = id(self)
        calls = calls_in_flight.enter(token)
        try:
            # Send: a CALL carries the worker's spin budget.
            kind = P.KIND_OF[type(msg)]
            window = 0.0
            undelivered = False
            if spin is not None:
                window, budget = spin.plan(sent, calls)
                if isinstance(msg, P.Call) and budget != msg.spin_us:
                    msg = msg._replace(spin_us=budget)
            try:
                # A worker that stops reading cannot hold the host past the hard deadline.
                conn.send(kind, msg, None if deadline is None else deadline + grace)
            except TimeoutError:
                raise P.BadMessage(conn.broken) from None
            # The worker is gone: the read tells how.
            except OSError:
                # One that never started: its start failed.
                undelivered = self.ready
            # Wait: poll for the answer a short while before sleeping; never past the deadline.
            caught = None
            if window:
                until = sent + window
                caught = conn.spin(until if deadline is None or until < deadline else deadline)
            # The message parse_from_worker checked.
            reply: Any
            try:
                kind, payload = conn.recv_frame(deadline, self._caps if self.ready else _READY_CAPS)
                reply = P.parse_from_worker(kind, payload, conn.decoder)
            except TimeoutError:
                kind, reply = 0, None
            except (EOFError, OSError):
                raise (NeverReceived if undelivered else WorkerGone) from None
            soft_sent = False
            # READY, a REQUEST, the deadline: serve them.
            if kind != P.RESULT:
                reply, soft_sent = self._serve(kind, reply, objects, deadline, grace, timeout)
            if reply.outcome == TIMED_OUT and not soft_sent and not self.interrupted:
                raise P.BadMessage("it reported a timeout nobody signalled")
            if conn.pending():
                raise P.BadMessage("it sent more after its RESULT")
            if spin is not None:
                spin.answered(sent, time.monotonic(), caught)
            return reply
        finally:
            calls_in_flight.leave(token)
            objects.release()

    def _set_caps(self, max_result_mb: float) -> None:
        """The frame caps during a call (kept: built again only when the limit changes)."""
        self._caps_mb = max_result_mb
        self._caps = {P.REQUEST: P.REQUEST_CAP,
                      P.RESULT: int(max_result_mb * 1048576) + P.RESULT_OVERHEAD}

    def _next(self, deadline: Optional[float]) -> tuple[int, Any]:
        """(_serve) The worker's next message, decoded and checked: (kind, its
        NamedTuple); (0, None) when the deadline passed first.  WorkerGone at EOF."""
        conn = self.conn
        try:
            kind, payload = conn.recv_frame(deadline, self._caps if self.ready else _READY_CAPS)
            return kind, P.parse_from_worker(kind, payload, conn.decoder)
        except TimeoutError:
            return 0, None
        except (EOFError, OSError):
            raise WorkerGone from None

    def _serve(self, kind: int, reply: Any, objects: Lent, deadline: Optional[float],
               grace: float, timeout: Optional[float]) -> tuple[P.Result, bool]:
        """From a message that was not the RESULT (READY, a REQUEST, the deadline) on,
        serve the worker until its RESULT: (the RESULT, whether the soft timeout was
        signalled).  Past the deadline: SIGUSR1, and past its grace, the tree killed."""
        soft_sent = False
        while kind != P.RESULT:
            # The deadline passed.
            if not kind:
                if soft_sent:
                    self.kill(KillReason(f"killed after its {timeout:g} s timeout", counts=False,
                                         cause="timeout"))
                    raise DeadlinePassed
                soft_sent = True
                self.zygote.signal(self.pid, P.SOFT_TIMEOUT_SIGNAL)
                deadline = time.monotonic() + grace
            elif kind == P.READY:
                self._read_ready(reply, soft_sent)
            else:
                deadline = self._answer(reply, objects, deadline, 0.0 if soft_sent else grace)
            kind, reply = self._next(deadline)
        return reply, soft_sent

    def _read_ready(self, ready: P.Ready, soft_sent: bool) -> None:
        self.ready = True
        # interrupt() came before READY.
        if self.interrupted and not soft_sent:
            self.zygote.signal(self.pid, P.SOFT_TIMEOUT_SIGNAL)
        self.report = pid_guard.vouched(ready.report, self.guard)
        self.on_ready(self)

    def _answer(self, request: P.Request, objects: Lent, deadline: Optional[float],
                grace: float) -> Optional[float]:
        """Serve one REQUEST and send its REPLY; the call's deadline, moved by the time
        the host took when that was long enough not to count."""
        conn = self.conn
        t0 = time.monotonic()
        objects.deadline = None if deadline is None else deadline + grace
        answer = objects.handle(request, conn.decoder.saw_ref)
        # During a callback into the tool.
        if conn.broken:
            raise P.BadMessage(conn.broken)
        try:
            try:
                conn.send(P.REPLY, answer, objects.deadline)
            except P.PayloadError as exc:
                why = f"the host's answer cannot be sent: {exc}"
                conn.send(P.REPLY, (False, ["TypeError", [why]]), objects.deadline)
        except TimeoutError:
            raise P.BadMessage(conn.broken) from None
        except OSError:
            pass
        waited = time.monotonic() - t0
        if deadline is not None and waited > HOST_WAIT_COUNTS_S:
            # Waiting for the host (a person confirming, an LLM generating) does not
            # count, but the first 5 ms of every answer do: a flood of requests, quick or
            # slowed by a busy host, uses the deadline up instead of stretching it.
            deadline += waited - HOST_WAIT_COUNTS_S
        return deadline
