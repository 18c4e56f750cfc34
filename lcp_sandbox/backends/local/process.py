"""One worker process as the host sees it: its connection, its pid, its end.

    start()     INIT to a worker the zygote forked ahead (host/zygote.py take()),
                held to go with the first call (one send, one wake-up),
                or else FORK to the zygote with a fresh socketpair and INIT into it
                (the pid comes later, as a Future: the call is sent at once);
                stdout/stderr to the output pump
    exchange()  one call, as a protocol state machine:

        send CALL | PROMPT | MODCALL | LOAD      (a CALL carries the worker's spin budget)
        poll the socket for the slot's spin window (host/spin.py), then:
        loop:  READY (first, exactly once)  ─► on_ready(report); an interrupt() that
                                               came before it is signalled now
               REQUEST ─► HostObjects.handle() here, REPLY   (clock paused meanwhile)
               RESULT  ─► checked, returned
               deadline ─► SIGUSR1 (soft) ... grace_s ... kill the tree (hard): DeadlinePassed
               EOF      ─► WorkerGone
               anything else, a frame over its cap ─► protocol.ProtocolViolation

    kill()      the zygote kills its tree (``kill_reason`` says why, for the record)
    shut_down() SHUTDOWN, then the connection is closed (a retired worker)
    reap()      wait for the zygote's word of its end; how it ended, in words

What a slot, the pool and the crash policy make of an end is not decided
here (see backends/local.py and host/slot.py).

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
from typing import Any, Callable, Optional

from ... import protocol as P
from ..base import Lent
from ...system.proc import describe_exit
from ...core.limits import Limits
from .output import OutputPump
from .spin import SpinPolicy, calls_in_flight
from .zygote import Zygote


_KIND = {P.Call: P.CALL, P.Prompt: P.PROMPT, P.ModCall: P.MODCALL, P.Load: P.LOAD}
_READY_CAPS = {P.READY: P.READY_CAP}
HOST_WAIT_PAUSES_S = 0.005     # a REQUEST the host took at least this long to answer pauses the clock


class WorkerGone(Exception):
    """The worker's connection ended (EOF) during a call."""


class DeadlinePassed(Exception):
    """The call ran past its timeout and its grace: the worker's tree was killed."""


