"""The protocol between the host and its workers: messages, codecs, framing.

The one module both sides share, and the only one that knows bytes.

    host ──INIT (once) ───────────────────────────────► worker
    host ◄─READY (what protections are in force) ────── worker   first message, exactly once
    host ──CALL | PROMPT | MODCALL | LOAD ────────────► worker   one call at a time
    host ◄─REQUEST (a handler, a lent host object) ──── worker   0..n while the call runs
    host ──REPLY ──────────────────────────────────────► worker
    host ──REQUEST (a callable the tool lent) ─────────► worker   0..n inside a REQUEST
    host ◄─REPLY ────────────────────────────────────── worker
    host ◄─RESULT ───────────────────────────────────── worker   ends the call
    host ──SHUTDOWN ───────────────────────────────────► worker

A frame is a 4-byte big-endian payload length, one byte of kind, the payload.
The kind comes before the payload so the host can check the length against
that kind's cap before it allocates anything.

The two directions are not equally trusted, so they use two codecs:

* host → worker: ``pickle`` (the host is trusted; config values and lent
  references cross as they are).
* worker → host: msgpack, decoded into plain types only: None, bool, int,
  float, str, bytes, list, dict, and through extension types built by
  :class:`Decoder` alone, tuple, set, frozenset, bytearray, complex, big
  ints, datetime / date / time / timedelta, Decimal, UUID, PosixPath and
  references to host objects.  No decoder in the host can construct any
  other object or run any code of the worker's choosing.  Map keys are
  str or bytes natively (their hashes are randomized); keys of other types,
  and set members that are not str or bytes, are limited to
  ``MAX_HASHED`` per message, so a worker cannot stall the host with keys
  that all collide in one hash bucket.

The worker turns anything else a tool returns into something plain before
sending (see :class:`Encoder`).  Exceptions cross as (type name, args).
"""
from __future__ import annotations

import datetime
import decimal
import pickle
import select
import signal
import socket
import struct
import time
import uuid
from pathlib import PosixPath, PurePath
from typing import Any, Callable, NamedTuple, Optional

import msgpack

# ---------------------------------------------------------------- constants
SOFT_TIMEOUT_SIGNAL = signal.SIGUSR1      # the worker turns it into ToolTimeout inside the tool
HANDLER_CONFIRM = 1                       # handler bits: which host handlers are set
HANDLER_UI = 2
# Parameters the host injects (never LLM-facing, never in a schema).
HOST_PARAMS = frozenset({"tool_context", "lollms_client_instance", "discussion_instance",
                         "user_interaction_handler"})
# Named host objects a worker may refer to (besides per-call integer refs):
REF_CONFIRM = "confirm"                   # the confirm handler, when one is set
REF_UI = "ui"                             # the user-interaction handler, when one is set
# and ["cfg", stem, key]: a callable in host_tool_configs[stem][key] of the library's own stems.

# Frame caps (bytes) for what a worker sends; RESULT's is the library's max_result_mb + overhead.
READY_CAP = 64 * 1024
REQUEST_CAP = 16 * 1024 * 1024            # REQUEST and REPLY from a worker
RESULT_OVERHEAD = 64 * 1024
MAX_HASHED = 4096                         # non-str keys and set members per message
MAX_DEPTH = 256                           # nesting of what a worker sends


# ---------------------------------------------------------------- messages
# Kinds.  Host -> worker:
INIT, CALL, PROMPT, MODCALL, LOAD, SHUTDOWN = 1, 2, 3, 4, 5, 6
# Either way (a REQUEST's answer; host -> worker REQUEST calls a callable the tool lent):
REQUEST, REPLY = 7, 8
# Worker -> host:
READY, RESULT = 9, 10


class Init(NamedTuple):
    library: str
    files: list               # absolute paths, in load order (empty for code registered at run time)
    source: Optional[str]     # code of a library registered with register_tool_from_code
    configs: dict             # host_tool_configs of the library's stems (host callables as refs)
    handlers: int             # HANDLER_* bits
    sys_path: Optional[list]
    env: Optional[dict]       # the whole environment (unconfined) or the allowlisted part (confined)
    confine: Optional[dict]   # {"root", "read_paths"} when confined
    tmpdir: Optional[str]     # the private temp dir the host made for a confined worker
    disabled: list            # protections switched off for tests (LCP_SANDBOX_DISABLE)
    limits: dict              # Limits as a dict


class Call(NamedTuple):
    tool: str
    file_index: int
    params: dict
    cwd: str
    injected: Optional[dict]  # host objects, lent as refs
    handlers: int


