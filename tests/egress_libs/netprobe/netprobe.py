"""Reaches out through the network, the ways tools do, and the ways a hostile tool would."""
import errno
import gc
import http.client
import os
import select
import socket
import time
import urllib.error
import urllib.request


def tool_env() -> dict:
    """The proxy settings a tool finds in its environment."""
    names = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "no_proxy")
    return {"success": True, "output": {n: os.environ.get(n) for n in names}}


def tool_urllib(url: str) -> dict:
    """GET url with urllib.

    Args:
        url (str): the URL
    """
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            return {"success": True, "output": {"status": r.status, "body": r.read().decode()}}
    except urllib.error.HTTPError as e:
        return {"success": True, "output": {"status": e.code, "body": e.read().decode()}}


def tool_requests(url: str) -> dict:
    """GET url with requests.

    Args:
        url (str): the URL
    """
    import requests
    r = requests.get(url, timeout=20)
    return {"success": True, "output": {"status": r.status_code, "body": r.text}}


def tool_httpx(url: str) -> dict:
    """GET url with httpx (which reads the proxy settings of the environment).

    Args:
        url (str): the URL
    """
    import httpx
    r = httpx.get(url, timeout=20)
    return {"success": True, "output": {"status": r.status_code, "body": r.text}}


def tool_tunnel(host: str, port: int) -> dict:
    """A CONNECT tunnel to host:port through the announced proxy, then a GET inside it.

    Args:
        host (str): host
        port (int): port
    """
    proxy = urllib.request.getproxies()["https"].rsplit(":", 1)
    conn = http.client.HTTPConnection(proxy[0].split("//")[1], int(proxy[1]), timeout=20)
    conn.set_tunnel(host, port)
    try:
        conn.request("GET", "/tunnel")
        r = conn.getresponse()
        return {"success": True, "output": {"status": r.status, "body": r.read().decode()}}
    except OSError as e:
        return {"success": True, "output": {"status": None, "body": str(e)}}


def tool_raw(host: str, port: int) -> dict:
    """A plain TCP connection to host:port, past the proxy.

    Args:
        host (str): host
        port (int): port
    """
    try:
        socket.create_connection((host, port), timeout=5).close()
        return {"success": True, "output": "connected"}
    except OSError as e:
        return {"success": True, "output": type(e).__name__}


def tool_unix(path: str) -> dict:
    """Connect to a pathname unix socket (the proxy's own, say).

    Args:
        path (str): socket path
    """
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        return {"success": True, "output": "connected"}
    except OSError as e:
        return {"success": True, "output": type(e).__name__}


def _proxy():
    url = os.environ["HTTP_PROXY"].rsplit(":", 1)
    return url[0].split("//")[1], int(url[1])


def tool_flood(n: int, refusals: int, release: str) -> dict:
    """Open n connections to the proxy at once, each naming nothing: count those turned away
    at once (until ``refusals`` were, or 20 s), then hold the rest until the file
    ``release`` exists (at most 60 s).

    Args:
        n (int): connections
        refusals (int): how many answers of 429 to wait for
        release (str): the file whose existence lets the connections go
    """
    held = [socket.create_connection(_proxy(), timeout=20) for _ in range(n)]
    turned_away, waiting = 0, set(held)
    deadline = time.monotonic() + 20
    while turned_away < refusals and time.monotonic() < deadline:
        for s in select.select(list(waiting), [], [], 1)[0]:
            waiting.discard(s)
            turned_away += s.recv(64).startswith(b"HTTP/1.1 429")
    deadline = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)
    for s in held:
        s.close()
    return {"success": True, "output": turned_away}


def _peer(sock: socket.socket) -> str:
    try:
        return str(sock.getpeername())
    except OSError:
        return ""


def tool_garbage() -> dict:
    """What a hostile worker sends the proxy: bytes that are no request on a connection,
    then on its dialer bytes, a pipe, a file and a listening socket instead of connections."""
    with socket.create_connection(_proxy(), timeout=20) as s:
        s.sendall(b"\x00\xffGARBAGE\r\n\r\n")
        answer = s.recv(200).decode("latin-1")
    dialers = [o for o in gc.get_objects() if isinstance(o, socket.socket)
               and o.family == socket.AF_UNIX and _peer(o).endswith("proxy.sock")]
    r, w = os.pipe()
    f = os.open("/dev/null", os.O_RDONLY)
    sent = [r, w, f]
    try:
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        sent.append(listening.fileno())
    except OSError:
        # (no network namespace of its own: it may bind nothing, nor listen)
        pass
    for d in dialers:
        d.sendall(os.urandom(4096))
        socket.send_fds(d, [b"x"], sent)
    return {"success": True, "output": {"answer": answer.split("\r\n")[0],
                                        "dialers": len(dialers)}}


def tool_raw_proxy(head: str) -> dict:
    """Send the proxy ``head`` as it is (each character one byte: NULs and all), then read
    its answer to the end.

    Args:
        head (str): the bytes of a request head, as latin-1 characters
    """
    got, error = b"", ""
    with socket.create_connection(_proxy(), timeout=20) as s:
        try:
            s.sendall(head.encode("latin-1"))
            while data := s.recv(65536):
                got += data
        except OSError as e:
            error = type(e).__name__
    status, _, rest = got.decode("latin-1").partition("\r\n")
    return {"success": True, "output": {"status": status, "text": rest, "error": error}}


