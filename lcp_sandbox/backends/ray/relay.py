"""The relay of a call's REQUESTs between a node's agent and the driver (the Ray backend).

On a node, the local Supervisor runs the call as it would on one machine, with a
:class:`Relay` where a HostObjects would be.  Each REQUEST of the worker goes to the
driver, whose real HostObjects serves it on the thread waiting for the call:

    node: WorkerProcess.exchange ── Relay.handle(req) ──┐   driver: RaySupervisor.run
            (worker frame decoded and checked here)     │           (the caller's thread)
                                                        │ events stream
          Relay: REQUEST re-encoded (protocol.Encoder) ─┴─(cid,"req",frame)─►
                                        parse_from_worker (Decoder), HostObjects.handle(req)
          ◄─ agent.reply(cid, ("answer", (ok, value), broken, sends)) ─┘
          exchange sends the REPLY to the worker

A callback into the tool (the host calls a callable the tool lent) runs while the
driver serves a REQUEST: the driver's HostObjects gets a :class:`RemoteConn` as its
``conn``.  Its ``send`` keeps host-made frames (pickled there, as Connection.send);
its ``recv_frame`` ships them with the caps to the agent (``"xfer"``), which writes
them to the worker and reads the worker's next frame with the call's deadline and
those caps, and sends the raw frame back (``"frame"``) or what went wrong
(``"frame_error"``: timeout, eof, violation).  The driver decodes it with its own
Decoder: nothing a worker sent reaches the driver other than as protocol bytes.
A violation the driver finds (``conn.broken``) goes back with the answer and the
agent's exchange treats it as its own: the worker is killed, the call gets 500.

The driver's end of a call is a :class:`DriverCall`: a queue that the node's events
(dispatched by nodes.py) and the agent's answer (``when_done``) fill, and that the thread
waiting for the call reads.

What crosses Ray is plain: ints, strs, bytes, the host-made protocol messages and
Init (driver to node), and the result dicts of sandbox events (built by the
node's supervisor, our code).  A call's value comes back as Encoder bytes too.
"""
from __future__ import annotations

import queue
import struct
import threading
import time
from typing import Any, Callable, Optional, overload

from ... import protocol as P
from ...core.outcomes import Unavailable

# Tags of the driver's messages to a call on a node (agent.reply(cid, message)).
INIT, ANSWER, XFER, ABORT = "init", "answer", "xfer", "abort"
# Tags of the node's messages about a call (events stream items: (cid, tag, ...)).
NEED_INIT, REQUEST, FRAME, FRAME_ERROR, EVENT = "need_init", "req", "frame", "frame_error", "event"
# How a call ends (agent.run's answer: tag, calls, starts, then the value as Encoder bytes).
VALUE, SANDBOX_EVENT, RAISED = 0, 1, 2
_OUTCOME = struct.Struct("!BQQ")
#: The driver's own guard past the node's deadline, for a node that stopped answering.
DRIVER_SLACK_S = 30.0
# The item that ends a call's queue in the driver: (DONE, the agent's answer or Ray's error).
DONE = "done"


def _unsendable(value: Any) -> Any:
    raise P.Unsendable(f"{type(value).__name__} is not a protocol value")


def pack_outcome(tag: int, value: Any, calls: int, starts: int) -> bytes:
    """On a node: how a call ended.  ``value`` (decoded from a worker into plain
    types, or a sandbox event's result dict, or an error as it travels) goes as
    protocol bytes again; P.Unsendable if it cannot."""
    return _OUTCOME.pack(tag, calls, starts) + P.Encoder(_unsendable).encode(P.RESULT, [value])


def unpack_outcome(data: bytes) -> tuple:
    """In the driver: (tag, value, calls, starts), the value decoded into plain types
    by the protocol's Decoder; BadMessage when malformed."""
    if type(data) is not bytes or len(data) < _OUTCOME.size + P.HEADER.size:
        raise P.BadMessage("a malformed outcome from a node")
    tag, calls, starts = _OUTCOME.unpack_from(data)
    fields = P.Decoder().decode(memoryview(data)[_OUTCOME.size + P.HEADER.size:])
    if type(fields) is not list or len(fields) != 1:
        raise P.BadMessage("a relayed value that is not one field")
    return tag, fields[0], calls, starts


class HostGone(Exception):
    """The driver gave up on the call (it failed while serving a request)."""


