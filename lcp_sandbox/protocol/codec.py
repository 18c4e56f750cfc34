"""The two codecs: pickle host -> worker, msgpack into plain types worker -> host.

Also the checks of every message a worker sends (``parse_from_worker``): its
kind, its field count and each field's type, before the host acts on it.
"""
from __future__ import annotations

import pickle
import struct
import sys
from typing import Any, Callable, Iterable, Optional, Union

import msgpack

from .messages import HEADER as _HDR
from .messages import (
    HOST_TO_WORKER,
    LOAD_FAILED,
    MAX_DEPTH,
    MAX_HASHED,
    OK,
    OPS,
    OUT_OF_MEMORY,
    RAISED,
    READY,
    REF_CONFIRM,
    REF_UI,
    REPLY,
    REQUEST,
    RESULT,
    TIMED_OUT,
    BadMessage,
    Call,
    Load,
    PayloadError,
    Prompt,
    Ready,
    Reply,
    Request,
    Result,
)

# The two readers return Any: the message type is the one of its kind (HOST_TO_WORKER,
# and RESULT / REQUEST / REPLY / READY from a worker), which only the caller, who
# checked the kind, can name, e.g. ``init: P.Init = P.loads_from_host(kind, payload)``
# (a union would make every caller narrow on the hot path).

# A field list as its NamedTuple: _make without its Python frame and length check
# (the host sends every field; a worker's fields are checked before).
_new = tuple.__new__


# ---------------------------------------------------------------- host -> worker codec
def dumps(msg: tuple[Any, ...]) -> bytes:
    """Pickle a host -> worker message (cloudpickle only for what pickle refuses)."""
    try:
        return pickle.dumps(msg if type(msg) is tuple else tuple(msg), 5)
    except Exception as first:
        try:
            import cloudpickle
            data: bytes = cloudpickle.dumps(tuple(msg), protocol=5)
            return data
        except Exception:
            raise PayloadError(f"{type(first).__name__}: {first}") from None


def loads_from_host(kind: int, payload: bytes) -> Any:
    """In the worker: the host's message (trusted), of the type of its kind."""
    cls = HOST_TO_WORKER[kind]
    return _new(cls, pickle.loads(payload)) if payload else cls()


# ---------------------------------------------------------------- worker -> host codec
# Extension type codes.
_X_TUPLE, _X_SET, _X_FROZENSET, _X_PAIRS, _X_BYTEARRAY, _X_COMPLEX, _X_BIGINT = 1, 2, 3, 4, 5, 6, 7
_X_DATETIME, _X_DATE, _X_TIME, _X_TIMEDELTA, _X_DECIMAL, _X_UUID, _X_PATH = 8, 9, 10, 11, 12, 13, 14
_X_REF, _X_WORKER_REF = 15, 16

_LEAF = frozenset({str, int, float, bool, type(None), bytes})
# Packed as they are, at any size.
_SCALAR = frozenset({str, float, bool, type(None), bytes})
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1


class Ref:
    """A reference to a host object, as it travels on the wire."""
    __slots__ = ("id",)

    def __init__(self, id: Any) -> None:
        self.id = id

    def __reduce__(self) -> tuple[type[Ref], tuple[Any]]:
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id!r})"


class WorkerRef(Ref):
    """A reference to a callable the tool passed to a host method (a streaming
    callback, say): calling it in the host runs it in the tool."""

    def __reduce__(self) -> tuple[type[Ref], tuple[Any]]:
        return (WorkerRef, (self.id,))


class Unsendable(Exception):
    """The worker cannot express a value in the protocol."""


