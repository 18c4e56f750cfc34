"""The egress proxy by port: for workers with no network namespace of their own.

Which way a worker reaches the proxy is the host's decision, made when it builds the
worker's INIT (worker_network(): a network namespace of its own wherever the host can make
one, else by port) and recorded with the worker's token; nothing the worker sends changes
it.  A worker the host sent by port is in the host's network (worker/confine/egress_dial.py
says why this holds; protocol/dialer.py, what the dialer carries):

    worker (the host's network; Landlock: TCP connect    host process (EgressProxy.by_port)
    to port P only, bind none; no socket of its own)
    its dialer: ASK_PORT ──────────────────────────────► the port, if the host's record of
                                                          its token says "by port"; else 0
    socket.socket() ──── on its dialer: ASK_SOCKET ────► (the same record) makes a TCP
                    ◄─── that socket (SCM_RIGHTS) ─────── socket, binds it to 127.0.0.1 and
                                                          keeps it (at most the proxy's
                                                          max_per_worker a dialer: the
                                                          oldest is let go)
    connect(127.0.0.1:P) ──TCP────────────────────────► the listener (0.0.0.0:P, open while
                                                          a by-port worker's dialer is):
                                                          served as the worker that was
                                                          handed the socket whose peer is this
                                                          connection's own end; any other
                                                          connection is closed unread

A socket of the host's network in a namespace of its own (no Landlock rule holds its ports
there) would reach every port of the host's loopback: so only a worker the host itself sent
by port gets the port or a socket, and a descriptor a worker offers proves nothing (every
descriptor a worker holds was made by the host).  The listener takes P on every IPv4
address: a worker's socket bound to 127.0.0.1 can reach each address of the host, so no
other process of the host may listen at P on another one (docs/network.md: what a peer
beyond the host can do with it).
"""
from __future__ import annotations

import functools
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Optional, TypeVar

from ....core.policy import SWITCHED_OFF
from ....protocol.dialer import A_SOCKET, NO_SOCKET
from ...boot import boot_environment

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
    whether the host sent its worker by port (the host's record of its token, never
    changed by the worker), the sockets handed to it and not yet connected, by their
    port, (a worker in a namespace of its own) its listener, and whether the dialer ended
    (its worker is gone: a connection of it is served no more)."""
    ident: Who
    came: set[Conn]
    by_port: bool = False
    sockets: dict[int, socket.socket] = field(default_factory=dict)
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
                 listen: Callable[[socket.socket, Callable[[socket.socket, Any], None]], None],
                 unlisten: Callable[[socket.socket], None]) -> None:
        self._take = take
        self._cap = cap
        # (egress_accept.Acceptors.add) the proxy's threads accept on a listener
        self._listen = listen
        self._lock = threading.Lock()
        # (egress_accept.Acceptors.remove) they accept on it no more, and it is closed
        self._unlisten = unlisten
        self._lock = threading.Lock()
        self.listener: Optional[socket.socket] = None
        # the dialers of workers sent by port, open now: the listener lives while one is
        self._dialers: set[int] = set()
        # the sockets handed and not yet connected, by their port
        self.kept: dict[int, Handed[Who, Conn]] = {}

    def send_port(self, dialer: socket.socket, handed: Handed[Who, Conn]) -> None:
        """Tell a worker the host sent by port the listener's port (opened now if it is
        not); 0 to any other."""
        if not handed.by_port:
            _send(dialer, b"0\n")
            return
        with self._lock:
            self._dialers.add(id(handed))
            if self.listener is None:
                tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                tcp.bind(("0.0.0.0", 0))
                tcp.listen(512)
                self.listener = tcp
                self._listen(tcp, self._connection)
            port = self.listener.getsockname()[1]
        _send(dialer, b"%d\n" % port)

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
        """A dialer ended: the sockets its worker was handed are let go, and the listener
        with the last by-port dialer (no port of the host stays open for no worker)."""
        with self._lock:
            for port in handed.sockets:
                self.kept.pop(port, None)
            handed.close()
            self._dialers.discard(id(handed))
            listener = self.listener if not self._dialers else None
            if listener is not None:
                self.listener = None
        if listener is not None:
            self._unlisten(listener)

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


@functools.lru_cache(maxsize=1)
def _namespaces_made() -> str:
    """"" where a process the host starts can make a network namespace of its own (as a
    worker does: worker/confine/network.py, at once or in a user namespace of its own),
    else why not; asked once, of a fresh interpreter with the host's privileges and
    system call filter (which every worker inherits)."""
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE], env=boot_environment(),
                              capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the host's probe did not run: {exc}"
    if done.returncode == 0:
        return ""
    said = done.stdout.decode("utf-8", "replace").strip()[:200]
    return f"unshare: {said or f'the probe ended with status {done.returncode}'}"


#: worker/confine/network.py's two tries, in a process that then ends
_PROBE = """import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x40000000) and libc.unshare(0x10000000 | 0x40000000):
    sys.stdout.write(os.strerror(ctypes.get_errno()))
    sys.exit(1)
"""


def worker_network(disabled: Iterable[str]) -> str:
    """The host's decision, for a confined worker with a network policy: "" for a network
    namespace of its own (the proxy then takes its listener and hands it no socket of the
    host's network), else why it has none (it is then sent to the proxy by port).
    ``disabled``: the switches its INIT carries (lcp_sandbox.testing)."""
    if "netns" in disabled:
        return SWITCHED_OFF
    why = _namespaces_made()
    return f"not made (the host cannot make one for its workers: {why})" if why else ""
