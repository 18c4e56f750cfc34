"""Host objects across the process boundary: the host's half (the worker's is
worker/proxies.py).

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

What a worker can reach (it is hostile; see protocol/ for what it can send):
per-call integer refs to what the host lent for this call, released when the
call ends; the confirm / user-interaction handler by name, only when one is
set; callables of its own library's ``host_tool_configs``.  Through them,
public attributes and methods only (no name starting with ``_``; operators go
through a fixed table), and never a module, a class, a module function of C
(``os.system``, ``eval``), or interpreter internals (frames, code, cells,
descriptors).  Functions the host
exposes as public attributes (a progress callback in ``tool_context``) can be
called; their internals are dunder attributes, out of reach.
"""
from __future__ import annotations

import operator
import os
import types
from typing import Any, Callable, Optional, Protocol, cast

from .. import protocol as P
from ..core.discovery import Library
from ..protocol import (
    Ref,
    WorkerRef,
    error_value,
    is_plain,
    map_containers,
    rebuild_error,
    sendable,
)

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



def _refused(value: Any) -> Optional[str]:
    """Why ``value`` may not be handed to a worker, or None."""
    if isinstance(value, _INTERNALS):
        kind: type = type(value)
        return kind.__name__
    if (isinstance(value, types.BuiltinFunctionType)
            and isinstance(value.__self__, types.ModuleType)):
        # os.system, eval, open...
        return "module-level builtin function"
    return None



class HostObjects:
    """The objects one call has lent to its worker, and the named ones.

    One per call: ``release()`` at the end of the call drops every lent object."""

    __slots__ = ("_named", "_objects", "conn", "deadline")

    def __init__(self, named: Callable[[Any], Any]) -> None:
        # resolves a named ref (handlers, the library's config callables)
        self._named = named
        self._objects: dict[int, Any] = {}
        # Set while the call runs (callbacks)
        self.conn: Optional[P.Connection] = None
        # For a callback into the tool.
        self.deadline: Optional[float] = None

    def lend(self, value: Any) -> Any:
        """What the host chose to lend at the start of a call: plain values by
        value; dicts, lists and tuples as such with their other items lent; any
        other object as a Ref the worker turns into a Proxy."""
        return value if is_plain(value) else map_containers(value, self._lend_one)

    def lend_named(self, values: dict) -> Optional[dict]:
        """``values`` (name -> object) lent, those that are not None; None when all are."""
        lent = {k: self.lend(v) for k, v in values.items() if v is not None}
        return lent or None

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

    def handle(self, req: P.Request, saw_ref: bool) -> tuple[bool, Any]:
        """Run one REQUEST from the worker; returns the REPLY fields (ok, value)."""
        op, name = req.op, req.name
        try:
            target = self._resolve(req.ref)
            if saw_ref:
                args, kwargs = self.unwrap(req.args), self.unwrap(req.kwargs)
            else:
                args, kwargs = req.args, req.kwargs
            if op in _BY_NAME and (not name or name.startswith("_")):
                raise AttributeError(f"{name!r}: private attributes are not reachable through "
                                     f"a host proxy")
            if saw_ref and (op == P.OP_SETATTR or name == "setitem") and _holds_tool_callable(args):
                # Stored in a host object, it would outlive the call that lent it.
                raise PermissionError("a callable of the tool cannot be stored in a host object")
            if op == P.OP_CALL:
                if target is None:
                    raise RuntimeError("no handler is configured in the host")
                value = target(*args, **kwargs)
            elif target is None:
                raise RuntimeError("no such host object")
            else:
                value = _operate(target, op, name, args, kwargs)
            return True, self._give(value)
        # The host must survive anything a handler does.
        except BaseException as exc:
            return False, error_value(exc)

    def call_tool_callable(self, wid: int, args: tuple, kwargs: dict) -> Any:
        """Run a callable the tool lent (it runs in the worker); the worker's
        REQUESTs meanwhile are served here.  A worker that breaks the protocol
        marks the connection broken: the supervisor kills it after this call."""
        conn = self.conn
        if conn is None:
            raise RuntimeError("the tool's callable can only be called while its call is running")
        caps = {P.REPLY: P.REQUEST_CAP, P.REQUEST: P.REQUEST_CAP}
        try:
            request = (P.OP_CALL, wid, None, self.lend(args), self.lend(kwargs))
            conn.send(P.REQUEST, request, self.deadline)
            while True:
                kind, payload = conn.recv_frame(self.deadline, caps)
                msg = P.parse_from_worker(kind, payload, conn.decoder)
                saw_ref = conn.decoder.saw_ref
                if kind == P.REPLY:
                    if not msg.ok:
                        raise rebuild_error(*msg.value)
                    return self.unwrap(msg.value) if saw_ref else msg.value
                conn.send(P.REPLY, self.handle(msg, saw_ref), self.deadline)
        except P.BadMessage as exc:
            conn.broken = conn.broken or str(exc)
            raise
        except TimeoutError:
            conn.broken = (conn.broken
                           or "a callable of the tool did not answer before the call's deadline")
            raise P.BadMessage(conn.broken) from None
        except EOFError:
            conn.broken = "the worker went away while the host called back into the tool"
            raise P.BadMessage(conn.broken) from None

    def release(self) -> None:
        self._objects.clear()
        self.conn = None


