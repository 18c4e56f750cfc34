"""Host objects across the process boundary.

Handlers (confirm, user interaction), callables in a library's host config,
and host objects a tool declares (``lollms_client_instance``,
``discussion_instance``, non-plain parts of ``tool_context``) stay in the
host.  The worker gets a :class:`Proxy`; using it sends a REQUEST over the
connection of the call in flight, the host thread waiting for that call runs
the operation and sends the REPLY back.

    worker: proxy.generate_text("hi")                      host: HostObjects
      └─ REQUEST(OP_METHOD, ref, "generate_text", args) ──►  lent[ref].generate_text("hi")
      ◄─ REPLY(ok, plain value | Ref(new id) | error) ─────┘

Plain values (None, bool, numbers, str, bytes and lists / tuples / dicts of
those) travel by value; anything else becomes a further proxy.

What a worker can reach (it is hostile; see protocol.py for what it can send):
per-call integer refs to what the host lent for this call, released when the
call ends; the confirm / user-interaction handler by name, only when one is
set; callables of its own library's ``host_tool_configs``.  Through them,
public attributes and methods only (no name starting with ``_``; operators go
through a fixed table), and never a module, a class, a module function of C (``os.system``, ``eval``), or
interpreter internals (frames, code, cells, descriptors).  Functions the host
exposes as public attributes (a progress callback in ``tool_context``) can be
called; their internals are dunder attributes, out of reach.
"""
from __future__ import annotations

import builtins
import operator
import os
import signal
import threading
import types
from typing import Any, Callable, Optional

from . import protocol as P
from .protocol import Ref, WorkerRef

_SCALARS = (type(None), bool, int, float, complex, str, bytes)
# Operations a proxy forwards by name (never a getattr of a dunder).
OPERATORS: dict[str, Callable] = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
    "gt": operator.gt, "ge": operator.ge, "hash": hash, "fspath": os.fspath, "len": len,
    "getitem": operator.getitem, "setitem": operator.setitem, "contains": operator.contains,
    "str": str, "repr": repr,
}
_INTERNALS = (types.ModuleType, type, types.FrameType, types.CodeType, types.TracebackType,
              types.CellType, types.MappingProxyType, types.GetSetDescriptorType,
              types.MemberDescriptorType, types.WrapperDescriptorType, types.MethodDescriptorType,
              staticmethod, classmethod, property)


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


