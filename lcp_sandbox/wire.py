"""The wire: message kinds and framed bytes on a stream socket.

This is the only module that knows bytes.  A frame is a 4-byte big-endian
length followed by a pickle.  Plain ``pickle`` is used on the hot path;
``cloudpickle`` only for what plain pickle refuses (closures, lambdas,
classes defined in a tool module...).

Messages are plain tuples whose first item is the kind; the constructors
below name their fields.  Tuples of ints and strings pickle in about a
microsecond, which keeps a warm call close to the pipe floor.

    host ──CALL/PROMPT/MODCALL──────────────────────► worker
    host ◄─REQUEST (handler, proxy use)───────────── worker   (0..n per call)
    host ──REPLY────────────────────────────────────► worker
    host ◄─RESULT──────────────────────────────────── worker   (ends the call)
    host ──INIT (once) ─────────────────────────────► worker
    host ◄─READY (protections in force) ───────────── worker
    host ──SHUTDOWN─────────────────────────────────► worker
"""
from __future__ import annotations

import pickle
import select
import socket
import struct
from typing import Any, Optional

# Host -> worker
INIT = 1        # (INIT, init_dict)
CALL = 2        # (CALL, tool, file_index, params, cwd, injected, handlers_mask)
PROMPT = 3      # (PROMPT, fn_name, file_index, cwd, handlers_mask)
REPLY = 4       # (REPLY, ok, value)                 answer to a REQUEST
SHUTDOWN = 5    # (SHUTDOWN,)
MODCALL = 6     # (MODCALL, fn_name, file_index, args, kwargs, cwd, handlers_mask)
# Worker -> host
READY = 9       # (READY, report_dict)                after INIT: protections in force
RESULT = 10     # (RESULT, result_dict, info_dict)
REQUEST = 11    # (REQUEST, op, ref, name, args, kwargs)

# REQUEST ops
OP_CALL = 0       # ref(*args, **kwargs)
OP_GETATTR = 1    # getattr(ref, name)
OP_METHOD = 2     # getattr(ref, name)(*args, **kwargs)
OP_SETATTR = 3    # setattr(ref, name, args[0])
OP_TRUTH = 4      # bool(ref)
OP_LIST = 5       # list(ref)
OP_OPERATOR = 6   # OPERATORS[name](ref, *args): ==, !=, <, hash(), os.fspath()

_HDR = struct.Struct("!I")
_BIG = 1 << 16
MAX_FRAME = (1 << 32) - 1


class PayloadError(Exception):
    """A message could not be turned into bytes (unpicklable or too large)."""


def dumps(msg: Any) -> bytes:
    try:
        return pickle.dumps(msg, protocol=5)
    except Exception as first:
        try:
            import cloudpickle
            return cloudpickle.dumps(msg, protocol=5)
        except Exception as exc:
            raise PayloadError(f"cannot pickle {type(exc).__name__}: {exc} (pickle said: {first})") from None


class Connection:
    """Framed messages over one connected stream socket (one per worker)."""

    __slots__ = ("sock", "fd", "_buf", "_poll", "_rcvtimeo")

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self.sock = sock
        self.fd = sock.fileno()
        self._buf = bytearray()
        self._poll: Optional[select.poll] = None
        self._rcvtimeo: Optional[float] = None

    # -- sending -------------------------------------------------------
    def send(self, msg: Any) -> int:
        """Pickle and send ``msg``; returns the payload size."""
        return self.send_bytes(dumps(msg))

    def send_bytes(self, data: bytes) -> int:
        n = len(data)
        if n > MAX_FRAME:
            raise PayloadError(f"message of {n} bytes is over the frame limit")
        if n < _BIG:
            self.sock.sendall(_HDR.pack(n) + data)
        else:
            self.sock.sendall(_HDR.pack(n))
            self.sock.sendall(data)
        return n

    # -- receiving -----------------------------------------------------
    def recv(self, timeout: Optional[float] = None) -> Any:
        """The next message.  Raises EOFError when the peer is gone,
        TimeoutError when ``timeout`` (seconds) passes first."""
        return pickle.loads(self.recv_bytes(timeout))

    def recv_bytes(self, timeout: Optional[float] = None) -> bytes:
        buf = self._buf
        while True:
            if len(buf) >= 4:
                n = _HDR.unpack_from(buf)[0]
                if len(buf) >= 4 + n:
                    data = bytes(buf[4:4 + n])
                    del buf[:4 + n]
                    return data
                if n >= _BIG:
                    return self._recv_big(n, timeout)
            chunk = self._recv(timeout)
            if not chunk:
                raise EOFError("peer closed the connection")
            buf += chunk

    def _recv_big(self, n: int, timeout: Optional[float]) -> bytes:
        # Large frames are read straight into their final buffer.
        out = bytearray(n)
        have = len(self._buf) - 4
        out[:have] = self._buf[4:]
        self._buf.clear()
        view = memoryview(out)
        while have < n:
            if timeout is not None:
                self._wait(timeout)
            got = self.sock.recv_into(view[have:], min(n - have, 1 << 24))
            if not got:
                raise EOFError("peer closed the connection")
            have += got
        return out

    def _recv(self, timeout: Optional[float]) -> bytes:
        # A timeout is a socket option (SO_RCVTIMEO), not a poll() before each
        # read: one syscall per message.  The option is only changed when it is
        # more than 10 ms off, so calls with the same timeout set it once.
        if timeout is None:
            if self._rcvtimeo is not None:
                self._set_rcvtimeo(None)
        elif timeout <= 0:
            raise TimeoutError
        elif self._rcvtimeo is None or abs(self._rcvtimeo - timeout) > 0.01:
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

    def _wait(self, timeout: float) -> None:
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.fd, select.POLLIN)
        if not self._poll.poll(max(0.0, timeout) * 1000.0):
            raise TimeoutError

    def readable_now(self) -> bool:
        """True if the peer sent something or hung up (an idle worker never does)."""
        if self._buf:
            return True
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.fd, select.POLLIN)
        return bool(self._poll.poll(0))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def pair() -> tuple[socket.socket, socket.socket]:
    """A connected AF_UNIX stream pair (a few percent faster than a pipe)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