class Prompt(NamedTuple):
    fn: str
    file_index: int
    cwd: str
    handlers: int


class ModCall(NamedTuple):
    fn: str
    file_index: int
    args: tuple
    kwargs: dict
    cwd: str
    handlers: int


class Load(NamedTuple):
    """Import every file of the library (and run init_tools_library); call no tool."""
    cwd: str
    handlers: int


class Shutdown(NamedTuple):
    pass


class Request(NamedTuple):
    op: int
    ref: Any                  # int (lent this call), REF_CONFIRM / REF_UI, or ["cfg", stem, key]
    name: Optional[str]       # attribute or operator name
    args: list
    kwargs: dict


class Reply(NamedTuple):
    ok: bool
    value: Any                # the value, or [type name, args] of the error


class Ready(NamedTuple):
    report: dict              # str -> str: what protections are in force


class Result(NamedTuple):
    value: Any
    outcome: int              # OUTCOME_*
    detail: str


# RESULT outcomes
OK, TIMED_OUT, OUT_OF_MEMORY, LOAD_FAILED, RAISED = 0, 1, 2, 3, 4

HOST_TO_WORKER = {INIT: Init, CALL: Call, PROMPT: Prompt, MODCALL: ModCall, LOAD: Load,
                  SHUTDOWN: Shutdown, REQUEST: Request, REPLY: Reply}

# REQUEST ops
OP_CALL = 0       # ref(*args, **kwargs)
OP_GETATTR = 1    # getattr(ref, name), public names only
OP_METHOD = 2     # getattr(ref, name)(*args, **kwargs), public names only
OP_SETATTR = 3    # setattr(ref, name, args[0]), public names only
OP_TRUTH = 4      # bool(ref)
OP_LIST = 5       # list(ref)
OP_OPERATOR = 6   # one of proxies.OPERATORS by name: ==, <, hash(), len(), [], in, str()...
OPS = frozenset(range(7))


class ProtocolViolation(Exception):
    """A worker sent something the protocol does not allow; it is killed, not believed."""


class PayloadError(Exception):
    """A message could not be turned into bytes (it cannot be pickled, or it is too big)."""


# ---------------------------------------------------------------- host -> worker codec
def dumps(msg: tuple) -> bytes:
    """Pickle a host -> worker message (cloudpickle only for what pickle refuses)."""
    try:
        return pickle.dumps(tuple(msg), protocol=5)
    except Exception as first:
        try:
            import cloudpickle
            return cloudpickle.dumps(tuple(msg), protocol=5)
        except Exception:
            raise PayloadError(f"{type(first).__name__}: {first}") from None


def loads_from_host(kind: int, payload: bytes) -> tuple:
    """In the worker: the host's message (trusted)."""
    cls = HOST_TO_WORKER[kind]
    return cls._make(pickle.loads(payload)) if payload else cls()


# ---------------------------------------------------------------- worker -> host codec
# Extension type codes.
_X_TUPLE, _X_SET, _X_FROZENSET, _X_PAIRS, _X_BYTEARRAY, _X_COMPLEX, _X_BIGINT = 1, 2, 3, 4, 5, 6, 7
_X_DATETIME, _X_DATE, _X_TIME, _X_TIMEDELTA, _X_DECIMAL, _X_UUID, _X_PATH = 8, 9, 10, 11, 12, 13, 14
_X_REF, _X_WORKER_REF = 15, 16

