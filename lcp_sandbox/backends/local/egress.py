"""The host's egress proxy: all that a confined worker with a network policy reaches.

    worker (own network namespace: loopback only)     host process (one proxy per supervisor)
    tool ──TCP──► 127.0.0.1:P, the relay thread ──────► its dialer: a unix stream connected
         (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY)            before the worker confined itself; its
                      │ accept(), then the accepted      first line, the token the host gave it
                      └ socket itself, by SCM_RIGHTS ──► (so: which tenant and library, which
                                                          Policy), then one socket per message
    each socket received: read the request head (CONNECT host:port, or a plain-HTTP request with
    an absolute URL), resolve the name, Policy.check() every address: 403 naming the rule, or
    connect to an address that was checked and relay both ways until either side ends

The proxy never listens on an address of the host's interfaces: its one listening socket is
a unix socket in a folder only the host's user may enter, and a worker reaches it only through
the dialer it opened before its confinement (its system call filter then refuses new unix
sockets).  The worker is hostile: what it sends on its dialer may be anything (garbage, a file,
a pipe, a listening socket, a flood); a received descriptor that is not a connected stream
socket is closed unread; each worker has at most MAX_PER_WORKER connections at once (further
ones are answered 429 at once), the proxy at most MAX_CONNECTIONS (503); a request head is
read within HEAD_TIMEOUT_S and HEAD_LIMIT bytes.  Plain HTTP requests are forwarded with
``Connection: close``, so a kept-alive connection cannot carry a second request to another host.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import secrets
import shutil
import socket
import stat
import tempfile
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Coroutine, Optional
from urllib.parse import urlsplit

from ... import protocol as P
from ...core.egress_rules import Address, Decision, Policy, policy_of
from ..metrics import Metrics
from .slot import Slot

log = logging.getLogger("lcp_sandbox.egress")

MAX_PER_WORKER = 64
MAX_CONNECTIONS = 4096
HEAD_LIMIT = 64 * 1024
HEAD_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
RESOLVE_TIMEOUT_S = 10.0
_FDS_PER_MESSAGE = 8
_LOGGED_PER_WORKER = 20          # refusals logged per worker (then counted only)


@dataclass
class Identity:
    """Whose connections come in on a dialer: the worker's tenant and library, its policy."""
    tenant: str
    library: str
    policy: Policy
    active: int = 0
    refused: int = 0


