"""One connection through the egress proxy: its request head, the decision, the relay.

    serve(sock, admit, head_timeout_s), in the proxy's thread that accepted it, blocking:
        read_request(): the head, parsed by h11 as it arrives (at most HEAD_LIMIT bytes, all
        of it within one deadline) ──► request_of(): CONNECT host:port, or a plain-HTTP
        request with an absolute http:// URL; its host as canonical_host() spells it, or 400
        ──► admit(host, port) (the proxy's: the policy, every address; ProxyRefusal ──► an HTTP
        error naming why, and the connection ends) ──► a connection to the first checked
        address that answers ──► relay(): bytes both ways until both have ended

The head is parsed by h11 (the HTTP/1.1 state machine under httpcore and uvicorn), which
refuses control bytes, bad header names and malformed lines; the host it names is checked
once (core/egress_rules.py) and that one string is what the rules match and the resolver
is asked: no second parse can read another name out of the same bytes.

A thread a connection, not the event loop: measured on a small GET through the proxy, the
loop's wake-ups (the upstream connect, a transport each side) cost more than the whole
blocking path (benchmarks/egress.py).  A slow reader holds back its writer (sendall
blocks), so no buffer grows.  Plain HTTP is forwarded with ``Connection: close``, so a
kept-alive connection cannot carry a second request to another host, and with the ``Host``
of its URL, so a server behind the checked address cannot be asked for another site.
"""
from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Union

import h11

from ....core.egress_rules import Address, authority_of
from ....core.secrets import Headers, SecretMisuse, Swap

HEAD_LIMIT = 64 * 1024
HEAD_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
#: What one direction of a relay holds at most; a bulk transfer's, while LARGE_WAYS allow
CHUNK = 64 * 1024
LARGE_CHUNK = 1024 * 1024
#: Directions of relays that may hold LARGE_CHUNK at once, host-wide: at most 32 MiB, where
#: 64 KiB each would be 512 MiB for the proxy's 4,096 connections
LARGE_WAYS = 32
_LARGE = threading.BoundedSemaphore(LARGE_WAYS)
_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
_HOP_BY_HOP = (b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization",
               b"host")
_VERSIONS = (b"1.0", b"1.1")
_HTTP = "http://"

Admit = Callable[[str, int], list[Address]]
Track = Callable[[Optional[socket.socket]], None]


class ProxyRefusal(Exception):
    """A connection not made: the HTTP status, the text the tool reads and, for a limit
    that frees itself, the seconds after which to try again."""

    def __init__(self, status: int, text: str, retry_after: Optional[int] = None) -> None:
        super().__init__(text)
        self.status = status
        self.retry_after = retry_after


class Secrets(Protocol):
    """A worker's secrets, as a connection sees them (egress_secrets.WorkerSecrets)."""
    swap: Swap

    def intercepts(self, host: str, port: int) -> bool:
        """Whether a tunnel to (host, port) is opened (a secret is bound to it)."""

    def refuse(self, exc: SecretMisuse, host: str, port: int) -> "ProxyRefusal":
        """``exc`` counted and logged: the refusal to answer."""

    def intercept(self, client: socket.socket, upstream: socket.socket, host: str,
                  port: int, rest: bytes) -> None:
        """A tunnel to a bound host, opened: each request swapped on its way."""


@dataclass(frozen=True)
class ProxyRequest:
    """Where a request goes: ``host`` as canonical_host() spells it, ``port``, and
    ``upstream``, the head to send there (None for CONNECT: the tunnel carries the rest)."""
    host: str
    port: int
    upstream: Optional[bytes]


def serve(client: socket.socket, admit: Admit, head_timeout_s: float = HEAD_TIMEOUT_S,
          track: Optional[Track] = None, secrets: Optional[Secrets] = None) -> None:
    """One connection, to its end (the caller closes ``client``).  ``track`` is told the
    server's socket once it is connected, and None before it is closed: the proxy ends
    a connection from outside by shutting both sockets down.  ``secrets``: the worker's,
    swapped in its request heads (egress_secrets.py)."""
    try:
        request, rest = read_request(client, head_timeout_s, secrets)
        upstream = connect(admit(request.host, request.port), request.port)
    except ProxyRefusal as exc:
        client.sendall(response(exc.status, str(exc), exc.retry_after))
        return
    if track is not None:
        track(upstream)
    try:
        if (request.upstream is None and secrets is not None
                and secrets.intercepts(request.host, request.port)):
            secrets.intercept(client, upstream, request.host, request.port, rest)
            return
        if request.upstream is None:
            client.sendall(_ESTABLISHED)
        else:
            upstream.sendall(request.upstream)
        if rest:
            upstream.sendall(rest)
        relay(client, upstream)
    finally:
        if track is not None:
            track(None)
        upstream.close()