# ---------------------------------------------------------------- node side
class Relay:
    """On a node: stands in for the call's HostObjects (the interface exchange() uses:
    ``handle``, ``conn``, ``deadline``, ``release``), relaying to the driver.

    ``emit(item)`` puts an item on the agent's events stream; the driver's answers
    arrive in ``inbox`` (filled by the agent's ``reply`` method)."""

    __slots__ = ("cid", "emit", "inbox", "conn", "deadline")

    def __init__(self, cid: int, emit: Callable[[tuple], None]) -> None:
        self.cid = cid
        self.emit = emit
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.conn: Optional[P.Connection] = None
        self.deadline: Optional[float] = None

    def init(self) -> P.Init:
        """A worker must start: the driver builds its Init (spec.init runs there)."""
        self.emit((self.cid, NEED_INIT))
        tag, *fields = self._next()
        if tag == INIT and fields and type(fields[0]) is P.Init:
            return fields[0]
        said = fields[0] if fields else "nothing"
        raise Unavailable(f"a worker could not be started: the host could not say how ({said}).")

    def handle(self, req: P.Request, saw_ref: bool) -> tuple:
        """One REQUEST of the worker, served by the driver; returns the REPLY fields."""
        try:
            frame = P.Encoder(_unsendable).encode(P.REQUEST, list(req))
        except P.Unsendable as exc:
            raise P.BadMessage(f"a request that cannot be relayed ({exc})") from None
        remaining = None if self.deadline is None else self.deadline - time.monotonic()
        self.emit((self.cid, REQUEST, frame, remaining))
        while True:
            tag, *fields = self._next()
            if tag == ANSWER:
                answer, broken, sends = fields
                self._write(sends)
                if broken and self.conn is not None:
                    self.conn.broken = self.conn.broken or broken
                return answer
            if tag == XFER:
                sends, caps = fields
                self._xfer(sends, caps)
                continue
            raise HostGone(str(fields[0]) if fields else "the host gave up on the call")

    def _next(self) -> tuple:
        msg = self.inbox.get()
        return msg if type(msg) is tuple and msg else (ABORT, "a malformed message from the host")

    def _write(self, sends: list) -> bool:
        conn = self.conn
        # The call is over: no worker to write to.
        if conn is None:
            return not sends
        try:
            for kind, body in sends:
                conn.send_frame(kind, body, self.deadline)
        # The worker stopped reading: the connection is broken.
        except TimeoutError:
            return False
        except OSError:
            return False
        return True

    def _xfer(self, sends: list, caps: dict) -> None:
        """The driver called back into the tool: write its frames, read the worker's next."""
        conn = self.conn
        if conn is None:
            self.emit((self.cid, FRAME_ERROR, "eof", "the call is over"))
            return
        self._write(sends)
        try:
            kind, payload = conn.recv_frame(self.deadline, caps)
        except TimeoutError:
            self.emit((self.cid, FRAME_ERROR, "timeout", ""))
        except P.BadMessage as exc:
            self.emit((self.cid, FRAME_ERROR, "violation", str(exc)))
        except (EOFError, OSError):
            self.emit((self.cid, FRAME_ERROR, "eof", ""))
        else:
            self.emit((self.cid, FRAME, kind, bytes(payload)))

    def release(self) -> None:
        self.conn = None


# ---------------------------------------------------------------- driver side
class RemoteConn:
    """In the driver: the worker's connection as the call's HostObjects sees it
    (``send``, ``recv_frame``, ``decoder``, ``broken``), through the node's agent."""

    __slots__ = ("_call", "_sends", "decoder", "broken")

    def __init__(self, call: Any) -> None:
        # The driver's call: reply(message), wait(timeout) -> item.
        self._call = call
        self._sends: list = []
        self.decoder = P.Decoder()
        self.broken: Optional[str] = None

    def send(self, kind: int, msg: tuple = (), deadline: Optional[float] = None) -> int:
        # Shipped with the next read; the agent writes it by the call's deadline.
        # PayloadError, as Connection.send.
        body = P.dumps(msg) if msg else b""
        self._sends.append((kind, body))
        return len(body)

    def take_sends(self) -> list:
        sends, self._sends = self._sends, []
        return sends

    def recv_frame(self, deadline: Optional[float] = None, caps: Optional[dict] = None) -> tuple:
        if self.broken:
            raise P.BadMessage(self.broken)
        self._call.reply((XFER, self.take_sends(), caps))
        if deadline is None:
            timeout = None
        else:
            timeout = max(0.0, deadline - time.monotonic()) + DRIVER_SLACK_S
        item = self._call.wait(timeout)
        if item is None:
            raise TimeoutError
        if item[1] == FRAME:
            return item[2], item[3]
        if item[1] == FRAME_ERROR:
            what, text = item[2], item[3]
            if what == "timeout":
                raise TimeoutError
            if what == "violation":
                self.broken = self.broken or text
                raise P.BadMessage(text)
        raise EOFError("the worker's node stopped relaying")


def when_done(ref: Any, callback: Callable[[Any], None]) -> None:
    """``callback(value or exception)`` once ``ref`` is ready.  Ray's ObjectRef._on_completed
    (what Ray Serve uses) wakes the waiting thread once, as ray.get does; ``future()``
    is the public way, a little slower."""
    on_completed = getattr(ref, "_on_completed", None)
    if on_completed is not None:
        on_completed(callback)
        return

    def done(f: Any) -> None:
        exc = f.exception()
        callback(exc if exc is not None else f.result())
    ref.future().add_done_callback(done)


class DriverCall:
    """The driver's end of one call in flight: what the node (a nodes.Node) sends about it
    lands in ``q``; ``thread``: the host thread waiting for it (made in that thread), for
    interrupt()."""
    __slots__ = ("cid", "node", "q", "done", "thread")

    def __init__(self, cid: int, node: Any) -> None:
        self.cid, self.node = cid, node
        self.thread = threading.get_ident()
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.done: Optional[tuple] = None

    def finished(self, result: Any) -> None:
        """The agent's answer (bytes), or the exception Ray raised for it."""
        self.q.put((DONE, result))

    def reply(self, message: tuple) -> None:
        self.node.agent.reply.remote(self.cid, message)

    @overload
    def wait(self, timeout: None) -> tuple: ...
    @overload
    def wait(self, timeout: float) -> Optional[tuple]: ...

    def wait(self, timeout: Optional[float]) -> Optional[tuple]:
        """The next item about the call (the last one again once it is done); None
        when ``timeout`` passed first."""
        if self.done is not None:
            return self.done
        try:
            item = self.q.get(timeout=timeout)
        except queue.Empty:
            return None
        if item[0] == DONE:
            self.done = item
        return item