def map_containers(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with every item of its (nested) dicts, lists and tuples passed
    through ``leaf``; the containers are rebuilt as the same builtin types."""
    t = type(value)
    if t is dict:
        return {k: map_containers(v, leaf) for k, v in value.items()}
    if t is list or t is tuple:
        return t(map_containers(v, leaf) for v in value)
    return leaf(value)


def error_value(exc: BaseException) -> list:
    """How an exception travels: [type name, args] (its text when args are not plain)."""
    args = exc.args
    if isinstance(exc, OSError) and exc.filename is not None:
        args = (exc.errno, exc.strerror, exc.filename)      # the filename is not in args
    if not is_plain(args):
        args = (str(exc),)
    return [type(exc).__name__, list(args)]


def _refused(value: Any) -> Optional[str]:
    """Why ``value`` may not be handed to a worker, or None."""
    if isinstance(value, _INTERNALS):
        return type(value).__name__
    if isinstance(value, types.BuiltinFunctionType) and isinstance(value.__self__, types.ModuleType):
        return "module-level builtin function"      # os.system, eval, open...
    return None


# ---------------------------------------------------------------- host side
class HostObjects:
    """The objects one call has lent to its worker, and the named ones.

    One per call: ``release()`` at the end of the call drops every lent object."""

    __slots__ = ("_named", "_objects", "conn", "deadline")

    def __init__(self, named: Callable[[Any], Any]) -> None:
        self._named = named            # resolves a named ref (handlers, the library's config callables)
        self._objects: dict[int, Any] = {}
        self.conn: Optional[P.Connection] = None   # set while the call runs (callbacks)
        self.deadline: Optional[float] = None      # for a callback into the tool

    def lend(self, value: Any) -> Any:
        """What the host chose to lend at the start of a call: plain values by
        value; dicts, lists and tuples as such with their other items lent; any
        other object as a Ref the worker turns into a Proxy."""
        return value if is_plain(value) else map_containers(value, self._lend_one)

    def _lend_one(self, value: Any) -> Any:
        if is_plain(value):
            return value
        oid = len(self._objects) + 1
        self._objects[oid] = value
        return Ref(oid)

    def _give(self, value: Any) -> Any:
        """What a worker's request produced: as lend, minus what it may not have."""
        def one(v: Any) -> Any:
            why = _refused(v)
            if why is not None:
                raise PermissionError(f"a {why} is not handed to a tool through a host proxy")
            return self._lend_one(v)
        return value if is_plain(value) else map_containers(value, one)

    def _resolve(self, ref: Any) -> Any:
        if type(ref) is int:
            try:
                return self._objects[ref]
            except KeyError:
                raise RuntimeError("host object is no longer available") from None
        return self._named(ref)

    def unwrap(self, value: Any) -> Any:
        """A worker's value with its refs turned back into the host's objects."""
        def one(v: Any) -> Any:
            t = type(v)
            if t is Ref:
                return self._resolve(v.id)
            if t is WorkerRef:
                return _ToolCallable(self, v.id)
            return v
        return map_containers(value, one)

    def handle(self, req: P.Request, saw_ref: bool) -> tuple:
        """Run one REQUEST from the worker; returns the REPLY fields (ok, value)."""
        op, name = req.op, req.name
        try:
            target = self._resolve(req.ref)
            args, kwargs = (self.unwrap(req.args), self.unwrap(req.kwargs)) if saw_ref else (req.args, req.kwargs)
            if op in (P.OP_GETATTR, P.OP_METHOD, P.OP_SETATTR) and (not name or name.startswith("_")):
                raise AttributeError(f"{name!r}: private attributes are not reachable through a host proxy")
            if op == P.OP_CALL:
                if target is None:
                    raise RuntimeError("no handler is configured in the host")
                value = target(*args, **kwargs)
            elif target is None:
                raise RuntimeError("no such host object")
            elif op == P.OP_GETATTR:
                value = getattr(target, name)
            elif op == P.OP_METHOD:
                method = getattr(target, name)
                why = _refused(method)
                if why is not None:
                    raise PermissionError(f"a {why} is not called for a tool through a host proxy")
                value = method(*args, **kwargs)
            elif op == P.OP_SETATTR:
                setattr(target, name, args[0])
                value = None
            elif op == P.OP_TRUTH:
                value = bool(target)
            elif op == P.OP_LIST:
                value = list(target)
            else:                                   # OP_OPERATOR
                fn = OPERATORS.get(name)
                if fn is None:
                    raise AttributeError(f"{name!r} is not an operator a host proxy forwards")
                value = fn(target, *args)
            return True, self._give(value)
        except BaseException as exc:  # the host must survive anything a handler does
            return False, error_value(exc)

    def call_tool_callable(self, wid: int, args: tuple, kwargs: dict) -> Any:
        """Run a callable the tool lent (it runs in the worker); the worker's
        REQUESTs meanwhile are served here.  A worker that breaks the protocol
        marks the connection broken: the supervisor kills it after this call."""
        conn = self.conn
        if conn is None:
            raise RuntimeError("the tool's callable can only be called while its call is running")
        conn.send(P.REQUEST, (P.OP_CALL, wid, None, self.lend(args), self.lend(kwargs)))
        caps = {P.REPLY: P.REQUEST_CAP, P.REQUEST: P.REQUEST_CAP}
        try:
            while True:
                kind, payload = conn.recv_frame(self.deadline, caps)
                msg = P.parse_from_worker(kind, payload, conn.decoder)
                saw_ref = conn.decoder.saw_ref
                if kind == P.REPLY:
                    if not msg.ok:
                        raise rebuild_error(*msg.value)
                    return self.unwrap(msg.value) if saw_ref else msg.value
                conn.send(P.REPLY, self.handle(msg, saw_ref))
        except P.ProtocolViolation as exc:
            conn.broken = conn.broken or str(exc)
            raise
        except TimeoutError:
            conn.broken = "a callable of the tool did not answer before the call's deadline"
            raise P.ProtocolViolation(conn.broken) from None
        except EOFError:
            conn.broken = "the worker went away while the host called back into the tool"
            raise P.ProtocolViolation(conn.broken) from None

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


# -------------------------------------------------------------- worker side
class Channel:
    """The worker's end: sends REQUESTs while a call is in flight.

    Tools may use proxies from several threads: requests are serialized (an
    RLock, since a callback the host runs in the tool may use proxies too)."""

    def __init__(self, conn: Optional[P.Connection], describe: Callable[[Any], Any]) -> None:
        self.conn = conn
        self.call_seq = 0        # increases per call; per-call proxies remember theirs
        self.in_call = False
        self.waiting_host = False
        self.interrupt_pending = False   # the soft-timeout signal came while the host was asked
        self._lock = threading.RLock()
        self._lent: dict[int, Any] = {}   # tool callables the host may call back
        self._describe = describe         # what to send for an object the protocol cannot carry
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
            if not self.in_call:
                raise RuntimeError("host objects and handlers can only be used while a tool call "
                                   "is running (the host is not listening now)")
            if seq is not None and seq != self.call_seq:
                raise RuntimeError("this host object belonged to an earlier tool call and was released")
            self.waiting_host = True
            try:
                try:
                    frame = self.encoder.encode(P.REQUEST, [op, ref, name, list(args), kwargs])
                except P.Unsendable as exc:
                    raise TypeError(f"the arguments cannot be sent to the host: {exc}") from None
                self.conn.send_encoded(frame)
                while True:
                    kind, payload = self.conn.recv_frame()
                    msg = P.loads_from_host(kind, payload)
                    if kind == P.REPLY:
                        break
                    self._serve(msg)           # the host calls a callable the tool lent
            finally:
                self.waiting_host = False
                if self.interrupt_pending:   # deferred: the tool is interrupted now it is back
                    self.interrupt_pending = False
                    signal.raise_signal(P.SOFT_TIMEOUT_SIGNAL)
            if not msg.ok:
                raise rebuild_error(*msg.value)
            return self.wrap(msg.value)

    def _serve(self, msg: P.Request) -> None:
        try:
            fn = self._lent[msg.ref]
            fields = [True, fn(*self.wrap(msg.args), **self.wrap(msg.kwargs))]
            frame = self.encoder.encode(P.REPLY, fields)
        except BaseException as exc:
            frame = self.encoder.encode(P.REPLY, [False, error_value(exc)])
        self.conn.send_encoded(frame)

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

    def _req(self, op: int, name: Optional[str] = None, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
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


for _op in ("eq", "ne", "lt", "le", "gt", "ge"):      # run in the host, as OPERATORS
    setattr(Proxy, f"__{_op}__", _comparison(_op))