def read_request(client: socket.socket, timeout_s: float,
                 secrets: Optional[Secrets] = None) -> tuple[ProxyRequest, bytes]:
    """(the request ``client`` sent, what came after its head): the head parsed by h11 as
    it arrives, all of it within ``timeout_s`` (one deadline for the whole head, not one a
    read: a head trickled a byte at a time ends there too), at most HEAD_LIMIT bytes (the
    reads stop there, so what follows a head stays in the socket for the relay)."""
    parser = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
    deadline = time.monotonic() + timeout_s
    taken = 0
    try:
        # (no event before the first bytes: asking for one first cost a tenth of the parse)
        while True:
            if taken >= HEAD_LIMIT:
                raise ProxyRefusal(400, f"a request head over {HEAD_LIMIT} bytes")
            data = _receive(client, deadline, min(CHUNK, HEAD_LIMIT - taken), timeout_s)
            taken += len(data)
            parser.receive_data(data)
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as exc:
                raise ProxyRefusal(400, f"not an HTTP/1 request head: {exc}") from None
            if isinstance(event, h11.Request):
                return request_of(event, secrets), parser.trailing_data[0]
            if event is not h11.NEED_DATA:
                raise ProxyRefusal(400, "the connection ended before its request head")
    finally:
        if client.gettimeout() is not None:
            client.settimeout(None)


def _receive(client: socket.socket, deadline: float, size: int, timeout_s: float) -> bytes:
    """At most ``size`` bytes from ``client``, before ``deadline`` (b"": it ended)."""
    left = deadline - time.monotonic()
    try:
        if left <= 0:
            raise socket.timeout
        if client.gettimeout() is None:
            # What came already, without a wait (a client sends its head as it connects):
            # no poll and no mode switch for the common head
            try:
                return client.recv(size, socket.MSG_DONTWAIT)
            except BlockingIOError:
                pass
        client.settimeout(left)
        return client.recv(size)
    except socket.timeout:
        raise ProxyRefusal(400, f"no complete request head within {timeout_s:g} s") from None


def request_of(event: h11.Request, secrets: Optional[Secrets] = None) -> ProxyRequest:
    """Where an h11 request goes: CONNECT host:port, or an absolute http:// URL (its
    head rewritten for the server: origin-form, its own Host, ``Connection: close``, and
    the worker's placeholders swapped: ``secrets``).  A CONNECT head carries none."""
    if event.http_version not in _VERSIONS:
        raise ProxyRefusal(400, f"HTTP/{event.http_version.decode()} is not HTTP/1.0 or 1.1")
    # h11 admits visible ASCII only in a request target
    target = event.target.decode("ascii")
    if event.method == b"CONNECT":
        try:
            host, port = authority_of(target)
        except ValueError as exc:
            raise ProxyRefusal(400, f"CONNECT needs host:port: {exc}") from None
        if secrets is not None:
            try:
                secrets.swap.refuse_any(host, port, bytes(event.target),
                                        *(b for pair in event.headers.raw_items() for b in pair))
            except SecretMisuse as exc:
                raise secrets.refuse(exc, host, port) from None
        return ProxyRequest(host, port, None)
    if target[:len(_HTTP)].lower() != _HTTP:
        raise ProxyRefusal(400, f"a plain-HTTP request through the proxy names an absolute http:// "
                           f"URL, not {target[:200]!r} (https goes through CONNECT)")
    rest = target[len(_HTTP):]
    cut = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    path = rest[cut:]
    if "#" in path:
        raise ProxyRefusal(400, f"a request target has no fragment: {target[:200]!r}")
    try:
        host, port = authority_of(rest[:cut], 80)
    except ValueError as exc:
        raise ProxyRefusal(400, f"the URL {target[:200]!r} names no host this proxy reaches: "
                           f"{exc}") from None
    origin = path if path.startswith("/") else "/" + path
    headers: Headers = list(event.headers.raw_items())
    if secrets is not None:
        try:
            swapped = secrets.swap.head(host, port, origin.encode("ascii"), headers)
        except SecretMisuse as exc:
            raise secrets.refuse(exc, host, port) from None
        if swapped is not None:
            origin, headers = swapped[0].decode("ascii", "replace"), swapped[1]
    return ProxyRequest(host, port, _upstream_head(event, host, port, origin, headers))


