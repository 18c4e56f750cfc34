"""Host objects across the process boundary.

Handlers (confirm, user interaction), callables in a library's host config,
and host objects a tool declares (``lollms_client_instance``,
``discussion_instance``, non-plain parts of ``tool_context``) stay in the
host.  The worker gets a :class:`Proxy`; using it sends a REQUEST over the
pipe of the call in flight, the host thread waiting for that call runs the
operation and sends the REPLY back.

    worker: proxy.generate_text("hi")                      host: HostObjects
      └─ REQUEST(OP_METHOD, ref, "generate_text", args) ──►  resolve(ref).generate_text("hi")
      ◄─ REPLY(ok, plain value | Ref(new id) | error) ─────┘

Plain values (None, bool, numbers, str, bytes and lists / tuples / dicts of
those) travel by value; anything else becomes a further proxy.  Per-call
refs are integers released when the call ends; named refs ("confirm",
"ui", ("cfg", stem, key)) stay valid for the life of the worker but can
only be used while a call is in flight (nobody listens otherwise).
"""
from __future__ import annotations

import builtins
import operator
import os
import threading
from typing import Any, Callable, Optional

from . import wire

_SCALARS = (type(None), bool, int, float, complex, str, bytes)
# Protocols a proxy forwards to the host object (comparisons with enums, Path(proxy)...).
OPERATORS = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
             "gt": operator.gt, "ge": operator.ge, "hash": hash, "fspath": os.fspath}


class Ref:
    """A reference to a host object, as it travels on the wire."""
    __slots__ = ("id",)

    def __init__(self, id: Any) -> None:
        self.id = id

    def __reduce__(self):
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id!r})"


class WorkerRef(Ref):
    """A reference to a worker-side callable the tool passed to a host method
    (a streaming callback, say): calling it in the host runs it in the tool."""

    def __reduce__(self):
        return (WorkerRef, (self.id,))


