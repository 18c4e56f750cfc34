"""Host objects across the process boundary: the worker's half.

A tool gets a :class:`Proxy` for each host object lent to its call (the
handlers, a ``lollms_client_instance``...).  Using it sends a REQUEST over
the connection of the call in flight and waits for the REPLY; the host's
half (binding/objects.py) runs the operation.  Callables the tool passes to a
host method are lent the other way: the host calls them with a REQUEST of
its own, served here (:meth:`Channel._serve`) while the tool waits.

    tool: proxy.generate_text("hi", callback=cb)
      Channel.request ── REQUEST(OP_METHOD, ref, "generate_text", ["hi"], {cb: WorkerRef}) ──► host
                      ◄─ REQUEST(OP_CALL, WorkerRef id, chunk) ── host calls cb
      _serve: cb(chunk) ── REPLY ──────────────────────────────────────────────────────────► host
                      ◄─ REPLY(ok, value | Ref | error) ────────────────────────────────── host
"""
from __future__ import annotations

import signal
import threading
from typing import Any, Callable, Optional

from .. import protocol as P
from ..protocol import Ref, WorkerRef, error_value, map_containers, rebuild_error


class Channel:
    """The worker's end: sends REQUESTs while a call is in flight.

    Tools may use proxies from several threads: requests are serialized (an
    RLock, since a callback the host runs in the tool may use proxies too)."""

    def __init__(self, conn: Optional[P.Connection], describe: Callable[[Any], Any]) -> None:
        self.conn = conn
        # Increases per call; per-call proxies remember theirs.
        self.call_seq = 0
        self.in_call = False
        self.waiting_host = False
        # The soft-timeout signal came while the host was asked.
        self.interrupt_pending = False
        self._lock = threading.RLock()
        # Tool callables the host may call back.
        self._lent: dict[int, Any] = {}
        # What to send for an object the protocol cannot carry.
        self._describe = describe
        self.encoder = P.Encoder(self._convert)

    def _convert(self, value: Any) -> Any:
        if type(value) is Proxy:
            return Ref(value._ref)
        if callable(value) and not isinstance(value, type):
            wid = len(self._lent) + 1
            self._lent[wid] = value
            return WorkerRef(wid)
        return self._describe(value)

    def request(self, op: int, ref: Any, name: Optional[str], args: tuple, kwargs: dict,
                seq: Optional[int]) -> Any:
        with self._lock:
            conn = self.conn
            if not self.in_call or conn is None:
                raise RuntimeError("host objects and handlers can only be used while a tool call "
                                   "is running (the host is not listening now)")
            if seq is not None and seq != self.call_seq:
                raise RuntimeError("this host object belonged to an earlier tool call and was "
                                   "released")
            self.waiting_host = True
            try:
                try:
                    frame = self.encoder.encode(P.REQUEST, [op, ref, name, list(args), kwargs])
                except P.Unsendable as exc:
                    raise TypeError(f"the arguments cannot be sent to the host: {exc}") from None
                conn.send_encoded(frame)
                while True:
                    kind, payload = conn.recv_frame()
                    msg = P.loads_from_host(kind, payload)
                    if kind == P.REPLY:
                        break
                    # The host calls a callable the tool lent.
                    self._serve(conn, msg)
            finally:
                self.waiting_host = False
                # Deferred: the tool is interrupted now it is back.
                if self.interrupt_pending:
                    self.interrupt_pending = False
                    signal.raise_signal(P.SOFT_TIMEOUT_SIGNAL)
            if not msg.ok:
                raise rebuild_error(*msg.value)
            return self.wrap(msg.value)

    def _serve(self, conn: P.Connection, msg: P.Request) -> None:
        try:
            fn = self._lent[msg.ref]
            fields = [True, fn(*self.wrap(msg.args), **self.wrap(msg.kwargs))]
            frame = self.encoder.encode(P.REPLY, fields)
        except BaseException as exc:
            frame = self.encoder.encode(P.REPLY, [False, error_value(exc)])
        conn.send_encoded(frame)

    def end_call(self) -> None:
        self.in_call = False
        self.interrupt_pending = False
        self._lent.clear()

    def wrap(self, value: Any) -> Any:
        """Values from the host with their refs turned into proxies."""
        def one(v: Any) -> Any:
            if type(v) is Ref:
                return Proxy(self, v.id, self.call_seq if type(v.id) is int else None)
            return v
        return map_containers(value, one)


class Proxy:
    """Stands for a host object inside a worker; every use is a round trip to the host."""
    __slots__ = ("_ch", "_ref", "_seq")

    def __init__(self, channel: Channel, ref: Any, seq: Optional[int]) -> None:
        object.__setattr__(self, "_ch", channel)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_seq", seq)

    def _req(self, op: int, name: Optional[str] = None, args: tuple = (),
             kwargs: Optional[dict] = None) -> Any:
        return self._ch.request(op, self._ref, name, args, kwargs or {}, self._seq)

    def _op(self, name: str, *args: Any) -> Any:
        return self._req(P.OP_OPERATOR, name, args)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._req(P.OP_CALL, None, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._req(P.OP_GETATTR, name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._req(P.OP_SETATTR, name, (value,))

    def __getitem__(self, key: Any) -> Any:
        return self._op("getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._op("setitem", key, value)

    def __contains__(self, key: Any) -> bool:
        return self._op("contains", key)

    def __len__(self) -> int:
        return self._op("len")

    def __bool__(self) -> bool:
        return self._req(P.OP_TRUTH)

    def __iter__(self):
        # One round trip: the host lists the object; items come back by value or as proxies.
        return iter(self._req(P.OP_LIST))

    def __str__(self) -> str:
        return self._op("str")

    def __hash__(self) -> int:
        return self._op("hash")

    def __fspath__(self) -> Any:
        return self._op("fspath")

    def __repr__(self) -> str:
        return f"<host proxy {self._op('repr')}>"

    def __reduce__(self):
        return (Ref, (self._ref,))


def _comparison(op: str) -> Callable[[Proxy, Any], Any]:
    def compare(self: Proxy, other: Any) -> Any:
        return self._op(op, other)
    compare.__name__ = f"__{op}__"
    return compare


# Run in the host, as OPERATORS.
for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(Proxy, f"__{_op}__", _comparison(_op))