def _upstream_head(event: h11.Request, host: str, port: int, origin: str,
                   headers: Headers) -> bytes:
    """The head a plain-HTTP request is forwarded with: origin-form, the Host of its URL
    (a proxy replaces the client's), no hop-by-hop header, ``Connection: close``."""
    # (names as sent; h11 checked them, and lower() is what its own iteration gives)
    raw = [(name, name.lower(), value) for name, value in headers]
    named = {t.strip().lower() for _, low, value in raw if low == b"connection"
             for t in value.split(b",")}
    authority = f"[{host}]" if ":" in host else host
    if port != 80:
        authority = f"{authority}:{port}"
    lines = [b"%s %s HTTP/%s" % (event.method, origin.encode("latin-1"), event.http_version),
             b"Host: " + authority.encode("ascii")]
    lines += [name + b": " + value for name, low, value in raw
              if low not in _HOP_BY_HOP and low not in named]
    return b"\r\n".join([*lines, b"Connection: close", b"", b""])


def connect(addresses: list[Address], port: int) -> socket.socket:
    """A connection to the first of ``addresses`` (each checked) that answers."""
    last: Optional[OSError] = None
    # By address: nothing is resolved again.
    for address in addresses:
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
    raise ProxyRefusal(502, f"could not connect to port {port} of "
                       f"{', '.join(map(str, addresses))}: {last or 'no address'}")


def relay(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways until each side has ended (an end is passed on as a shutdown)."""
    poll = select.poll()
    ways = {a.fileno(): _Way(a, b), b.fileno(): _Way(b, a)}
    for fd in ways:
        poll.register(fd, select.POLLIN)
    ending = list(ways.values())
    try:
        while ways:
            for fd, _ in poll.poll():
                if ways[fd].move():
                    continue
                poll.unregister(fd)
                del ways[fd]
    finally:
        for way in ending:
            way.give_back()


class _Way:
    """One direction of a relay: what ``src`` sends, passed on to ``dst``, CHUNK bytes at
    most a read; once a read filled CHUNK (a bulk transfer) and one of the host's
    LARGE_WAYS is free, LARGE_CHUNK at most, into a buffer of its own: each move is then
    a sixteenth of the system calls and wake-ups on both sides (benchmarks/egress.py: a
    200 MB body at 0.48-0.63x the direct rate, against 0.34-0.40x with CHUNK alone, same
    runs)."""
    __slots__ = ("src", "dst", "view")

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src, self.dst = src, dst
        # (LARGE_CHUNK's, while it holds one of LARGE_WAYS)
        self.view: Optional[memoryview] = None

    def move(self) -> bool:
        """One read passed on (False: ``src`` ended, and the end is passed on)."""
        if self.view is not None:
            got = self.src.recv_into(self.view)
            data: Union[bytes, memoryview] = self.view[:got]
        else:
            data = self.src.recv(CHUNK)
            got = len(data)
        if not got:
            try:
                self.dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return False
        self.dst.sendall(data)
        if got == CHUNK and self.view is None and _LARGE.acquire(blocking=False):
            self.view = memoryview(bytearray(LARGE_CHUNK))
        return True

    def give_back(self) -> None:
        if self.view is not None:
            self.view = None
            _LARGE.release()


def response(status: int, text: str, retry_after: Optional[int] = None) -> bytes:
    """The proxy's own answer: an error the tool reads, and the connection ends."""
    reason = {400: "Bad Request", 403: "Forbidden", 429: "Too Many Requests",
              502: "Bad Gateway", 503: "Service Unavailable"}[status]
    body = (text + "\n").encode()
    retry = "" if retry_after is None else f"Retry-After: {retry_after}\r\n"
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{retry}"
            f"X-Lcp-Sandbox-Egress: refused\r\n\r\n").encode() + body