class Encoder:
    """In the worker: plain values to msgpack bytes.

    ``convert`` is called for any other object; it returns a replacement
    (the worker's proxies go back as refs, callables are lent, other objects
    become plain values or their repr).  Dicts whose keys are not all str or
    bytes travel as key/value pairs."""

    def __init__(self, convert: Callable[[Any], Any]) -> None:
        self._convert = convert
        # Text is packed by the strict UTF-8 packer (msgpack's fast path); text with a lone
        # surrogate makes it raise, and the message is packed again by the one that carries it.
        self._utf8 = msgpack.Packer(default=self._default, strict_types=True, use_bin_type=True,
                                    datetime=False)
        self._packer = msgpack.Packer(default=self._default, strict_types=True, use_bin_type=True,
                                      unicode_errors="surrogatepass", datetime=False)

    def encode(self, kind: int, fields: list[Any]) -> bytes:
        body: bytes
        try:
            plain = self._plain(fields, 0)
            try:
                body = self._utf8.pack(plain)
            except UnicodeEncodeError:
                self._utf8.reset()
                body = self._packer.pack(plain)
        except Unsendable:
            raise
        except Exception as exc:
            self._packer.reset()
            raise Unsendable(f"{type(exc).__name__}: {exc}") from None
        return _HDR.pack(len(body), kind) + body

    def _plain(self, v: Any, depth: int) -> Any:
        """``v`` with what msgpack would pack wrongly fixed: non-str keys, big ints.
        Returns ``v`` itself when nothing needed fixing (the common case).  Leaves
        are checked inline (one set lookup): this runs on every message a worker sends."""
        t = type(v)
        if t is dict:
            return self._items(v, v.items(), True, depth)
        if t is list:
            return self._items(v, enumerate(v), False, depth)
        if t is int and not _INT_MIN <= v <= _INT_MAX:
            return msgpack.ExtType(_X_BIGINT,
                                   v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True))
        # A leaf, or packed by _default.
        return v

    def _items(self, v: Any, items: Iterable[tuple[Any, Any]], keyed: bool, depth: int) -> Any:
        """A dict (``keyed``: its items) or a list (enumerate()) with each item fixed that
        needed it, copied at the first; ``v`` itself when none did.  A dict with a key that
        is neither str nor bytes travels as pairs."""
        if depth > MAX_DEPTH:
            raise Unsendable(f"nested deeper than {MAX_DEPTH} levels")
        out = None
        for k, x in items:
            if keyed and type(k) is not str and type(k) is not bytes:
                return self._pairs(v, depth)
            tx = type(x)
            if tx in _SCALAR or tx is int and _INT_MIN <= x <= _INT_MAX:
                continue
            y = self._plain(x, depth + 1)
            if y is not x:
                if out is None:
                    out = dict(v) if keyed else list(v)
                out[k] = y
        return v if out is None else out

    def _pairs(self, d: dict[Any, Any], depth: int) -> msgpack.ExtType:
        return self._ext(_X_PAIRS, [[k, x] for k, x in d.items()], depth)

    def _ext(self, code: int, items: list[Any], depth: int) -> msgpack.ExtType:
        return msgpack.ExtType(code, msgpack.packb(self._plain(items, depth + 1),
                                                   default=self._default, strict_types=True,
                                                   use_bin_type=True,
                                                   unicode_errors="surrogatepass", datetime=False))

    def _default(self, o: Any) -> Any:
        # msgpack packs what this returns without calling it again: return an
        # ExtType or a value msgpack packs natively.
        for _ in range(3):
            ext = self._ext_of(o)
            if ext is not None:
                return ext
            t = type(o)
            if t is dict or t is list or t in _LEAF:
                return self._plain(o, 1)
            if (isinstance(o, (dict, list, tuple, str, int, float, bytes))
                    and not hasattr(o, "tolist")):
                # Subclasses: OrderedDict, NamedTuple, IntEnum...
                o = _base_copy(o)
            else:
                o = self._convert(o)
        return repr(o)

    def _ext_of(self, o: Any) -> Optional[msgpack.ExtType]:  # noqa: C901 (a type switch, hot)
        t = type(o)
        if t is tuple:
            return self._ext(_X_TUPLE, list(o), 0)
        if t is set or t is frozenset:
            return self._ext(_X_SET if t is set else _X_FROZENSET, list(o), 0)
        if t is bytearray:
            return msgpack.ExtType(_X_BYTEARRAY, bytes(o))
        if t is complex:
            return msgpack.ExtType(_X_COMPLEX, struct.pack("!dd", o.real, o.imag))
        try:
            module = t.__module__
        # (a class of the tool's may make its __module__ anything, even raise)
        except Exception:
            module = None
        if type(module) is str and module in _STDLIB_EXT:
            return _stdlib_ext(o, t)
        # A path exists only once pathlib is imported: a worker that made none never imports it.
        pathlib = sys.modules.get("pathlib")
        if (pathlib is not None and isinstance(o, pathlib.PurePath)
                and o.__class__.__name__.endswith("PosixPath")):
            return msgpack.ExtType(_X_PATH, str(o).encode("utf-8", "surrogateescape"))
        if t is Ref or t is WorkerRef:
            return self._ext(_X_REF if t is Ref else _X_WORKER_REF, [o.id], 0)
        return None


