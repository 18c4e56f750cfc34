"""A confined worker with a network policy: its way to the host's egress proxy.

In the worker's own network namespace (loopback only), before it confines itself:

    dial_from_namespace()  connects to the host's proxy socket (a unix socket, reachable
                           now; the system call filter refuses new unix sockets later) and
                           sends its token; listens on 127.0.0.1 (an ephemeral port of its
                           own namespace) and hands that listener to the proxy (SCM_RIGHTS),
                           whose threads accept on it: no byte of the traffic passes through
                           the worker, and the worker runs no thread for it; announces it as
                           HTTP_PROXY, HTTPS_PROXY, ALL_PROXY (and their lower-case forms;
                           NO_PROXY empty), so HTTP clients use it unchanged

Where the host found it cannot make one (a default container refuses unshare: INIT's
egress "no_namespace" says why), the worker makes none: it is in the host's network, and
the proxy is reached by port instead (Landlock ABI 4+):

    dial_by_port()     connects the dialer and sends the token as above, then asks the proxy
                       for its TCP port P (the proxy listens on it for such workers only:
                       the host decided the way, and recorded it with the token), and
                       announces http://127.0.0.1:P; the caller then applies Landlock's
                       TCP rules (connect to P only, bind nothing, landlock.restrict_tcp())
                       and the system call filter that refuses every new socket but
                       NETLINK_ROUTE (no TCP, UDP, raw, packet or unix socket of its own)
    start_supply()     (once the worker is confined) installs supply(): ``socket.socket()``
                       of the worker's Python asks the proxy, on the dialer, for each new
                       TCP socket.  The proxy makes it, binds it to 127.0.0.1 and hands
                       it over (SCM_RIGHTS)

Why sockets from the proxy: Landlock restricts the port of a connect, not its address, so a
socket of the worker's own could reach any host of the world at port P.  A socket bound to
127.0.0.1 can only reach the host's own addresses (the kernel refuses a loopback source to
any other: EINVAL), and on those, P is the proxy's on every address (it listens on
0.0.0.0:P, so no other process can take P on another address of the host).  The proxy
knows the worker by the socket: a connection is served only if it comes from a socket it
handed to that worker and still holds (the same socket: its peer is the proxy's end), so
no other process, tenant or worker can speak for it.  A program that makes its sockets
itself (a C library, a subprocess such as curl) gets EACCES: it fails, it does not leak.

The proxy (backends/local/confine/egress_proxy.py) decides; this side holds nothing a tool
could bend: a tool that uses the dialer itself only reaches the same proxy under the same policy.
"""
from __future__ import annotations

import errno
import os
import socket
import threading
from typing import Any, Union

from ...core.policy import SWITCHED_OFF
from ...protocol.dialer import A_SOCKET, ASK_PORT, ASK_SOCKET, LISTENER, NO_SOCKET
from .landlock import NET_ABI, landlock_abi, restrict_tcp

_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
#: Where Python's ssl (and so urllib, httpx), requests and curl look for the CAs to trust
_CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
#: (in its own namespace) the dialer, open while the worker lives: its end tells the proxy
#: that the worker's connections end
_DIALER: list[socket.socket] = []
#: (by port) the dialer the worker's new TCP sockets come through, until start_supply()
_SUPPLY: list[socket.socket] = []
_SUPPLY_LOCK = threading.Lock()
#: (by port) the proxy's TCP port, the one Landlock's TCP rules will let it connect to
BY_PORT: list[int] = []
_ANSWER_S = 10.0
_TYPE_MASK = 0xF


def dial_from_namespace(egress: dict, rules: int) -> str:
    """Dial the proxy, hand it a listener of this namespace, announce that listener: what
    stats() says."""
    try:
        dialer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dialer.connect(egress["socket"])
        dialer.sendall(egress["token"].encode("ascii") + b"\n")
        # (the proxy's copy is the one accepted on: this one closes)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
            socket.send_fds(dialer, [LISTENER], [listener.fileno()])
            port = listener.getsockname()[1]
    except OSError as exc:
        return f"unavailable (the host's egress proxy cannot be reached: {exc})"
    url = _announce(port)
    _DIALER[:] = [dialer]
    return (f"policy ({rules} rules: own network namespace, loopback only; egress only "
            f"through the host's proxy, {url})")


def _announce(port: int) -> str:
    """HTTP_PROXY and the rest name the proxy at 127.0.0.1:``port``: the URL."""
    url = f"http://127.0.0.1:{port}"
    for name in _PROXY_VARIABLES:
        os.environ[name] = os.environ[name.lower()] = url
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = ""
    return url


def policy_network(egress: dict, rules: int, namespace: str, landlock_off: bool) -> str:
    """A network policy's report, the way the host chose (``egress["no_namespace"]``): in
    a namespace of its own, dial_from_namespace()'s (``namespace``: isolate_network()'s
    report; unavailable if it failed); by port (dial_by_port(); BY_PORT then holds the
    port, for hold_tcp()) if Landlock has TCP rules (ABI 4+): else neither holds, and the
    report names both."""
    if not egress.get("no_namespace"):
        if namespace.startswith("on"):
            return dial_from_namespace(egress, rules)
        return (f"unavailable (a network policy in a network namespace of its own, as the "
                f"host found it can make: {namespace})")
    abi = 0 if landlock_off else landlock_abi()
    if abi < NET_ABI:
        landlock = (SWITCHED_OFF if landlock_off else
                    f"Landlock ABI {abi}, whose rules have no TCP ports" if abi else
                    "a kernel without Landlock")
        return (f"unavailable (a network policy needs a network namespace of its own, or "
                f"Landlock ABI {NET_ABI}'s TCP rules (Linux 6.7): no namespace: {namespace}; "
                f"{landlock})")
    port = dial_by_port(egress)
    if isinstance(port, str):
        return f"unavailable ({port})"
    BY_PORT[:] = [port]
    return (f"policy ({rules} rules: no network namespace of its own ({namespace}); Landlock "
            f"ABI {abi}'s TCP rules: connect to the host's proxy port {port} only, bind none; "
            f"the system call filter: no socket of its own but NETLINK_ROUTE, no listen(); its "
            f"TCP sockets are the proxy's, bound to 127.0.0.1; egress only through the "
            f"host's proxy, http://127.0.0.1:{port})")


