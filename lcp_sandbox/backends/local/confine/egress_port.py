"""The egress proxy by port: for workers with no network namespace of their own.

A worker a default container keeps in the host's network (unshare refused) reaches the
proxy by port (worker/confine/egress_dial.py says why this holds; protocol/dialer.py, what the
dialer carries):

    worker (the host's network; Landlock: TCP connect    host process (EgressProxy.by_port)
    to port P only, bind none; no socket of its own)
    its dialer: ASK_PORT with a socket it made ────────► the port, if that socket is of the
                                                          proxy's network namespace (its
                                                          SO_NETNS_COOKIE); else 0
    socket.socket() ──── on its dialer: ASK_SOCKET ────► makes a TCP socket, binds it to
                    ◄─── that socket (SCM_RIGHTS) ─────── 127.0.0.1 and keeps it (at most
                                                          the proxy's max_per_worker a
                                                          dialer: the oldest is let go)
    connect(127.0.0.1:P) ──TCP────────────────────────► the listener (0.0.0.0:P, opened when
                                                          a worker first proves itself):
                                                          served as the worker that was
                                                          handed the socket whose peer is this
                                                          connection's own end; any other
                                                          connection is closed unread

Only a worker that proved it is in the host's network gets the port or a socket: a socket of
the host's network in a namespace of its own (no Landlock rule holds its ports there) would
reach every port of the host's loopback.  The listener takes P on every IPv4 address, so no
other process of the host can listen at P on another address for a worker to reach.
"""
from __future__ import annotations

import os
import socket
import stat
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Optional, TypeVar

from ....protocol.dialer import A_SOCKET, NO_SOCKET

# SOL_SOCKET's SO_NETNS_COOKIE (Linux 5.14; the same number on every architecture the
# engine filters)
_SO_NETNS_COOKIE = 71
#: Whose a connection is (egress_proxy.py's Identity), and a connection being served (its
#: _Connection): this module knows them by these names only
Who = TypeVar("Who")
Conn = TypeVar("Conn")


@dataclass(eq=False)
class Handed(Generic[Who, Conn]):
    """What came through one dialer: its worker's identity, its connections being served,
    whether it proved it is in the host's network, the sockets handed to it and not
    yet connected, by their port, (a worker in a namespace of its own) its listener, and
    whether the dialer ended (its worker is gone: a connection of it is served no more)."""
    ident: Who
    came: set[Conn]
    sockets: dict[int, socket.socket] = field(default_factory=dict)
    by_port: bool = False
    listener: Optional[socket.socket] = None
    ended: bool = False

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close()
        self.sockets.clear()