_BASES: tuple[type[Any], ...] = (bool, int, float, str, bytes, dict, list, tuple)


def _base_copy(o: Any) -> Any:
    for base in _BASES:
        if isinstance(o, base):
            return base(o)
    return o


# The standard library's value types with an extension code, by module.  Named, not
# imported: a spawned worker starts without these modules (about 8 ms of its start), and a
# value of one of them exists only once its module is imported.
_STDLIB_EXT = frozenset({"datetime", "decimal", "uuid"})


def _stdlib_ext(o: Any, t: type) -> Optional[msgpack.ExtType]:
    """The extension value of a datetime, date, time, timedelta, Decimal or UUID; None
    for any other type of those modules."""
    import datetime
    import decimal
    import uuid
    if t is datetime.datetime:
        return msgpack.ExtType(_X_DATETIME, o.isoformat().encode())
    if t is datetime.date:
        return msgpack.ExtType(_X_DATE, o.isoformat().encode())
    if t is datetime.time:
        return msgpack.ExtType(_X_TIME, o.isoformat().encode())
    if t is datetime.timedelta:
        return msgpack.ExtType(_X_TIMEDELTA,
                               struct.pack("!iii", o.days, o.seconds, o.microseconds))
    if t is decimal.Decimal:
        return msgpack.ExtType(_X_DECIMAL, str(o).encode())
    if t is uuid.UUID:
        return msgpack.ExtType(_X_UUID, o.bytes)
    return None


def _stdlib_value(code: int, data: bytes) -> Any:
    """The datetime, date, time, timedelta, Decimal, UUID or PosixPath of an extension
    value (its module imported here, where one arrives)."""
    import datetime
    import decimal
    import uuid
    from pathlib import PosixPath
    if code == _X_DATETIME:
        return datetime.datetime.fromisoformat(data.decode())
    if code == _X_DATE:
        return datetime.date.fromisoformat(data.decode())
    if code == _X_TIME:
        return datetime.time.fromisoformat(data.decode())
    if code == _X_TIMEDELTA:
        return datetime.timedelta(*struct.unpack("!iii", data))
    if code == _X_DECIMAL:
        return decimal.Decimal(data.decode())
    if code == _X_UUID:
        return uuid.UUID(bytes=data)
    return PosixPath(data.decode("utf-8", "surrogateescape"))


class Decoder:
    """In the host: a worker's msgpack bytes to plain values.  One per connection
    (not thread-safe; a connection serves one call at a time).

    Builds nothing but the types in the module docstring; any malformed input
    raises BadMessage."""

    __slots__ = ("_hashed", "_nesting", "saw_ref")

    def __init__(self) -> None:
        self._hashed = 0
        self._nesting = 0
        self.saw_ref = False

    def decode(self, payload: Union[bytes, memoryview]) -> Any:
        self._hashed = 0
        self._nesting = 0
        self.saw_ref = False
        try:
            return msgpack.unpackb(payload, ext_hook=self._ext, raw=False, strict_map_key=True,
                                   unicode_errors="surrogatepass", use_list=True)
        except BadMessage:
            raise
        # Msgpack's errors, RecursionError, MemoryError...
        except Exception as exc:
            raise BadMessage(
                f"undecodable payload ({type(exc).__name__}: {exc})"[:300]) from None

    def _unpack(self, data: bytes) -> Any:
        return msgpack.unpackb(data, ext_hook=self._ext, raw=False, strict_map_key=True,
                               unicode_errors="surrogatepass", use_list=True)

    def _items(self, data: bytes) -> list[Any]:
        self._nesting += 1
        if self._nesting > 64:
            raise BadMessage("extension types nested too deeply")
        try:
            items = self._unpack(data)
        finally:
            self._nesting -= 1
        if type(items) is not list:
            raise BadMessage("malformed extension value")
        return items

    def _hashable(self, items: list[Any]) -> list[Any]:
        for x in items:
            if type(x) is not str and type(x) is not bytes:
                self._hashed += 1
        if self._hashed > MAX_HASHED:
            raise BadMessage(f"more than {MAX_HASHED} non-string keys or set members")
        return items

    def _ext(self, code: int, data: bytes) -> Any:  # noqa: C901 (msgpack's ext_hook: one frame)
        if code == _X_TUPLE:
            return tuple(self._items(data))
        if code == _X_SET or code == _X_FROZENSET:
            items = self._hashable(self._items(data))
            return set(items) if code == _X_SET else frozenset(items)
        if code == _X_PAIRS:
            pairs = self._items(data)
            if any(type(p) is not list or len(p) != 2 for p in pairs):
                raise BadMessage("malformed key/value pairs")
            self._hashable([p[0] for p in pairs])
            return {k: v for k, v in pairs}
        if code == _X_BYTEARRAY:
            return bytearray(data)
        if code == _X_COMPLEX:
            return complex(*struct.unpack("!dd", data))
        if code == _X_BIGINT:
            return int.from_bytes(data, "big", signed=True)
        if _X_DATETIME <= code <= _X_PATH:
            return _stdlib_value(code, data)
        if code == _X_REF or code == _X_WORKER_REF:
            items = self._items(data)
            if len(items) != 1 or not valid_ref(items[0], worker_ref=code == _X_WORKER_REF):
                raise BadMessage("malformed reference")
            self.saw_ref = True
            return (Ref if code == _X_REF else WorkerRef)(items[0])
        raise BadMessage(f"unknown extension type {code}")