def tool_trickle(gap: float, most: int) -> dict:
    """Send a request head one byte every ``gap`` seconds, at most ``most`` bytes (never
    its end), until the proxy answers: how many bytes were sent, and the answer.

    Args:
        gap (float): seconds between two bytes
        most (int): bytes to send at most
    """
    head = b"GET http://example.com/ HTTP/1.1\r\nX-Slow: " + b"a" * most
    with socket.create_connection(_proxy(), timeout=20) as s:
        for sent in range(1, most + 1):
            try:
                s.sendall(head[sent - 1:sent])
                if select.select([s], [], [], gap)[0]:
                    return {"success": True, "output": {
                        "sent": sent, "answer": s.recv(400).decode("latin-1")}}
            except OSError as e:
                return {"success": True, "output": {"sent": sent, "answer": type(e).__name__}}
    return {"success": True, "output": {"sent": most, "answer": ""}}


HELD: list = []


def _established(s: socket.socket) -> bool:
    """Whether the proxy answered a CONNECT on ``s`` with 200 (its head read to its end)."""
    head = b""
    while b"\r\n\r\n" not in head:
        data = s.recv(4096)
        if not data:
            break
        head += data
    return head.startswith(b"HTTP/1.1 200")


def tool_hold(host: str, port: int, n: int, path: str) -> dict:
    """Open ``n`` tunnels (CONNECT) to host:port through the proxy, send ``GET path`` in
    each, and keep them open in this worker's module state after the call: how many the
    proxy established, and how many this worker holds in all.

    Args:
        host (str): host
        port (int): port
        n (int): tunnels to open
        path (str): the path each tunnel asks for (a server that answers it late holds it)
    """
    opened = 0
    for _ in range(n):
        s = socket.create_connection(_proxy(), timeout=20)
        s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        if not _established(s):
            s.close()
            continue
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        HELD.append(s)
        opened += 1
    return {"success": True, "output": {"opened": opened, "held": len(HELD)}}


def _error(e: OSError) -> str:
    return type(e).__name__ + (f" {errno.errorcode.get(e.errno, e.errno)}" if e.errno else "")


def tool_sockets(host: str, port: int) -> dict:
    """Every way past the proxy a hostile tool tries: what each answered.

    Args:
        host (str): an address of the host where a server listens
        port (int): its port
    """
    tries = {
        "tcp": lambda: socket.create_connection((host, port), timeout=5).close(),
        "tcp_fastopen": lambda: socket.socket().sendto(b"x", socket.MSG_FASTOPEN, (host, port)),
        "tcp6": lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close(),
        "udp": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(
            b"x", (host, port)),
        "raw": lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
        "packet": lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW),
        "unix": lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM),
        "unix_dgram_pair": lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM),
        "listen": lambda: socket.socket().listen(),
        "bind": lambda: socket.socket().bind(("127.0.0.1", 0)),
    }
    got = {}
    for name, attempt in tries.items():
        try:
            attempt()
            got[name] = "ok"
        except OSError as e:
            got[name] = _error(e)
    return {"success": True, "output": got}


def tool_far(address: str, port: int) -> dict:
    """A TCP connection to ``address`` (beyond this host) at ``port``, past the proxy.

    Args:
        address (str): an address no interface of this host has
        port (int): port
    """
    try:
        socket.create_connection((address, port), timeout=3).close()
        return {"success": True, "output": "connected"}
    except socket.timeout:
        return {"success": True, "output": "timeout"}
    except OSError as e:
        return {"success": True, "output": _error(e)}


def tool_spare_socket() -> dict:
    """A new TCP socket, not connected, that another process may share its port with
    (SO_REUSEADDR), kept in module state: its port."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    HELD.append(s)
    return {"success": True, "output": s.getsockname()[1]}


def tool_send(host: str, port: int, data: str) -> dict:
    """Connect to host:port, send ``data`` and read the answer to its end (a stranger to
    the proxy, such as a tenant with the network on).

    Args:
        host (str): host
        port (int): port
        data (str): what to send
    """
    got = b""
    with socket.create_connection((host, port), timeout=20) as s:
        s.sendall(data.encode())
        try:
            while chunk := s.recv(65536):
                got += chunk
        except OSError as e:
            return {"success": True, "output": {"answer": got.decode(), "error": _error(e)}}
    return {"success": True, "output": {"answer": got.decode(), "error": ""}}


def tool_dialer_write(data: str) -> dict:
    """Write ``data`` on this worker's own dialer to the proxy (what a confused or hostile
    tool may do): how many dialers it found.

    Args:
        data (str): the bytes, as latin-1 characters
    """
    dialers = [o for o in gc.get_objects() if isinstance(o, socket.socket)
               and o.family == socket.AF_UNIX and _peer(o).endswith("proxy.sock")]
    for d in dialers:
        d.sendall(data.encode("latin-1"))
    return {"success": True, "output": len(dialers)}


def tool_dialer_socket(host: str, port: int) -> dict:
    """Ask the proxy for a TCP socket on this worker's own dialer, as a worker without a
    network namespace does (its port, with a socket of its own network, then a socket),
    and connect it to host:port: what happened.

    Args:
        host (str): host
        port (int): port
    """
    dialers = [o for o in gc.get_objects() if isinstance(o, socket.socket)
               and o.family == socket.AF_UNIX and _peer(o).endswith("proxy.sock")]
    d = dialers[0]
    d.settimeout(5)
    # with a socket of its own network, as its proof
    with socket.socket() as proof:
        socket.send_fds(d, [b"p"], [proof.fileno()])
    d.sendall(b"s")
    try:
        while True:
            data, fds, _, _ = socket.recv_fds(d, 1, 1)
            if fds or data in (b"", b"n"):
                break
    except socket.timeout:
        return {"success": True, "output": "no answer"}
    if not fds:
        return {"success": True, "output": f"no socket ({data!r})"}
    s = socket.socket(fileno=fds[0])
    try:
        s.settimeout(5)
        s.connect((host, port))
        return {"success": True, "output": "connected"}
    except OSError as e:
        return {"success": True, "output": _error(e)}