class WorkerProcess:
    __slots__ = ("forked", "zygote", "conn", "started", "tmpdir", "calls", "exit_status", "kill_reason",
                 "ready", "report", "on_ready", "interrupted", "_caps", "_caps_mb", "_pid")

    def __init__(self, forked: Future, zygote: Zygote, conn: P.Connection, tmpdir: Optional[str] = None) -> None:
        self.forked = forked                   # the zygote's answer: the pid
        self.zygote = zygote                   # its parent: reaps it, kills it, signals it
        self.conn = conn
        self.started = time.monotonic()
        self.tmpdir = tmpdir                   # made by the host, removed by the host
        self.calls = 0
        self.exit_status: Optional[int] = None      # set when the zygote reports it
        self.kill_reason: Optional[dict] = None     # set by whoever killed it on purpose
        self.ready = False                     # its READY arrived (exactly once, first)
        self.report: dict = {}                 # READY: protections in force
        self.on_ready: Callable[["WorkerProcess"], Any] = lambda proc: None
        self.interrupted = False               # the host cancelled the call in flight (Slot.interrupt)
        self._caps: dict = {}                  # frame caps during a call, for ...
        self._caps_mb: Optional[float] = None  # ... this max_result_mb
        self._pid: Optional[int] = None        # the pid, once the zygote said it

    @classmethod
    def start(cls, zygote: Zygote, init: P.Init, pump: OutputPump, library: str,
              log_bytes_per_s: int, template: int = 0) -> "WorkerProcess":
        """Fork a worker that will serve ``init`` (from the library's ``template``
        process when given, see host/templates.py); raises ZygoteGone or OSError.
        Without a template, a worker forked ahead serves an unconfined INIT when there
        is one."""
        # Not for a confined worker: the one forked ahead holds the host's environment (PRIME).
        reserved = None if template or init.confine is not None else zygote.take()
        if reserved is not None:
            host_sock, log_r, forked = reserved
            conn = P.Connection(host_sock)
            try:
                if conn.readable_now():           # (EOF: it died waiting; a fresh one below)
                    raise OSError("the reserved worker is gone")
                conn.hold(P.INIT, init)           # sent with the call: the worker wakes once
            except BaseException as exc:
                conn.close()
                os.close(log_r)
                if not isinstance(exc, OSError):
                    raise
            else:
                pump.add(log_r, library, log_bytes_per_s)
                return cls(forked, zygote, conn, init.tmpdir)
        host_sock, worker_sock = P.pair()
        log_r, log_w = os.pipe()
        conn = P.Connection(host_sock)
        try:
            # The zygote hands the descriptors to a waiting spare while INIT is encoded
            # and sent here; the call itself follows at once: nobody waits for the fork.
            forked = (zygote.fork(worker_sock.fileno(), log_w, template) if template
                      else zygote.fork(worker_sock.fileno(), log_w))
            conn.send(P.INIT, init)
        except BaseException:
            conn.close()
            os.close(log_r)
            raise
        finally:
            worker_sock.close()
            os.close(log_w)
        pump.add(log_r, library, log_bytes_per_s)
        return cls(forked, zygote, conn, init.tmpdir)

    @property
    def pid(self) -> int:
        return self.forked.result(30.0)

    @property
    def known_pid(self) -> Optional[int]:
        """The pid if the zygote already said it (never waits)."""
        if self._pid is None:
            f = self.forked
            if f.done() and f.exception() is None:
                self._pid = f.result()
        return self._pid

    @property
    def protections(self) -> dict:
        """What its READY said is in force."""
        return {k: v for k, v in self.report.items()
                if k in ("env", "network", "filesystem", "privileges", "unix_sockets", "syscalls")}

    # ------------------------------------------------------------ its end
    def kill(self, reason: Optional[dict] = None) -> None:
        """Kill its process tree; the first ``reason`` given is the one recorded."""
        if reason is not None and self.kill_reason is None:
            self.kill_reason = reason
        self.zygote.kill(self.pid)

    def shut_down(self, why: str) -> None:
        """Ask it to exit (it is idle) and let go of it."""
        self.kill_reason = {"why": why, "counts": False}
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
        status = self.exit_status
        if status is None and self.zygote.alive:     # (a dead zygote's workers died with it)
            status = self.zygote.wait_exit(self.pid, 5.0)
            if status is None:                       # still there? make sure.
                self.zygote.kill(self.pid)
                status = self.zygote.wait_exit(self.pid, 5.0)
        return describe_exit(status)

    # ------------------------------------------------------------ a call
    def exchange(self, msg: tuple, objects: Lent, limits: Limits, timeout: Optional[float],
                 spin: Optional[SpinPolicy] = None) -> P.Result:
        """Send ``msg`` and serve the worker until its RESULT: READY first (once),
        REQUESTs answered meanwhile; anything else, or a frame over its cap, is a
        protocol violation.  Every read ends by the call's hard deadline.  With
        ``spin`` (the slot's), the first wait polls before it blocks (host/spin.py).

        Raises PayloadError (``msg`` could not be sent: nothing was), WorkerGone,
        DeadlinePassed (the tree was killed) or protocol.ProtocolViolation."""
        conn = self.conn
        grace = limits.grace_s
        sent = time.monotonic()
        deadline = sent + timeout if timeout else None
        window = 0.0
        first = _KIND[type(msg)]
        if not self.ready:
            spin = None                           # (its first call starts it: nothing to learn from)
        if self._caps_mb != limits.max_result_mb:          # (built once, not per call)
            self._caps_mb = limits.max_result_mb
            self._caps = {P.REQUEST: P.REQUEST_CAP, P.RESULT: int(limits.max_result_mb * 1048576) + P.RESULT_OVERHEAD}
        call_caps = self._caps
        soft_sent = False
        objects.conn = conn
        token = id(self)                          # (one call at a time per worker)
        calls = calls_in_flight.enter(token)
        try:
            if spin is not None:
                window, budget = spin.plan(sent, calls)
                if first == P.CALL and budget != msg[-1]:
                    msg = msg[:-1] + (budget,)    # spin_us, its last field (sent as a plain tuple anyway)
            try:
                # A worker that stops reading cannot hold the host past the hard deadline.
                conn.send(first, msg, None if deadline is None else deadline + grace)
            except TimeoutError:
                raise P.ProtocolViolation(conn.broken) from None
            except OSError:
                pass                              # the worker is gone: the read below tells how
            # Poll for the answer a short while before sleeping; never past the deadline.
            if window:
                until = sent + window
                caught = conn.spin(until if deadline is None or until < deadline else deadline)
            else:
                caught = None
            while True:
                try:
                    kind, payload = conn.recv_frame(deadline, call_caps if self.ready else _READY_CAPS)
                    reply = P.parse_from_worker(kind, payload, conn.decoder)
                except TimeoutError:
                    if not soft_sent:
                        soft_sent = True
                        self.zygote.signal(self.pid, P.SOFT_TIMEOUT_SIGNAL)
                        deadline = time.monotonic() + grace
                        continue
                    self.kill({"why": f"killed after its {timeout:g} s timeout", "counts": False})
                    raise DeadlinePassed from None
                except (EOFError, OSError):
                    raise WorkerGone from None
                if kind == P.RESULT:
                    if reply[1] == P.TIMED_OUT and not soft_sent and not self.interrupted:
                        raise P.ProtocolViolation("it reported a timeout nobody signalled")
                    if conn.pending():
                        raise P.ProtocolViolation("it sent more after its RESULT")
                    if spin is not None:
                        spin.answered(sent, time.monotonic(), caught)
                    return reply
                if kind == P.READY:
                    self.ready = True
                    if self.interrupted and not soft_sent:   # interrupt() came before READY
                        self.zygote.signal(self.pid, P.SOFT_TIMEOUT_SIGNAL)
                    self.report = reply.report
                    self.on_ready(self)
                    continue
                t0 = time.monotonic()             # a REQUEST
                objects.deadline = None if deadline is None else deadline + (0 if soft_sent else grace)
                answer = objects.handle(reply, conn.decoder.saw_ref)
                if conn.broken:                   # during a callback into the tool
                    raise P.ProtocolViolation(conn.broken)
                try:
                    try:
                        conn.send(P.REPLY, answer, objects.deadline)
                    except P.PayloadError as exc:
                        conn.send(P.REPLY, (False, ["TypeError", [f"the host's answer cannot be sent: {exc}"]]),
                                  objects.deadline)
                except TimeoutError:
                    raise P.ProtocolViolation(conn.broken) from None
                except OSError:
                    pass
                waited = time.monotonic() - t0
                if deadline is not None and waited >= HOST_WAIT_PAUSES_S:
                    # Waiting for the host (a person confirming, an LLM generating) does not
                    # count; a flood of quick requests does, or it could stretch the deadline.
                    deadline += waited
        finally:
            calls_in_flight.leave(token)
            objects.release()
