"""Frames on a socket with only what every OS has: the spawn path's connection.

``Connection`` (framing.py) reads with ``SO_RCVTIMEO``, sends with ``MSG_DONTWAIT`` and
waits with ``select.poll``: Linux (and mostly POSIX) only.  ``PortableConnection``
keeps every frame rule of it (the same ``recv_frame``: kinds and sizes checked before
allocation, a whole frame by the call's deadline, held frames, spin) and changes only
how one read or send waits:

    at rest        the socket is non-blocking (``settimeout(0.0)``): a read or send
                   that cannot go on at once raises BlockingIOError, as MSG_DONTWAIT's
    a wait         ``settimeout(what is left of the deadline)`` (None: no deadline) for
                   that one read or send, then back to non-blocking; Python implements
                   socket timeouts on every OS (poll, or select on Windows)
    peek           ``MSG_PEEK`` on the non-blocking socket (readable_now, sent_while_idle)

Before any frame, a spawned worker sends one byte, ``BOOTED``, once it is up.

Used at both ends of a spawned worker's channel (backends/local/spawn.py and
worker/spawned.py); the zygote path keeps ``Connection``.
"""
from __future__ import annotations

import functools
import socket
import time
from typing import Callable, Optional, TypeVar

from .framing import _BIG, Connection

T = TypeVar("T")

# A spawned worker's first byte on its channel, before any frame: its interpreter and the
# engine are up.  The host reads it before it hands that worker out (backends/local/spawn.py).
BOOTED = b"\x06"


class PortableConnection(Connection):
    __slots__ = ()
    # The socket itself is non-blocking at rest.
    _NOWAIT = 0

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        sock.setblocking(False)

    def _waiting(self, op: Callable[[], T], deadline: Optional[float]) -> T:
        """``op()`` (a read or send) now if it can go on, else with the socket waiting
        until ``deadline`` (TimeoutError then)."""
        try:
            return op()
        except BlockingIOError:
            pass
        timeout = None
        if deadline is not None:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise TimeoutError
        self.sock.settimeout(timeout)
        try:
            return op()
        finally:
            self.sock.settimeout(0.0)

    def _send_all(self, data: bytes, deadline: Optional[float], sent: int = 0) -> None:
        view = memoryview(data)[sent:]
        try:
            # Each send waits for room by the deadline.
            while view:
                view = view[self._waiting(functools.partial(self.sock.send, view), deadline):]
        except TimeoutError:
            self.broken = "it did not read the host's messages before the call's deadline"
            raise TimeoutError(self.broken) from None

    def send_encoded(self, frame: bytes) -> None:
        self._send_all(frame, None)

    def _recv(self, deadline: Optional[float]) -> bytes:
        spun = self._spun
        if spun is not None:
            self._spun = None
            return spun
        if deadline is not None and deadline <= time.monotonic():
            # (as Connection._recv) Bytes already there do not extend a read past its
            # deadline: a worker whose next request is always ready would hold it for ever.
            raise TimeoutError
        return self._waiting(lambda: self.sock.recv(_BIG), deadline)

    def _recv_into(self, buf: memoryview, nbytes: int, deadline: Optional[float]) -> int:
        return self._waiting(lambda: self.sock.recv_into(buf, nbytes), deadline)

    def readable_now(self) -> bool:
        if self.pending():
            return True
        try:
            # Bytes, or b"" at EOF: either way.
            self.sock.recv(1, socket.MSG_PEEK)
            return True
        except BlockingIOError:
            return False
        except OSError:
            return True


def portable_pair() -> tuple[socket.socket, socket.socket]:
    """A connected stream pair (AF_UNIX where the OS has it, else loopback TCP)."""
    return socket.socketpair()