# Operations on a public name.
_BY_NAME = (P.OP_GETATTR, P.OP_METHOD, P.OP_SETATTR)


def _operate(target: Any, op: int, name: Optional[str], args: list, kwargs: dict) -> Any:
    """A REQUEST's operation on its (resolved, not None) host object, other than a call."""
    if op == P.OP_TRUTH:
        return bool(target)
    if op == P.OP_LIST:
        return list(target)
    if op == P.OP_OPERATOR:
        fn = OPERATORS.get(name or "")
        if fn is None:
            raise AttributeError(f"{name!r} is not an operator a host proxy forwards")
        return fn(target, *args)
    # _BY_NAME: handle() refused a missing or private name.
    attr = cast(str, name)
    if op == P.OP_GETATTR:
        return getattr(target, attr)
    if op == P.OP_METHOD:
        method = getattr(target, attr)
        why = _refused(method)
        if why is not None:
            raise PermissionError(f"a {why} is not called for a tool through a host proxy")
        return method(*args, **kwargs)
    # OP_SETATTR
    setattr(target, attr, args[0])
    return None


def _holds_tool_callable(value: Any) -> bool:
    found = []

    def seen(v: Any) -> Any:
        if type(v) is _ToolCallable:
            found.append(v)
        return v

    map_containers(value, seen)
    return bool(found)


class _Owner(Protocol):
    """What NamedRefs reads from the binding at each use."""
    confirm_handler: Optional[Callable]
    user_interaction_handler: Optional[Callable]
    host_tool_configs: dict


class NamedRefs:
    """What a worker of one library may name besides what its call lent: the
    handlers (None when not set) and the callables of its own stems'
    host_tool_configs, read from ``owner`` (the binding) at each use."""
    __slots__ = ("_owner", "_library", "_stems")

    def __init__(self, owner: _Owner, library: Library) -> None:
        self._owner = owner
        self._library = library.name
        self._stems = library.stems

    def __call__(self, ref: Any) -> Any:
        owner = self._owner
        if ref == P.REF_CONFIRM:
            return owner.confirm_handler
        if ref == P.REF_UI:
            return owner.user_interaction_handler
        if type(ref) is list and len(ref) == 3 and ref[0] == "cfg" and ref[1] in self._stems:
            value = (owner.host_tool_configs.get(ref[1]) or {}).get(ref[2])
            if ref[2] == "confirm_handler" and value is None:
                return owner.confirm_handler
            if ref[2] == "user_interaction_handler" and value is None:
                return owner.user_interaction_handler
            if value is not None and not sendable(value):
                return value
        raise PermissionError(f"{ref!r} is not a host object lent to library {self._library!r}")


class _ToolCallable:
    """In the host: a callable of the tool's (e.g. a streaming callback)."""
    __slots__ = ("_objects", "_id")

    def __init__(self, objects: HostObjects, wid: int) -> None:
        self._objects, self._id = objects, wid

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._objects.call_tool_callable(self._id, args, kwargs)

