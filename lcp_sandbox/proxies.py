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
from typing import Any, Callable, Optional

from . import wire

_SCALARS = (type(None), bool, int, float, complex, str, bytes)


class Ref:
    """A reference to a host object, as it travels on the wire."""
    __slots__ = ("id",)

    def __init__(self, id: Any) -> None:
        self.id = id

    def __reduce__(self):
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id!r})"


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


# ---------------------------------------------------------------- host side
class HostObjects:
    """The objects one call has lent to its worker, and the named ones."""

    def __init__(self, named: Callable[[Any], Any]) -> None:
        self._named = named            # resolves a named ref (handlers, config callables)
        self._objects: dict[int, Any] = {}

    def lend(self, value: Any) -> Any:
        """By value if plain, else a Ref the worker turns into a Proxy."""
        if is_plain(value):
            return value
        oid = len(self._objects) + 1
        while oid in self._objects:
            oid += 1
        self._objects[oid] = value
        return Ref(oid)

    def lend_context(self, value: Any) -> Any:
        """``tool_context``: containers of plain data by value, other leaves lent."""
        if type(value) is dict:
            return {k: self.lend_context(v) for k, v in value.items()}
        if type(value) in (list, tuple):
            return type(value)(self.lend_context(v) for v in value)
        return self.lend(value)

    def _resolve(self, ref: Any) -> Any:
        if isinstance(ref, int):
            try:
                return self._objects[ref]
            except KeyError:
                raise RuntimeError("host object is no longer available") from None
        return self._named(ref)

    def _unwrap(self, value: Any) -> Any:
        return self._resolve(value.id) if isinstance(value, Ref) else value

    def handle(self, op: int, ref: Any, name: Optional[str], args: tuple, kwargs: dict) -> tuple:
        """Run one REQUEST; returns the REPLY message."""
        try:
            target = self._resolve(ref)
            args = tuple(self._unwrap(a) for a in args)
            kwargs = {k: self._unwrap(v) for k, v in kwargs.items()}
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
                return (wire.REPLY, True, [self.lend(v) for v in target])
            else:
                raise RuntimeError(f"unknown request op {op}")
            return (wire.REPLY, True, self.lend(value))
        except BaseException as exc:  # the host must survive anything a handler does
            return (wire.REPLY, False, (type(exc).__name__, str(exc)))

    def release(self) -> None:
        self._objects.clear()


# -------------------------------------------------------------- worker side
class Channel:
    """The worker's end: sends REQUESTs while a call is in flight."""

    def __init__(self, conn: wire.Connection) -> None:
        self.conn = conn
        self.call_seq = 0        # increases per call; per-call proxies remember theirs
        self.in_call = False
        self.waiting_host = False

    def request(self, op: int, ref: Any, name: Optional[str], args: tuple, kwargs: dict,
                seq: Optional[int]) -> Any:
        if not self.in_call:
            raise RuntimeError("host objects and handlers can only be used while a tool call "
                               "is running (the host is not listening now)")
        if seq is not None and seq != self.call_seq:
            raise RuntimeError("this host object belonged to an earlier tool call and was released")
        self.waiting_host = True
        try:
            self.conn.send((wire.REQUEST, op, ref, name, args, kwargs))
            kind, ok, value = self.conn.recv()
        finally:
            self.waiting_host = False
        if not ok:
            raise rebuild_error(*value)
        return self.wrap(value)

    def wrap(self, value: Any) -> Any:
        if isinstance(value, Ref):
            return Proxy(self, value.id, self.call_seq if isinstance(value.id, int) else None)
        if type(value) is list and any(isinstance(v, Ref) for v in value):
            return [self.wrap(v) for v in value]
        return value

    def wrap_context(self, value: Any) -> Any:
        if type(value) is dict:
            return {k: self.wrap_context(v) for k, v in value.items()}
        if type(value) in (list, tuple):
            return type(value)(self.wrap_context(v) for v in value)
        return self.wrap(value)


_error_classes: dict[str, type] = {}


def rebuild_error(type_name: str, message: str) -> BaseException:
    cls = getattr(builtins, type_name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:
            pass
    cls = _error_classes.get(type_name)
    if cls is None:
        cls = _error_classes[type_name] = type(type_name, (Exception,), {"__module__": "host"})
    return cls(message)


class Proxy:
    """Stands for a host object inside a worker; every use is a round trip to the host."""
    __slots__ = ("_ch", "_ref", "_seq")

    def __init__(self, channel: Channel, ref: Any, seq: Optional[int]) -> None:
        object.__setattr__(self, "_ch", channel)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_seq", seq)

    def _req(self, op: int, name: Optional[str] = None, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        return self._ch.request(op, self._ref, name, tuple(_ref_of(a) for a in args),
                                {k: _ref_of(v) for k, v in (kwargs or {}).items()}, self._seq)

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

    def __repr__(self) -> str:
        return f"<host proxy {self._req(wire.OP_METHOD, '__repr__')}>"

    def __reduce__(self):
        return (Ref, (self._ref,))


def _ref_of(value: Any) -> Any:
    return Ref(value._ref) if isinstance(value, Proxy) else value