def is_plain(value: Any, depth: int = 0) -> bool:
    if isinstance(value, _SCALARS):
        return True
    if depth > 32:
        return False
    if type(value) in (list, tuple):
        return all(is_plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(isinstance(k, _SCALARS) and is_plain(v, depth + 1) for k, v in value.items())
    return False


def error_reply(exc: BaseException) -> tuple:
    """How an exception travels: its type name and its args (or its text)."""
    args = exc.args
    if isinstance(exc, OSError) and exc.filename is not None:
        args = (exc.errno, exc.strerror, exc.filename)      # the filename is not in args
    if not is_plain(args):
        args = (str(exc),)
    return (wire.REPLY, False, (type(exc).__name__, args))


def _exchange(conn: wire.Connection, request: tuple, serve: Callable[[tuple], tuple]) -> Any:
    """Send a REQUEST and wait for its REPLY, serving the peer's own REQUESTs
    (callbacks) meanwhile.  Returns the value or raises the peer's error."""
    conn.send(request)
    while True:
        msg = conn.recv()
        if msg[0] == wire.REPLY:
            _, ok, value = msg
            if not ok:
                raise rebuild_error(*value)
            return value
        if msg[0] == wire.REQUEST:
            try:
                conn.send(serve(msg))
            except wire.PayloadError as exc:
                conn.send(error_reply(TypeError(f"the answer cannot be sent: {exc}")))
        else:
            raise RuntimeError(f"unexpected message {msg[0]} while waiting for a reply")


# ---------------------------------------------------------------- host side
class HostObjects:
    """The objects one call has lent to its worker, and the named ones.

    One per call: ``release()`` at the end of the call drops every lent object."""

    __slots__ = ("_named", "_objects", "conn")

    def __init__(self, named: Callable[[Any], Any]) -> None:
        self._named = named            # resolves a named ref (handlers, config callables)
        self._objects: dict[int, Any] = {}
        self.conn: Optional[wire.Connection] = None   # set while the call runs (callbacks)

    def lend(self, value: Any) -> Any:
        """Plain values by value; dicts, lists and tuples as such with their other
        items lent; any other object as a Ref the worker turns into a Proxy."""
        if is_plain(value):
            return value
        t = type(value)
        if t is dict:
            return {k: self.lend(v) for k, v in value.items()}
        if t is list or t is tuple:
            return t(self.lend(v) for v in value)
        oid = len(self._objects) + 1
        self._objects[oid] = value
        return Ref(oid)


    def _resolve(self, ref: Any) -> Any:
        if isinstance(ref, int):
            try:
                return self._objects[ref]
            except KeyError:
                raise RuntimeError("host object is no longer available") from None
        return self._named(ref)

    def _unwrap(self, value: Any) -> Any:
        t = type(value)
        if t is Ref:
            return self._resolve(value.id)
        if t is WorkerRef:
            return _ToolCallable(self, value.id)
        if t is list or t is tuple:
            return t(self._unwrap(v) for v in value)
        if t is dict:
            return {k: self._unwrap(v) for k, v in value.items()}
        return value

    def handle(self, msg: tuple) -> tuple:
        """Run one REQUEST from the worker; returns the REPLY message."""
        _, op, ref, name, args, kwargs = msg
        try:
            target = self._resolve(ref)
            args = self._unwrap(args)
            kwargs = self._unwrap(kwargs)
            if op == wire.OP_CALL:
                if target is None:
                    raise RuntimeError("no handler is configured in the host")
                value = target(*args, **kwargs)
            elif op == wire.OP_GETATTR:
                value = getattr(target, name)
            elif op == wire.OP_METHOD:
                value = getattr(target, name)(*args, **kwargs)
            elif op == wire.OP_SETATTR:
                setattr(target, name, args[0])
                value = None
            elif op == wire.OP_TRUTH:
                value = bool(target)
            elif op == wire.OP_LIST:
                value = list(target)
            elif op == wire.OP_OPERATOR:
                value = OPERATORS[name](target, *args)
            else:
                raise RuntimeError(f"unknown request op {op}")
            return (wire.REPLY, True, self.lend(value))
        except BaseException as exc:  # the host must survive anything a handler does
            return error_reply(exc)

    def call_tool_callable(self, wid: int, args: tuple, kwargs: dict) -> Any:
        if self.conn is None:
            raise RuntimeError("the tool's callable can only be called while its call is running")
        value = _exchange(self.conn, (wire.REQUEST, wire.OP_CALL, wid, None, self.lend(args),
                                      self.lend(kwargs)), self.handle)
        return self._unwrap(value)

    def release(self) -> None:
        self._objects.clear()
        self.conn = None


class _ToolCallable:
    """In the host: a callable of the tool's (e.g. a streaming callback)."""
    __slots__ = ("_objects", "_id")

    def __init__(self, objects: HostObjects, wid: int) -> None:
        self._objects, self._id = objects, wid

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._objects.call_tool_callable(self._id, args, kwargs)


# -------------------------------------------------------------- worker side
class Channel:
    """The worker's end: sends REQUESTs while a call is in flight.

    Tools may use proxies from several threads: requests are serialized (an
    RLock, since a callback the host runs in the tool may use proxies too)."""

    def __init__(self, conn: wire.Connection) -> None:
        self.conn = conn
        self.call_seq = 0        # increases per call; per-call proxies remember theirs
        self.in_call = False
        self.waiting_host = False
        self._lock = threading.RLock()
        self._lent: dict[int, Any] = {}   # tool callables the host may call back

    def request(self, op: int, ref: Any, name: Optional[str], args: tuple, kwargs: dict,
                seq: Optional[int]) -> Any:
        with self._lock:
            if not self.in_call:
                raise RuntimeError("host objects and handlers can only be used while a tool call "
                                   "is running (the host is not listening now)")
            if seq is not None and seq != self.call_seq:
                raise RuntimeError("this host object belonged to an earlier tool call and was released")
            self.waiting_host = True
            try:
                value = _exchange(self.conn, (wire.REQUEST, op, ref, name, self._out(args),
                                              self._out(kwargs)), self._serve)
            finally:
                self.waiting_host = False
            return self.wrap(value)

    def _out(self, value: Any) -> Any:
        """Arguments for the host: proxies back to their refs, tool callables lent."""
        t = type(value)
        if t is Proxy:
            return Ref(value._ref)
        if t is list or t is tuple:
            return t(self._out(v) for v in value)
        if t is dict:
            return {k: self._out(v) for k, v in value.items()}
        if callable(value) and not isinstance(value, type) and not is_plain(value):
            wid = len(self._lent) + 1
            self._lent[wid] = value
            return WorkerRef(wid)
        return value

    def _serve(self, msg: tuple) -> tuple:
        """The host calls back a callable the tool gave it."""
        _, op, wid, _, args, kwargs = msg
        try:
            fn = self._lent[wid]
            value = fn(*self.wrap(args), **self.wrap(kwargs))
            return (wire.REPLY, True, self._out(value))
        except BaseException as exc:
            return error_reply(exc)

    def end_call(self) -> None:
        self.in_call = False
        self._lent.clear()

    def wrap(self, value: Any) -> Any:
        t = type(value)
        if t is Ref:
            return Proxy(self, value.id, self.call_seq if isinstance(value.id, int) else None)
        if t is list or t is tuple:
            return t(self.wrap(v) for v in value)
        if t is dict:
            return {k: self.wrap(v) for k, v in value.items()}
        return value



_error_classes: dict[str, type] = {}


def rebuild_error(type_name: str, args: Any) -> BaseException:
    """The peer's exception, as the same builtin type or a class of the same name."""
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    cls = getattr(builtins, type_name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(*args)
        except Exception:
            pass
    cls = _error_classes.get(type_name)
    if cls is None:
        cls = _error_classes[type_name] = type(type_name, (Exception,), {"__module__": "host"})
    return cls(*args)


class Proxy:
    """Stands for a host object inside a worker; every use is a round trip to the host."""
    __slots__ = ("_ch", "_ref", "_seq")

    def __init__(self, channel: Channel, ref: Any, seq: Optional[int]) -> None:
        object.__setattr__(self, "_ch", channel)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_seq", seq)

    def _req(self, op: int, name: Optional[str] = None, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        return self._ch.request(op, self._ref, name, args, kwargs or {}, self._seq)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._req(wire.OP_CALL, None, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._req(wire.OP_GETATTR, name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._req(wire.OP_SETATTR, name, (value,))

    def __getitem__(self, key: Any) -> Any:
        return self._req(wire.OP_METHOD, "__getitem__", (key,))

    def __setitem__(self, key: Any, value: Any) -> None:
        self._req(wire.OP_METHOD, "__setitem__", (key, value))

    def __contains__(self, key: Any) -> bool:
        return self._req(wire.OP_METHOD, "__contains__", (key,))

    def __len__(self) -> int:
        return self._req(wire.OP_METHOD, "__len__")

    def __bool__(self) -> bool:
        return self._req(wire.OP_TRUTH)

    def __iter__(self):
        # One round trip: the host lists the object; items come back by value or as proxies.
        return iter(self._req(wire.OP_LIST))

    def __str__(self) -> str:
        return self._req(wire.OP_METHOD, "__str__")

    def __hash__(self) -> int:
        return self._req(wire.OP_OPERATOR, "hash")

    def __fspath__(self) -> Any:
        return self._req(wire.OP_OPERATOR, "fspath")

    def __repr__(self) -> str:
        return f"<host proxy {self._req(wire.OP_METHOD, '__repr__')}>"

    def __reduce__(self):
        return (Ref, (self._ref,))


def _comparison(op: str) -> Callable[[Proxy, Any], Any]:
    def compare(self: Proxy, other: Any) -> Any:
        return self._req(wire.OP_OPERATOR, op, (other,))
    compare.__name__ = f"__{op}__"
    return compare


for _op in ("eq", "ne", "lt", "le", "gt", "ge"):      # run in the host, as OPERATORS
    setattr(Proxy, f"__{_op}__", _comparison(_op))