def hold_tcp(report: str) -> str:
    """Landlock's TCP rules for a policy by port (applied after own_root() and
    make_reachable(): a Landlock domain may refuse their mount(2)): ``report`` if they
    hold, else what failed."""
    why = restrict_tcp(BY_PORT[0])
    return report if not why else f"failed (Landlock's TCP rules: {why})"


def dial_by_port(egress: dict) -> Union[int, str]:
    """(No network namespace of its own) dial the proxy, learn its TCP port and announce
    it: the port (for landlock.restrict_tcp()), or why the proxy cannot be reached."""
    try:
        dialer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dialer.settimeout(_ANSWER_S)
        dialer.connect(egress["socket"])
        dialer.sendall(egress["token"].encode("ascii") + b"\n")
        # (the proxy answers by the host's record of its token: sent by port)
        dialer.sendall(ASK_PORT)
        line = b""
        while not line.endswith(b"\n") and len(line) < 8:
            got = dialer.recv(8 - len(line))
            if not got:
                raise ConnectionResetError("the proxy closed the dialer")
            line += got
        port = int(line)
        if not port:
            raise ValueError("the proxy did not send this worker by port")
        dialer.settimeout(None)
    except (OSError, ValueError) as exc:
        return f"the host's egress proxy cannot be reached: {exc}"
    _announce(port)
    _SUPPLY[:] = [dialer]
    return port


def supply(family: int = -1, type: int = -1, proto: int = -1,
           fileno: Any = None) -> tuple[int, int, int, Any]:
    """The arguments ``socket.socket`` goes on with: a new TCP socket (IPv4, as the proxy
    is) is one the proxy made, bound to 127.0.0.1 (its descriptor as ``fileno``); any
    other, unchanged (the system call filter refuses it)."""
    stream = type == -1 or type & _TYPE_MASK == socket.SOCK_STREAM
    if (fileno is not None or not _SUPPLY or family not in (-1, socket.AF_INET) or not stream
            or proto not in (-1, 0, socket.IPPROTO_TCP)):
        return family, type, proto, fileno
    with _SUPPLY_LOCK:
        dialer = _SUPPLY[0]
        dialer.sendall(ASK_SOCKET)
        fds = _answer(dialer)
    return socket.AF_INET, socket.SOCK_STREAM, 0, fds[0]


def _answer(dialer: socket.socket) -> list[int]:
    """The proxy's answer to a request for a socket: its descriptor (one).  What else is
    waiting on the dialer is passed over (answers to what a tool itself wrote there: a
    port's digits); a refusal or the dialer's end raises OSError."""
    while True:
        data, fds, _, _ = socket.recv_fds(dialer, 1, 1, socket.MSG_CMSG_CLOEXEC)
        if data == A_SOCKET and fds:
            return fds
        for fd in fds:
            os.close(fd)
        if data == NO_SOCKET or data == A_SOCKET:
            # (a socket whose descriptor did not fit: this process has too many open)
            raise OSError(errno.EMFILE, "the host's egress proxy hands this worker no more "
                                        "TCP sockets")
        if not data:
            raise OSError(errno.ECONNRESET, "the host's egress proxy is gone")


_PLAIN_INIT = socket.socket.__init__


def _init(self: socket.socket, family: int = -1, type: int = -1, proto: int = -1,
          fileno: Any = None) -> None:
    """``socket.socket.__init__`` in a worker whose TCP sockets come from the proxy
    (supply()); the class stays the same, so isinstance() holds for every socket."""
    _PLAIN_INIT(self, *supply(family, type, proto, fileno))
    if fileno is None and type != -1 and type & socket.SOCK_NONBLOCK:
        self.setblocking(False)


def hold_placeholders(egress: dict, tmpdir: str) -> str:
    """(A policy that binds secrets) each secret's placeholder in the environment under its
    name, and the CAs the worker trusts (the system's and the proxy's, which signs the
    certificates of the hosts its secrets are bound to) in a file of its temp dir, named
    by SSL_CERT_FILE and REQUESTS_CA_BUNDLE: what stats() adds to the network's report
    ("" when there is no secret)."""
    placeholders = egress.get("secrets") or {}
    if not placeholders:
        return ""
    for name, placeholder in placeholders.items():
        os.environ[name] = placeholder
    bundle = os.path.join(tmpdir, "lcp-sandbox-ca-bundle.pem")
    with open(bundle, "w", encoding="ascii") as f:
        f.write(egress["ca_bundle"])
    os.chmod(bundle, 0o644)
    for name in _CA_VARIABLES:
        os.environ[name] = bundle
    return (f"; secrets {', '.join(sorted(placeholders))}: placeholders only, swapped by the "
            f"host's proxy")


def start_supply() -> None:
    """(By port, once the worker is confined) from now on, a new TCP socket of the
    worker's Python is one the proxy made (supply())."""
    if _SUPPLY:
        socket.socket.__init__ = _init  # type: ignore[method-assign]