_LEAF = frozenset({str, int, float, bool, type(None), bytes})
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1


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
    """A reference to a callable the tool passed to a host method (a streaming
    callback, say): calling it in the host runs it in the tool."""

    def __reduce__(self):
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
        self._packer = msgpack.Packer(default=self._default, strict_types=True, use_bin_type=True,
                                      unicode_errors="surrogatepass", datetime=False)

    def encode(self, kind: int, fields: list) -> bytes:
        try:
            body = self._packer.pack(self._plain(fields, 0))
        except Unsendable:
            raise
        except Exception as exc:
            self._packer.reset()
            raise Unsendable(f"{type(exc).__name__}: {exc}") from None
        return _HDR.pack(len(body), kind) + body

    def _plain(self, v: Any, depth: int) -> Any:
        """``v`` with what msgpack would pack wrongly fixed: non-str keys, big ints.
        Returns ``v`` itself when nothing needed fixing (the common case).  Leaves
        are checked inline: this runs on every message a worker sends."""
        t = type(v)
        if t is dict:
            if depth > MAX_DEPTH:
                raise Unsendable(f"nested deeper than {MAX_DEPTH} levels")
            out = None
            for k, x in v.items():
                tk = type(k)
                if tk is not str and tk is not bytes:
                    return self._pairs(v, depth)
                tx = type(x)
                if tx is str or tx is bool or tx is float or x is None or (tx is int and _INT_MIN <= x <= _INT_MAX):
                    continue
                y = self._plain(x, depth + 1)
                if y is not x:
                    if out is None:
                        out = dict(v)
                    out[k] = y
            return v if out is None else out
        if t is list:
            if depth > MAX_DEPTH:
                raise Unsendable(f"nested deeper than {MAX_DEPTH} levels")
            out = None
            for i, x in enumerate(v):
                tx = type(x)
                if tx is str or tx is bool or tx is float or x is None or (tx is int and _INT_MIN <= x <= _INT_MAX):
                    continue
                y = self._plain(x, depth + 1)
                if y is not x:
                    if out is None:
                        out = list(v)
                    out[i] = y
            return v if out is None else out
        if t is int and not _INT_MIN <= v <= _INT_MAX:
            return msgpack.ExtType(_X_BIGINT, v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True))
        return v          # a leaf, or packed by _default

    def _pairs(self, d: dict, depth: int) -> msgpack.ExtType:
        return self._ext(_X_PAIRS, [[k, x] for k, x in d.items()], depth)

    def _ext(self, code: int, items: list, depth: int) -> msgpack.ExtType:
        return msgpack.ExtType(code, msgpack.packb(self._plain(items, depth + 1), default=self._default,
                                                   strict_types=True, use_bin_type=True,
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
            if isinstance(o, (dict, list, tuple, str, int, float, bytes)) and not hasattr(o, "tolist"):
                o = _base_copy(o)          # subclasses: OrderedDict, NamedTuple, IntEnum...
            else:
                o = self._convert(o)
        return repr(o)

    def _ext_of(self, o: Any) -> Optional[msgpack.ExtType]:
        t = type(o)
        if t is tuple:
            return self._ext(_X_TUPLE, list(o), 0)
        if t is set or t is frozenset:
            return self._ext(_X_SET if t is set else _X_FROZENSET, list(o), 0)
        if t is bytearray:
            return msgpack.ExtType(_X_BYTEARRAY, bytes(o))
        if t is complex:
            return msgpack.ExtType(_X_COMPLEX, struct.pack("!dd", o.real, o.imag))
        if t is datetime.datetime:
            return msgpack.ExtType(_X_DATETIME, o.isoformat().encode())
        if t is datetime.date:
            return msgpack.ExtType(_X_DATE, o.isoformat().encode())
        if t is datetime.time:
            return msgpack.ExtType(_X_TIME, o.isoformat().encode())
        if t is datetime.timedelta:
            return msgpack.ExtType(_X_TIMEDELTA, struct.pack("!iii", o.days, o.seconds, o.microseconds))
        if t is decimal.Decimal:
            return msgpack.ExtType(_X_DECIMAL, str(o).encode())
        if t is uuid.UUID:
            return msgpack.ExtType(_X_UUID, o.bytes)
        if isinstance(o, PurePath) and o.__class__.__name__.endswith("PosixPath"):
            return msgpack.ExtType(_X_PATH, str(o).encode("utf-8", "surrogateescape"))
        if t is Ref or t is WorkerRef:
            return self._ext(_X_REF if t is Ref else _X_WORKER_REF, [o.id], 0)
        return None


def _base_copy(o: Any) -> Any:
    for base in (bool, int, float, str, bytes, dict, list, tuple):
        if isinstance(o, base):
            return base(o)
    return o


class Decoder:
    """In the host: a worker's msgpack bytes to plain values.  One per connection
    (not thread-safe; a connection serves one call at a time).

    Builds nothing but the types in the module docstring; any malformed input
    raises ProtocolViolation."""

    __slots__ = ("_hashed", "_nesting", "saw_ref")

    def __init__(self) -> None:
        self._hashed = 0
        self._nesting = 0
        self.saw_ref = False

    def decode(self, payload: bytes) -> Any:
        self._hashed = 0
        self._nesting = 0
        self.saw_ref = False
        try:
            return self._unpack(payload)
        except ProtocolViolation:
            raise
        except Exception as exc:      # msgpack's errors, RecursionError, MemoryError...
            raise ProtocolViolation(f"undecodable payload ({type(exc).__name__}: {exc})"[:300]) from None

    def _unpack(self, data: bytes) -> Any:
        return msgpack.unpackb(data, ext_hook=self._ext, raw=False, strict_map_key=True,
                               unicode_errors="surrogatepass", use_list=True)

    def _items(self, data: bytes) -> list:
        self._nesting += 1
        if self._nesting > 64:
            raise ProtocolViolation("extension types nested too deeply")
        try:
            items = self._unpack(data)
        finally:
            self._nesting -= 1
        if type(items) is not list:
            raise ProtocolViolation("malformed extension value")
        return items

    def _hashable(self, items: list) -> list:
        for x in items:
            if type(x) is not str and type(x) is not bytes:
                self._hashed += 1
        if self._hashed > MAX_HASHED:
            raise ProtocolViolation(f"more than {MAX_HASHED} non-string keys or set members")
        return items

    def _ext(self, code: int, data: bytes) -> Any:
        if code == _X_TUPLE:
            return tuple(self._items(data))
        if code == _X_SET or code == _X_FROZENSET:
            items = self._hashable(self._items(data))
            return set(items) if code == _X_SET else frozenset(items)
        if code == _X_PAIRS:
            pairs = self._items(data)
            if any(type(p) is not list or len(p) != 2 for p in pairs):
                raise ProtocolViolation("malformed key/value pairs")
            self._hashable([p[0] for p in pairs])
            return {k: v for k, v in pairs}
        if code == _X_BYTEARRAY:
            return bytearray(data)
        if code == _X_COMPLEX:
            return complex(*struct.unpack("!dd", data))
        if code == _X_BIGINT:
            return int.from_bytes(data, "big", signed=True)
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
        if code == _X_PATH:
            return PosixPath(data.decode("utf-8", "surrogateescape"))
        if code == _X_REF or code == _X_WORKER_REF:
            items = self._items(data)
            if len(items) != 1 or not valid_ref(items[0], worker_ref=code == _X_WORKER_REF):
                raise ProtocolViolation("malformed reference")
            self.saw_ref = True
            return (Ref if code == _X_REF else WorkerRef)(items[0])
        raise ProtocolViolation(f"unknown extension type {code}")


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
def _is_str_dict(d: Any) -> bool:
    return type(d) is dict and all(type(k) is str and type(v) is str and len(v) < 4096 for k, v in d.items())


def parse_from_worker(kind: int, payload: bytes, decoder: Decoder) -> tuple:
    """In the host: a worker's message, decoded and checked; ProtocolViolation otherwise."""
    fields = decoder.decode(payload)
    if type(fields) is not list:
        raise ProtocolViolation(f"message of kind {kind} is not a list of fields")
    n = len(fields)
    if kind == RESULT:
        if n != 3 or type(fields[1]) is not int or type(fields[2]) is not str or fields[1] not in (
                OK, TIMED_OUT, OUT_OF_MEMORY, LOAD_FAILED, RAISED):
            raise ProtocolViolation("malformed RESULT")
        if fields[1] == RAISED and not _is_error(fields[0]):
            raise ProtocolViolation("malformed error in RESULT")
        return Result(*fields)
    if kind == REQUEST:
        if (n != 5 or type(fields[0]) is not int or fields[0] not in OPS or not valid_ref(fields[1])
                or not (fields[2] is None or type(fields[2]) is str)
                or type(fields[3]) is not list or type(fields[4]) is not dict):
            raise ProtocolViolation("malformed REQUEST")
        return Request(*fields)
    if kind == REPLY:
        if n != 2 or type(fields[0]) is not bool or (not fields[0] and not _is_error(fields[1])):
            raise ProtocolViolation("malformed REPLY")
        return Reply(*fields)
    if kind == READY:
        if n != 1 or not _is_str_dict(fields[0]):
            raise ProtocolViolation("malformed READY")
        return Ready(*fields)
    raise ProtocolViolation(f"a worker may not send messages of kind {kind}")


def _is_error(v: Any) -> bool:
    return type(v) is list and len(v) == 2 and type(v[0]) is str and len(v[0]) < 200 and type(v[1]) is list


# ---------------------------------------------------------------- framing
_HDR = struct.Struct("!IB")
_BIG = 1 << 16


class Connection:
    """Framed messages over one connected stream socket (one per worker).

    ``recv_frame`` reads one whole frame by an absolute deadline: a peer that
    trickles bytes cannot stretch a read past it.  A frame cut short by a
    timeout stays buffered and the next read continues it."""

    __slots__ = ("sock", "fd", "_buf", "_big", "_poll", "_rcvtimeo", "decoder", "broken")

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self.sock = sock
        self.fd = sock.fileno()
        self._buf = bytearray()
        self._big: Optional[list] = None        # [kind, bytearray, bytes read] of a large frame
        self._poll: Optional[select.poll] = None
        self._rcvtimeo: Optional[float] = None
        self.decoder = Decoder()
        self.broken: Optional[str] = None       # set once the peer broke the protocol

    # -- sending -------------------------------------------------------
    def send(self, kind: int, msg: tuple = ()) -> int:
        """Pickle and send a host -> worker message; returns the payload size."""
        return self.send_frame(kind, dumps(msg) if msg else b"")

    def send_frame(self, kind: int, body: bytes) -> int:
        n = len(body)
        if n >= 1 << 32:
            raise PayloadError(f"message of {n} bytes is over the frame limit")
        if n < _BIG:
            self.sock.sendall(_HDR.pack(n, kind) + body)
        else:
            self.sock.sendall(_HDR.pack(n, kind))
            self.sock.sendall(body)
        return n

    def send_encoded(self, frame: bytes) -> None:
        """Send a frame made by Encoder.encode (header included)."""
        self.sock.sendall(frame)

    # -- receiving -----------------------------------------------------
    def recv_frame(self, deadline: Optional[float] = None,
                   caps: Optional[dict] = None) -> tuple[int, bytes]:
        """The next (kind, payload).  EOFError when the peer is gone, TimeoutError
        at ``deadline`` (time.monotonic()); with ``caps`` (kind -> max bytes) a kind
        not in it, or a length over its cap, raises ProtocolViolation unread."""
        if self.broken:
            raise ProtocolViolation(self.broken)
        if self._big is not None:
            return self._recv_big(deadline)
        buf = self._buf
        while True:
            if len(buf) >= 5:
                n, kind = _HDR.unpack_from(buf)
                if caps is not None:
                    cap = caps.get(kind)
                    if cap is None:
                        self.broken = f"a message of kind {kind} it may not send now"
                        raise ProtocolViolation(self.broken)
                    if n > cap:
                        self.broken = f"a frame of {n} bytes announced, over the {cap}-byte cap of its kind"
                        raise ProtocolViolation(self.broken)
                if len(buf) >= 5 + n:
                    data = bytes(buf[5:5 + n])
                    del buf[:5 + n]
                    return kind, data
                if n >= _BIG:
                    out = bytearray(n)
                    have = len(buf) - 5
                    out[:have] = buf[5:]
                    buf.clear()
                    self._big = [kind, out, have]
                    return self._recv_big(deadline)
            chunk = self._recv(deadline)
            if not chunk:
                raise EOFError("peer closed the connection")
            buf += chunk

    def _recv_big(self, deadline: Optional[float]) -> tuple[int, bytes]:
        # Large frames are read straight into their final buffer.
        kind, out, have = big = self._big
        view = memoryview(out)
        n = len(out)
        while have < n:
            if deadline is not None:
                self._wait(deadline)
            got = self.sock.recv_into(view[have:], min(n - have, 1 << 24))
            if not got:
                raise EOFError("peer closed the connection")
            have += got
            big[2] = have
        self._big = None
        return kind, out

    def _recv(self, deadline: Optional[float]) -> bytes:
        # A timeout is a socket option (SO_RCVTIMEO), not a poll() before each
        # read: one syscall per message.  The option is only changed when it is
        # more than 10 ms off, so calls with the same timeout set it once.
        if deadline is None:
            if self._rcvtimeo is not None:
                self._set_rcvtimeo(None)
        else:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise TimeoutError
            if self._rcvtimeo is None or abs(self._rcvtimeo - timeout) > 0.01:
                self._set_rcvtimeo(timeout)
        try:
            return self.sock.recv(_BIG)
        except BlockingIOError:
            raise TimeoutError from None

    def _set_rcvtimeo(self, timeout: Optional[float]) -> None:
        secs = 0.0 if timeout is None else max(timeout, 0.001)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                             struct.pack("ll", int(secs), int((secs % 1) * 1e6)))
        self._rcvtimeo = timeout

    def _poller(self) -> select.poll:
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.fd, select.POLLIN)
        return self._poll

    def _wait(self, deadline: float) -> None:
        if not self._poller().poll(max(0.0, deadline - time.monotonic()) * 1000.0):
            raise TimeoutError

    def readable_now(self) -> bool:
        """True if the peer sent something or hung up (an idle worker never does)."""
        return bool(self._buf) or self._big is not None or bool(self._poller().poll(0))

    def pending(self) -> bool:
        """Bytes already read that belong to no message yet."""
        return bool(self._buf) or self._big is not None

    def sent_while_idle(self) -> bool:
        """True if the peer sent bytes (not just hung up) when it had nothing to say."""
        if self._buf or self._big is not None:
            return True
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:
            return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def pair() -> tuple[socket.socket, socket.socket]:
    """A connected AF_UNIX stream pair (a few percent faster than a pipe)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
