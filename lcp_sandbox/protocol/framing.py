"""Frames on a connected stream socket: the host's reads are bounded by size and deadline."""
from __future__ import annotations

import select
import socket
import struct
import time
from typing import Any, Optional

from .codec import Decoder, dumps
from .messages import HEADER as _HDR
from .messages import BadMessage, PayloadError

_BIG = 1 << 16
# Not on Windows: see portable_framing.py.
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)


class Connection:
    """Framed messages over one connected stream socket (one per worker).

    ``recv_frame`` reads one whole frame by an absolute deadline: a peer that
    trickles bytes cannot stretch a read past it.  A frame cut short by a
    timeout stays buffered and the next read continues it.  ``spin`` polls for
    the next bytes for a bounded window before a read would sleep."""

    __slots__ = ("sock", "fd", "_buf", "_big", "_poll", "_rcvtimeo", "_spun", "decoder", "broken",
                 "_held")
    #: Flags of a read or send that must not wait (protocol/portable_framing.py: 0 on a
    #: socket kept non-blocking, where MSG_DONTWAIT does not exist or is not used).
    _NOWAIT = _DONTWAIT

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self.sock = sock
        self.fd = sock.fileno()
        self._buf = bytearray()
        # [kind, bytearray, bytes read] of a large frame.
        self._big: Optional[list[Any]] = None
        self._poll: Optional[select.poll] = None
        self._rcvtimeo: Optional[float] = None
        # What spin() read, for the next read.
        self._spun: Optional[bytes] = None
        self.decoder = Decoder()
        # Set once the peer broke the protocol.
        self.broken: Optional[str] = None
        # Frames that go out with the next send.
        self._held = b""

    # -- sending -------------------------------------------------------
    def send(self, kind: int, msg: tuple[Any, ...] = (), deadline: Optional[float] = None) -> int:
        """Pickle and send a host -> worker message; returns the payload size."""
        return self.send_frame(kind, dumps(msg) if msg else b"", deadline)

    def hold(self, kind: int, msg: tuple[Any, ...]) -> None:
        """Pickle a message now (PayloadError now) and send it with the next one: one
        send, so the peer wakes once for both."""
        body = dumps(msg)
        if len(body) >= _BIG:
            raise PayloadError(f"a held message of {len(body)} bytes")
        self._held += _HDR.pack(len(body), kind) + body

    def send_frame(self, kind: int, body: bytes, deadline: Optional[float] = None) -> int:
        """Send one frame (after the held ones).  A peer that stops reading cannot hold
        the sender past ``deadline`` (time.monotonic()): TimeoutError, and the
        connection is broken (part of the frame may have gone)."""
        n = len(body)
        held, self._held = self._held, b""
        if held and n >= _BIG:
            self._send_all(held, deadline)
            held = b""
        if n < _BIG:
            data = held + _HDR.pack(n, kind) + body
            # The common case: one non-blocking send takes the whole frame.
            try:
                sent = self.sock.send(data, self._NOWAIT)
            except BlockingIOError:
                sent = 0
            if sent < len(data):
                self._send_all(data, deadline, sent)
            return n
        if n >= 1 << 32:
            raise PayloadError(f"message of {n} bytes is over the frame limit")
        self._send_all(_HDR.pack(n, kind), deadline)
        self._send_all(body, deadline)
        return n

    def _send_all(self, data: bytes, deadline: Optional[float], sent: int = 0) -> None:
        # Non-blocking sends; when the socket's buffer is full, wait for room by the deadline.
        view = memoryview(data)
        n = len(data)
        while sent < n:
            try:
                sent += self.sock.send(view[sent:], self._NOWAIT)
                continue
            except BlockingIOError:
                pass
            poll = select.poll()
            poll.register(self.fd, select.POLLOUT)
            wait = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000.0
            if not poll.poll(wait):
                self.broken = "it did not read the host's messages before the call's deadline"
                raise TimeoutError(self.broken)

    def send_encoded(self, frame: bytes) -> None:
        """Send a frame made by Encoder.encode (header included)."""
        self.sock.sendall(frame)

    # -- receiving -----------------------------------------------------
    def recv_frame(self, deadline: Optional[float] = None,
                   caps: Optional[dict[int, int]] = None) -> tuple[int, bytes]:
        """The next (kind, payload).  EOFError when the peer is gone, TimeoutError
        at ``deadline`` (time.monotonic()); with ``caps`` (kind -> max bytes) a kind
        not in it, or a length over its cap, raises BadMessage unread."""
        if self.broken:
            raise BadMessage(self.broken)
        big = self._big
        if big is not None:
            return self._recv_big(big, deadline)
        buf = self._buf
        while True:
            if len(buf) >= 5:
                n, kind = _HDR.unpack_from(buf)
                if caps is not None:
                    self._check(kind, n, caps)
                if len(buf) >= 5 + n:
                    data = bytes(buf[5:5 + n])
                    del buf[:5 + n]
                    return kind, data
                if n >= _BIG:
                    out = bytearray(n)
                    have = len(buf) - 5
                    out[:have] = buf[5:]
                    buf.clear()
                    big = self._big = [kind, out, have]
                    return self._recv_big(big, deadline)
            chunk = self._recv(deadline)
            if not chunk:
                raise EOFError("peer closed the connection")
            # The common case: one read, one whole frame.
            if not buf and len(chunk) >= 5:
                n, kind = _HDR.unpack_from(chunk)
                if len(chunk) == 5 + n:
                    # A call only to fail.
                    if caps is not None and not n <= caps.get(kind, -1):
                        self._check(kind, n, caps)
                    return kind, chunk[5:]
            buf += chunk

    def _check(self, kind: int, n: int, caps: dict[int, int]) -> None:
        cap = caps.get(kind)
        if cap is None:
            self.broken = f"a message of kind {kind} it may not send now"
            raise BadMessage(self.broken)
        if n > cap:
            self.broken = f"a frame of {n} bytes announced, over the {cap}-byte cap of its kind"
            raise BadMessage(self.broken)

    def _recv_big(self, big: list[Any], deadline: Optional[float]) -> tuple[int, bytes]:
        # Large frames are read straight into their final buffer (``big`` is self._big).
        kind, out, have = big
        view = memoryview(out)
        n = len(out)
        while have < n:
            got = self._recv_into(view[have:], min(n - have, 1 << 24), deadline)
            if not got:
                raise EOFError("peer closed the connection")
            have += got
            big[2] = have
        self._big = None
        return kind, out

    def _recv_into(self, buf: memoryview, nbytes: int, deadline: Optional[float]) -> int:
        if deadline is not None:
            self._wait(deadline)
        return self.sock.recv_into(buf, nbytes)

    def _recv(self, deadline: Optional[float]) -> bytes:
        # A timeout is a socket option (SO_RCVTIMEO), not a poll() before each
        # read: one syscall per message.  The option is only changed when it is
        # more than 10 ms off, so calls with the same timeout set it once.
        spun = self._spun
        if spun is not None:
            self._spun = None
            return spun
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

    def spin(self, until: float) -> bool:
        """Poll for the peer's next bytes, without sleeping, until ``until``
        (time.monotonic()): True as soon as there are some (or the peer hung up),
        False when the window passed.  What it reads is kept for recv_frame (a
        non-blocking read per turn: when the bytes come, no second syscall)."""
        if self._buf or self._big is not None or self._spun is not None:
            return True
        recv, clock, flags = self.sock.recv, time.monotonic, self._NOWAIT
        while True:
            try:
                self._spun = recv(_BIG, flags)
                return True
            except BlockingIOError:
                if clock() >= until:
                    return False
            except OSError:
                # recv_frame's read says what.
                return True

    def readable_now(self) -> bool:
        """True if the peer sent something or hung up (an idle worker never does)."""
        return self.pending() or bool(self._poller().poll(0))

    def pending(self) -> bool:
        """Bytes already read that belong to no message yet."""
        return bool(self._buf) or self._big is not None or self._spun is not None

    def sent_while_idle(self) -> bool:
        """True if the peer sent bytes (not just hung up) when it had nothing to say."""
        if self._buf or self._big is not None or self._spun:
            return True
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK | self._NOWAIT))
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
