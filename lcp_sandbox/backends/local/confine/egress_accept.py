"""The egress proxy's serving threads: each waits on every listener at once and serves the
connection it accepts itself, so no connection waits for a hand-off between threads.

    listeners: each worker's own (in its network namespace: handed over once on its
    dialer), and the by-port listener ──► one epoll set; each listener armed for one
    wake-up at a time (EPOLLONESHOT), so one waiting thread is woken per connection

    a waiting thread, woken:  accept one connection (non-blocking), re-arm the listener,
                              start another thread if no other is left waiting
                              ──► serve(connection) to its end (blocking: a relay)
                              ──► wait again, or end if MAX_WAITING others already wait

Measured on a small GET through the proxy, a connection that a relay thread in the worker
passed to the host's event loop, which passed it on to a thread of a pool, waited for
three wake-ups before its head was read (benchmarks/egress.py); now it waits for one.

A listener is looked up and accepted on under the lock its removal takes, so a descriptor
number that is reused (a worker's listener closed, another's opened) never serves one
worker's connection as another's; it is taken out of the epoll set before it is closed (a
copy of it elsewhere, in a hostile worker, would keep it registered).  An accept that fails
with its connection still queued is not re-armed at once (_failed(): a thread would wake
for it again and again): short of descriptors, RETRY_S later; a socket that no longer
listens (shut down through a copy of it) is dropped.  listening_socket() checks what a
worker hands over as its listener.
"""
from __future__ import annotations

import errno
import logging
import os
import select
import socket
import stat
import threading
from typing import Any, Callable, Optional

from .egress_port import of_hosts_network

log = logging.getLogger("lcp_sandbox.egress")

#: Threads that may wait at once with nothing to serve (beyond, a thread that is done ends)
MAX_WAITING = 32
#: What a thread does with a connection it accepted: (the connection, its peer's address)
Serve = Callable[[socket.socket, Any], None]
#: Seconds before a listener is accepted on again after the host ran short (_SHORT)
RETRY_S = 0.1
_SHORT = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Acceptors:
    """Threads that accept on the listeners ``add()``-ed and serve what they accept."""

    def __init__(self) -> None:
        # (Linux's epoll: the proxy serves confined workers, which only Linux has)
        self._epoll = select.epoll()
        self._armed = select.EPOLLIN | select.EPOLLONESHOT
        # Written to once by close(): readable for good, it wakes every waiting thread
        self._stop_r, self._stop_w = os.pipe()
        self._epoll.register(self._stop_r, select.EPOLLIN)
        self._listeners: dict[int, tuple[socket.socket, Serve]] = {}
        self._lock = threading.Lock()
        self._waiting = 0
        self._alive = 0
        self._closed = False
        # Said once while accepts keep failing short of descriptors (not every RETRY_S)
        self._short_said = False

    def add(self, listener: socket.socket, serve: Serve) -> None:
        """Accept on ``listener`` (it is this object's now: remove() or close() closes it)."""
        listener.setblocking(False)
        with self._lock:
            if self._closed:
                listener.close()
                return
            self._listeners[listener.fileno()] = (listener, serve)
            self._epoll.register(listener.fileno(), self._armed)
            start = self._waiting == 0
            if start:
                self._count_new()
        if start:
            self._start()

    def remove(self, listener: socket.socket) -> None:
        """Accept no more on ``listener`` and close it (its connections being served go on)."""
        with self._lock:
            fd = listener.fileno()
            if fd >= 0 and self._listeners.get(fd, (None,))[0] is listener:
                del self._listeners[fd]
                self._epoll.unregister(fd)
            listener.close()

    def close(self) -> None:
        """Close every listener; waiting threads end now, serving ones when they are done
        (the last one out closes the epoll set)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for listener, _ in self._listeners.values():
                self._epoll.unregister(listener.fileno())
                listener.close()
            self._listeners.clear()
            os.write(self._stop_w, b"x")
            last = self._alive == 0
        if last:
            self._release()

    def _count_new(self) -> None:
        """(the lock held) one more thread, waiting from its start."""
        self._waiting += 1
        self._alive += 1

    def _start(self) -> None:
        threading.Thread(target=self._run, name="lcp-sandbox-egress-conn", daemon=True).start()

    def _run(self) -> None:
        while True:
            events = self._epoll.poll(-1, 1)
            with self._lock:
                self._waiting -= 1
                got = None if self._closed else self._accept(events)
                more = got is not None and self._waiting == 0
                if more:
                    self._count_new()
            if more:
                self._start()
            if got is not None:
                self._serve(*got)
            with self._lock:
                if not self._closed and self._waiting < MAX_WAITING:
                    self._waiting += 1
                    continue
                self._alive -= 1
                last = self._closed and self._alive == 0
            if last:
                self._release()
            return

    def _accept(self, events: list[tuple[int, int]]) -> Optional[tuple[Serve, socket.socket, Any]]:
        """(the lock held) the connection an event announced, and what serves it; the
        listener is armed again either way."""
        for fd, _ in events:
            entry = self._listeners.get(fd)
            if entry is None:
                continue
            listener, serve = entry
            try:
                conn, peer = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                # (another thread took it, or the client gave up: nothing waits)
                self._epoll.modify(fd, self._armed)
                continue
            except OSError as exc:
                self._failed(fd, listener, exc)
                continue
            self._epoll.modify(fd, self._armed)
            self._short_said = False
            return serve, conn, peer
        return None

    def _failed(self, fd: int, listener: socket.socket, exc: OSError) -> None:
        """(the lock held) an accept that failed with the connection still waiting, or on a
        socket that no longer listens: re-armed now, either would wake a thread again at
        once, for ever.  Short of descriptors or memory, the listener is armed again
        RETRY_S later; any other error (EINVAL: it listens no more) ends it."""
        if exc.errno in _SHORT:
            if not self._short_said:
                self._short_said = True
                log.warning("egress proxy: connections wait, not accepted (%s); tried again "
                            "every %g s", exc, RETRY_S)
            timer = threading.Timer(RETRY_S, self._rearm, (fd, listener))
            timer.daemon = True
            try:
                timer.start()
            except RuntimeError:
                # (no thread to wait with: armed now, as the host's memory allows)
                self._epoll.modify(fd, self._armed)
            return
        log.warning("egress proxy: a listener is no longer accepted on (%s)", exc)
        del self._listeners[fd]
        self._epoll.unregister(fd)
        listener.close()

    def _rearm(self, fd: int, listener: socket.socket) -> None:
        with self._lock:
            if self._listeners.get(fd, (None,))[0] is listener:
                self._epoll.modify(fd, self._armed)

    @staticmethod
    def _serve(serve: Serve, conn: socket.socket, peer: Any) -> None:
        try:
            serve(conn, peer)
        except Exception:                                   # noqa: BLE001 (a bug: say it)
            log.exception("egress proxy: serving a connection failed")
            conn.close()

    def _release(self) -> None:
        self._epoll.close()
        os.close(self._stop_r)
        os.close(self._stop_w)


def listening_socket(fd: int) -> Optional[socket.socket]:
    """A descriptor a worker handed over as its listener, as a socket to accept on: if it is
    a listening TCP socket (IPv4) made in a network namespace other than the host's (as far
    as the kernel tells; else a stranger on the host could reach it); else closed."""
    try:
        sock = socket.socket(fileno=fd) if stat.S_ISSOCK(os.fstat(fd).st_mode) else None
    except OSError:
        sock = None
    if sock is None:
        os.close(fd)
        return None
    try:
        if (sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
                and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                and not of_hosts_network(sock)):
            return sock
    except OSError:
        pass
    sock.close()
    return None
