"""One connection through the egress proxy: its request head, the decision, the relay.

    serve(sock, admit), in a thread of the proxy's pool, blocking:
        the head (at most HEAD_LIMIT bytes, within HEAD_TIMEOUT_S) ──► request_of():
        CONNECT host:port, or a plain-HTTP request with an absolute URL ──► admit(host,
        port) (the proxy's: the policy, every address; Refused ──► an HTTP error naming
        why, and the connection ends) ──► a connection to the first checked address that
        answers ──► relay(): bytes both ways until both have ended

A thread a connection, not the event loop: measured on a small GET through the proxy, the
loop's wake-ups (the upstream connect, a transport each side) cost more than the whole
blocking path (benchmarks/egress.py).  A slow reader holds back its writer (sendall
blocks), so no buffer grows.  Plain HTTP is forwarded with ``Connection: close``, so a
kept-alive connection cannot carry a second request to another host.
"""
from __future__ import annotations

import select
import socket
from typing import Callable, Optional
from urllib.parse import urlsplit

from ...core.egress_rules import Address

HEAD_LIMIT = 64 * 1024
HEAD_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
_CHUNK = 65536
_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
_HOP_BY_HOP = ("connection", "proxy-connection", "keep-alive", "proxy-authorization")

Admit = Callable[[str, int], list[Address]]


class Refused(Exception):
    """A connection not made: the HTTP status and the text the tool reads."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def serve(client: socket.socket, admit: Admit) -> None:
    """One connection, to its end (the caller closes ``client``)."""
    try:
        head, rest = _head(client)
        host, port, first = request_of(head)
        upstream = connect(admit(host, port), port)
    except Refused as exc:
        client.sendall(response(exc.status, str(exc)))
        return
    with upstream:
        if first is None:
            client.sendall(_ESTABLISHED)
        else:
            upstream.sendall(first)
        if rest:
            upstream.sendall(rest)
        relay(client, upstream)


def _head(client: socket.socket) -> tuple[bytes, bytes]:
    """(the request head, what came after it) read from ``client``."""
    client.settimeout(HEAD_TIMEOUT_S)
    got = b""
    try:
        while (end := got.find(b"\r\n\r\n")) < 0:
            if len(got) > HEAD_LIMIT:
                raise Refused(400, f"a request head over {HEAD_LIMIT} bytes")
            data = client.recv(_CHUNK)
            if not data:
                raise Refused(400, "the connection ended before its request head")
            got += data
    except socket.timeout:
        raise Refused(400, f"no complete request head within {HEAD_TIMEOUT_S:g} s") from None
    client.settimeout(None)
    return got[:end + 4], got[end + 4:]


def connect(addresses: list[Address], port: int) -> socket.socket:
    """A connection to the first of ``addresses`` (each checked) that answers."""
    last: Optional[OSError] = None
    for address in addresses:                  # (by address: nothing is resolved again)
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect((str(address), port))
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise Refused(502, f"could not connect to port {port} of "
                       f"{', '.join(map(str, addresses))}: {last or 'no address'}")


def relay(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways until each side has ended (an end is passed on as a shutdown)."""
    poll = select.poll()
    pairs = {a.fileno(): (a, b), b.fileno(): (b, a)}
    for fd in pairs:
        poll.register(fd, select.POLLIN)
    while pairs:
        for fd, _ in poll.poll():
            src, dst = pairs[fd]
            data = src.recv(_CHUNK)
            if data:
                dst.sendall(data)
                continue
            poll.unregister(fd)
            del pairs[fd]
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def request_of(head: bytes) -> tuple[str, int, Optional[bytes]]:
    """(host, port, the head to send upstream: None for CONNECT) of a request head."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise Refused(400, f"not an HTTP/1 request line: {lines[0][:200]!r}")
    method, target, version = parts
    if method == "CONNECT":
        host, sep, port = target.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise Refused(400, f"CONNECT needs host:port, not {target[:200]!r}")
        return host.strip("[]"), int(port), None
    url = urlsplit(target)
    try:
        to = url.port or 80
    except ValueError:
        to = 0
    if url.scheme != "http" or not url.hostname or not to:
        raise Refused(400, f"a plain-HTTP request through the proxy names an absolute http:// "
                           f"URL, not {target[:200]!r} (https goes through CONNECT)")
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    headers = [h for h in lines[1:]
               if h and h.split(":", 1)[0].strip().lower() not in _HOP_BY_HOP]
    return url.hostname, to, "\r\n".join(
        [f"{method} {path} {version}", *headers, "Connection: close", "", ""]).encode("latin-1")


def response(status: int, text: str) -> bytes:
    """The proxy's own answer: an error the tool reads, and the connection ends."""
    reason = {400: "Bad Request", 403: "Forbidden", 429: "Too Many Requests",
              502: "Bad Gateway", 503: "Service Unavailable"}[status]
    body = (text + "\n").encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n"
            f"X-Lcp-Sandbox-Egress: refused\r\n\r\n").encode() + body