class ByPort(Generic[Who, Conn]):
    """The proxy's listener for workers in the host's network, and the sockets it handed
    them.  ``take`` serves a connection; ``cap()`` is how many sockets one dialer may hold
    unconnected."""

    def __init__(self, take: Callable[["Handed[Who, Conn]", socket.socket], None],
                 cap: Callable[[], int],
                 listen: Callable[[socket.socket, Callable[[socket.socket, Any], None]], None]
                 ) -> None:
        self._take = take
        self._cap = cap
        # (egress_accept.Acceptors.add) the proxy's threads accept on a listener
        self._listen = listen
        self._lock = threading.Lock()
        self.listener: Optional[socket.socket] = None
        # the sockets handed and not yet connected, by their port
        self.kept: dict[int, Handed[Who, Conn]] = {}

    def prove(self, handed: Handed[Who, Conn], fds: list[int]) -> None:
        """(ASK_PORT came with ``fds``, all closed here) the first a socket of the proxy's own
        network namespace: its dialer's worker is in the host's network."""
        handed.by_port = handed.by_port or _in_hosts_network(fds)

    def send_port(self, dialer: socket.socket, handed: Handed[Who, Conn]) -> None:
        """Tell a worker in the host's network the listener's port (opened now if it is
        not); 0 to one that did not prove it."""
        if not handed.by_port:
            _send(dialer, b"0\n")
            return
        if self.listener is None:
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tcp.bind(("0.0.0.0", 0))
            tcp.listen(512)
            self.listener = tcp
            self._listen(tcp, self._connection)
        _send(dialer, b"%d\n" % self.listener.getsockname()[1])

    def hand(self, dialer: socket.socket, handed: Handed[Who, Conn]) -> None:
        """A new TCP socket for the worker of ``handed``, bound to 127.0.0.1 (it reaches no
        address but the host's own), kept here to know its connection by; the oldest kept
        beyond cap() is let go (a connection from it is then refused)."""
        if not handed.by_port:
            _send(dialer, NO_SOCKET)
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", 0))
        except OSError:
            sock.close()
            _send(dialer, NO_SOCKET)
            return
        port = sock.getsockname()[1]
        # Kept before it is sent: the proxy's threads may accept its connection at once
        with self._lock:
            handed.sockets[port] = sock
            self.kept[port] = handed
            while len(handed.sockets) > self._cap():
                oldest = next(iter(handed.sockets))
                self.kept.pop(oldest, None)
                handed.sockets.pop(oldest).close()
        try:
            socket.send_fds(dialer, [A_SOCKET], [sock.fileno()], socket.MSG_NOSIGNAL)
        except OSError:
            with self._lock:
                if handed.sockets.get(port) is sock:
                    del self.kept[port], handed.sockets[port]
            sock.close()
            _send(dialer, NO_SOCKET)

    def forget(self, handed: Handed[Who, Conn]) -> None:
        """A dialer ended: the sockets its worker was handed are let go."""
        with self._lock:
            for port in handed.sockets:
                self.kept.pop(port, None)
            handed.close()

    def _connection(self, conn: socket.socket, peer: Any) -> None:
        """A connection on the listener: served as the worker that was handed the socket it
        comes from (that socket's peer is this connection's own end: no other socket has
        the same pair of ends); any other is closed unread."""
        with self._lock:
            handed = self.kept.get(peer[1]) if peer[0] == "127.0.0.1" else None
            sock = handed.sockets.get(peer[1]) if handed is not None else None
            try:
                same = sock is not None and (sock.getpeername() == conn.getsockname()
                                             and sock.getsockname() == conn.getpeername())
            except OSError:
                same = False
            if handed is not None and sock is not None and same:
                del self.kept[peer[1]], handed.sockets[peer[1]]
        if handed is None or sock is None or not same:
            conn.close()
            return
        sock.close()
        self._take(handed, conn)


def _send(dialer: socket.socket, data: bytes) -> None:
    """A short answer on a dialer (a worker that does not read its answers loses them)."""
    try:
        dialer.send(data, socket.MSG_NOSIGNAL)
    except OSError:
        pass


def _netns_cookie(sock: socket.socket) -> Optional[bytes]:
    """The cookie of the network namespace ``sock`` was made in, or None."""
    try:
        return sock.getsockopt(socket.SOL_SOCKET, _SO_NETNS_COOKIE, 8)
    except OSError:
        return None


def of_hosts_network(sock: socket.socket) -> bool:
    """Whether ``sock`` was made in the proxy's own network namespace (False where the
    kernel does not say: SO_NETNS_COOKIE is Linux 5.14's)."""
    theirs = _netns_cookie(sock)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as own:
        return theirs is not None and theirs == _netns_cookie(own)


def _in_hosts_network(fds: list[int]) -> bool:
    """Whether the first of ``fds`` (all closed here) is a socket made in the proxy's own
    network namespace: a worker's proof that it has none of its own (a worker in a
    namespace of its own makes no socket of the host's network)."""
    proved = False
    for i, fd in enumerate(fds):
        try:
            if i == 0 and stat.S_ISSOCK(os.fstat(fd).st_mode):
                with socket.socket(fileno=os.dup(fd)) as sock:
                    proved = of_hosts_network(sock)
        except OSError:
            pass
        os.close(fd)
    return proved
