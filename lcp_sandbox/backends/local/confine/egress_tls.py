"""An intercepted connection's two TLS ends, relayed with TLS done in memory (ssl.MemoryBIO)
and the sockets read and written in large pieces.

    worker socket ─ recv (≤ BATCH) ─► its incoming BIO ─ SSLObject.read ─► feed(): the head
        swapped ─► the server end's SSLObject.write ─► its outgoing BIO ─ one send ─► server
    server socket ─ recv (≤ BATCH) ─► ... ─► the worker end's SSLObject.write ─► one send

Why in memory: an SSLSocket reads a TLS record (16 KiB) in two recv()s and sends each record
in a send() of its own, so a 50 MB body cost the proxy some 10,000 system calls and as many
loopback segments (half of its time was the kernel's).  Here a recv or a send moves up to
BATCH bytes.
"""
from __future__ import annotations

import select
import socket
import ssl
import time
from typing import Callable, Optional, Union, cast

#: What one direction reads from its socket, and decrypts, before it sends on
BATCH = 1024 * 1024
#: What a handshake reads at a time (its messages are a few KiB)
HANDSHAKE_READ = 64 * 1024


class TlsEnd:
    """One side of an intercepted connection: its socket and its TLS, in memory."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, *, server_side: bool,
                 server_hostname: Optional[str] = None) -> None:
        self.sock = sock
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self._in, self._out, server_side=server_side,
                                    server_hostname=server_hostname)

    def handshake(self, timeout_s: float) -> None:
        """The TLS handshake, within ``timeout_s`` (OSError, ssl.SSLError: it failed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.tls.do_handshake()
                self._flush_blocking(deadline)
                return
            except ssl.SSLWantReadError:
                pass
            self._flush_blocking(deadline)
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            data = self.sock.recv(HANDSHAKE_READ)
            if not data:
                raise ConnectionError("the peer closed its end during the TLS handshake")
            self._in.write(data)

    def _flush_blocking(self, deadline: float) -> None:
        if self._out.pending:
            self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            self.sock.sendall(self._out.read())

    def plaintext(self, raw: memoryview, plain: memoryview) -> tuple[memoryview, bool]:
        """What the socket holds now (read into ``raw``), decrypted into ``plain``: (the
        plaintext, whether this end ended).  The socket is non-blocking."""
        ended = False
        size = 0
        while size < len(raw):
            try:
                got = self.sock.recv_into(raw[size:])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                ended = True
                break
            if not got:
                ended = True
                break
            size += got
        if size:
            self._in.write(raw[:size])
        if ended:
            self._in.write_eof()
        size, closed = self._decrypt(plain)
        return plain[:size], ended or closed

    def _decrypt(self, plain: memoryview) -> tuple[int, bool]:
        """Decrypts into ``plain`` what TLS can (a record a read): (how many bytes, whether
        the peer closed)."""
        size = 0
        while size < len(plain):
            try:
                # (with a buffer, read() answers how many bytes it wrote there)
                got = cast(int, self.tls.read(len(plain) - size, plain[size:]))
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return size, False
            except ssl.SSLError:
                # (close_notify, a truncated or a forged record: the connection ends)
                return size, True
            if not got:
                return size, True
            size += got
        return size, False

    def write(self, data: Union[bytes, memoryview]) -> bool:
        """``data`` encrypted into the outgoing buffer (flush() sends it): False when TLS
        has ended."""
        try:
            self.tls.write(data)
        except ssl.SSLError:
            return False
        return True

    def flush(self) -> bool:
        """What TLS wrote sent whole on the non-blocking socket (waiting while it cannot
        take more): False when the socket ended."""
        if not self._out.pending:
            return True
        view = memoryview(self._out.read())
        while view:
            try:
                view = view[self.sock.send(view):]
            except (BlockingIOError, InterruptedError):
                select.select([], [self.sock], [], 1.0)
            except OSError:
                return False
        return True


def relay(worker: TlsEnd, server: TlsEnd, feed: Callable[[bytes], bytes]) -> None:
    """Both ways until either side ends: the worker's plaintext through ``feed`` (which may
    raise: the caller answers), the server's as it comes."""
    worker.sock.setblocking(False)
    server.sock.setblocking(False)
    ends = {worker.sock.fileno(): (worker, server), server.sock.fileno(): (server, worker)}
    poll = select.poll()
    for fd in ends:
        poll.register(fd, select.POLLIN)
    raw, plain = memoryview(bytearray(BATCH)), memoryview(bytearray(BATCH))
    # (a handshake's last read may have brought the first request, or data, with it)
    ready: list = list(ends)
    while all(_pass(*ends[fd], worker, raw, plain, feed) for fd in ready):
        ready = [fd for fd, _ in poll.poll()]


def _pass(end: TlsEnd, other: TlsEnd, worker: TlsEnd, raw: memoryview, plain: memoryview,
          feed: Callable[[bytes], bytes]) -> bool:
    """What ``end`` has now, passed on to ``other``: False when the connection ends."""
    while True:
        data, ended = end.plaintext(raw, plain)
        decrypted = len(data)
        if end is worker and decrypted:
            data = memoryview(feed(bytes(data)))
        if len(data) and not other.write(data):
            return False
        # (end's own TLS may have answered something: a key update)
        if not (other.flush() and end.flush()) or ended:
            return False
        if decrypted < len(plain):
            return True