class Refused(Exception):
    """A connection not made: the HTTP status and the text the tool reads."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


class EgressProxy:
    """One per supervisor, started by the first worker with a network policy."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._ids: dict[str, Identity] = {}
        self._tokens: dict[int, str] = {}         # id(slot): its token, while it lives
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._folder = ""
        self.path = ""
        self.connections = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def give(self, init: P.Init, slot: Slot) -> P.Init:
        """The INIT of ``slot``'s next worker with what it dials the proxy with: the
        proxy's socket and the slot's token (the proxy starts now if it has not).  The
        token names the slot's tenant, library and policy for as long as the slot lives."""
        with self._lock:
            if self._loop is None:
                self._start()
            token = self._tokens.get(id(slot))
            if token is None:
                token = self._tokens[id(slot)] = secrets.token_hex(16)
                rules = slot.limits.network
                assert isinstance(rules, dict), "only a worker with a network policy dials"
                self._ids[token] = Identity(slot.tenant, slot.library.name, policy_of(rules))
                weakref.finalize(slot, self._forget, id(slot), token)
        egress = {"socket": self.path, "token": token}
        return init._replace(confine={**(init.confine or {}), "egress": egress})

    def _forget(self, slot_id: int, token: str) -> None:
        """A slot is gone: its token dials no more."""
        self._tokens.pop(slot_id, None)
        self._ids.pop(token, None)

    def _start(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="lcp-sandbox-egress-")     # mode 0700
        self.path = os.path.join(self._folder, "proxy.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(512)
        listener.setblocking(False)
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(loop, listener),
                                        name="lcp-sandbox-egress", daemon=True)
        self._thread.start()

    def _run(self, loop: asyncio.AbstractEventLoop, listener: socket.socket) -> None:
        asyncio.set_event_loop(loop)
        self._spawn(loop, self._accept(listener))
        try:
            loop.run_forever()
        finally:
            listener.close()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    def _spawn(self, loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, None]) -> None:
        """A task of the proxy's, held until it ends (the loop keeps only weak references)."""
        task = loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        with self._lock:
            loop, thread, self._loop = self._loop, self._thread, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            shutil.rmtree(self._folder, ignore_errors=True)

    # ------------------------------------------------------------ dialers
    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            dialer, _ = await loop.sock_accept(listener)
            self._spawn(loop, self._dialer(dialer))

    async def _dialer(self, dialer: socket.socket) -> None:
        """One worker's dialer: its token, then the sockets it hands over, until it ends."""
        with dialer:
            loop = asyncio.get_running_loop()
            try:
                line = await asyncio.wait_for(loop.sock_recv(dialer, 64), HEAD_TIMEOUT_S)
            except (asyncio.TimeoutError, OSError):
                return
            ident = self._ids.get(line.strip().decode("ascii", "replace"))
            if ident is None:
                return
            while True:
                await _readable(loop, dialer)
                try:
                    data, fds, _, _ = socket.recv_fds(dialer, 64, _FDS_PER_MESSAGE,
                                                      socket.MSG_CMSG_CLOEXEC)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not data and not fds:
                    return                                      # the worker ended
                for fd in fds:
                    self._take(loop, ident, fd)

    def _take(self, loop: asyncio.AbstractEventLoop, ident: Identity, fd: int) -> None:
        """A descriptor a worker sent: served if it is a connected stream socket."""
        sock = _stream_socket(fd)
        if sock is None:
            return
        if ident.active >= MAX_PER_WORKER or self.connections >= MAX_CONNECTIONS:
            limit = "this worker's" if ident.active >= MAX_PER_WORKER else "the host's"
            self._spawn(loop, self._answer_only(sock, 429 if limit[0] == "t" else 503,
                                                f"{limit} limit of connections at once is reached"))
            return
        ident.active += 1
        self.connections += 1
        self._spawn(loop, self._serve(ident, sock))

    async def _answer_only(self, sock: socket.socket, status: int, text: str) -> None:
        with sock:
            await _send(sock, _response(status, text))

    # ------------------------------------------------------------ one connection
    async def _serve(self, ident: Identity, sock: socket.socket) -> None:
        writers: list[asyncio.StreamWriter] = []       # closed at the end (with their socket)
        try:
            reader, writer = await asyncio.open_connection(sock=sock, limit=HEAD_LIMIT)
            writers.append(writer)
            try:
                up_reader, up_writer, first = await self._open(ident, reader)
            except Refused as exc:
                writer.write(_response(exc.status, str(exc)))
                await writer.drain()
                return
            writers.append(up_writer)
            if first is None:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up_writer.write(first)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, ValueError):
            pass
        finally:
            ident.active -= 1
            self.connections -= 1
            for w in writers:
                w.close()
            if not writers:
                sock.close()

    async def _open(self, ident: Identity, reader: asyncio.StreamReader
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Optional[bytes]]:
        """Read the request head, decide, connect: the upstream stream and the head to send
        it (None: a CONNECT tunnel).  Refused when the policy (or the request) says no."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError):
            raise Refused(400, "no complete request head (CONNECT host:port, or a request "
                               "with an absolute http:// URL)") from None
        host, port, first = _request(head)
        addresses = await self._resolve(host, port)
        self._decide(ident, ident.policy.check(host, port, addresses), host, port)
        up_reader, up_writer = await _connect(addresses, port)
        return up_reader, up_writer, first

    async def _resolve(self, host: str, port: int) -> list[Address]:
        try:
            return [ipaddress.ip_address(host)]
        except ValueError:
            pass
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM),
                                           RESOLVE_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as exc:
            raise Refused(502, f"{host} cannot be resolved ({exc or 'timed out'})") from None
        return list(dict.fromkeys(ipaddress.ip_address(str(i[4][0]).split("%")[0])
                                  for i in infos))

    def _decide(self, ident: Identity, decision: Decision, host: str, port: int) -> None:
        self.metrics.egress(decision.admitted, decision.rule)
        if decision.admitted:
            return
        ident.refused += 1
        if ident.refused <= _LOGGED_PER_WORKER:
            log.warning("egress refused: tenant %s, library %s, to %s port %d: %s%s",
                        ident.tenant, ident.library, host, port, decision.why,
                        " (further refusals of this worker are counted, not logged)"
                        if ident.refused == _LOGGED_PER_WORKER else "")
        raise Refused(403, f"lcp-sandbox network policy: {decision.why}")


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)
    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


def _stream_socket(fd: int) -> Optional[socket.socket]:
    """A received descriptor as a socket, if it is a connected stream socket; else closed."""
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            sock = socket.socket(fileno=fd)
            if (sock.type == socket.SOCK_STREAM
                    and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
                sock.setblocking(False)
                return sock
            sock.close()
            return None
    except OSError:
        pass
    os.close(fd)
    return None


def _request(head: bytes) -> tuple[str, int, Optional[bytes]]:
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
    drop = ("connection", "proxy-connection", "keep-alive", "proxy-authorization")
    headers = [h for h in lines[1:] if h and h.split(":", 1)[0].strip().lower() not in drop]
    return url.hostname, to, "\r\n".join(
        [f"{method} {path} {version}", *headers, "Connection: close", "", ""]).encode("latin-1")


async def _connect(addresses: list[Address], port: int
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first of ``addresses`` (each checked) that answers."""
    last: Optional[BaseException] = None
    for address in addresses:
        try:
            return await asyncio.wait_for(asyncio.open_connection(str(address), port),
                                          CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as exc:
            last = exc
    raise Refused(502, f"could not connect to port {port} of "
                       f"{', '.join(map(str, addresses))}: {last or 'timed out'}")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


async def _send(sock: socket.socket, data: bytes) -> None:
    try:
        await asyncio.get_running_loop().sock_sendall(sock, data)
    except OSError:
        pass


def _response(status: int, text: str) -> bytes:
    reason = {400: "Bad Request", 403: "Forbidden", 429: "Too Many Requests",
              502: "Bad Gateway", 503: "Service Unavailable"}[status]
    body = (text + "\n").encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n"
            f"X-Lcp-Sandbox-Egress: refused\r\n\r\n").encode() + body