def valid_ref(ref: Any, worker_ref: bool = False) -> bool:
    """A reference as a worker may name it."""
    if type(ref) is int:
        return 0 < ref < 1 << 62
    if worker_ref:
        return False
    if ref == REF_CONFIRM or ref == REF_UI:
        return True
    return (type(ref) is list and len(ref) == 3 and ref[0] == "cfg"
            and type(ref[1]) is str and type(ref[2]) is str)


# Shapes of worker -> host messages: field count and a check per field.
_OUTCOMES = frozenset({OK, TIMED_OUT, OUT_OF_MEMORY, LOAD_FAILED, RAISED})

def _is_str_dict(d: Any) -> bool:
    return type(d) is dict and all(type(k) is str and type(v) is str and len(v) < 4096
                                   for k, v in d.items())


def parse_from_worker(kind: int, payload: Union[bytes, memoryview], decoder: Decoder) -> Any:
    """In the host: a worker's message (Result, Request, Reply or Ready, as its kind
    says), decoded and checked; BadMessage otherwise."""
    fields = decoder.decode(payload)
    if type(fields) is not list:
        raise BadMessage(f"message of kind {kind} is not a list of fields")
    n = len(fields)
    if kind == RESULT:
        if (n != 3 or type(fields[1]) is not int or type(fields[2]) is not str
                or fields[1] not in _OUTCOMES):
            raise BadMessage("malformed RESULT")
        if fields[1] == RAISED and not is_error(fields[0]):
            raise BadMessage("malformed error in RESULT")
        return _new(Result, fields)
    if kind == REQUEST:
        if (n != 5 or type(fields[0]) is not int or fields[0] not in OPS or not valid_ref(fields[1])
                or not (fields[2] is None or type(fields[2]) is str)
                or type(fields[3]) is not list or type(fields[4]) is not dict):
            raise BadMessage("malformed REQUEST")
        return _new(Request, fields)
    if kind == REPLY:
        if n != 2 or type(fields[0]) is not bool or (not fields[0] and not is_error(fields[1])):
            raise BadMessage("malformed REPLY")
        return _new(Reply, fields)
    if kind == READY:
        if n != 1 or not _is_str_dict(fields[0]):
            raise BadMessage("malformed READY")
        return _new(Ready, fields)
    raise BadMessage(f"a worker may not send messages of kind {kind}")


def is_error(v: Any) -> bool:
    """An exception as it travels: [type name, args]."""
    return (type(v) is list and len(v) == 2 and type(v[0]) is str and len(v[0]) < 200
            and type(v[1]) is list)


def invalid_answer(msg: tuple[Any, ...], value: Any) -> Optional[str]:
    """Why a RESULT's value cannot be the answer to ``msg`` (None when it can)."""
    t = type(msg)
    if t is Call:
        if (type(value) is not dict or type(value.get("status_code")) is not int
                or not (value.get("success") is None or type(value.get("success")) is bool)):
            return "a tool result that is not an LCP result dict"
    elif t is Prompt:
        if value is not None and type(value) is not str:
            return "a prompt that is not text"
    elif t is Load:
        if value is not None and not (type(value) is list and len(value) == 2
                                      and all(type(x) is str for x in value)):
            return "a malformed load answer"
    return None

