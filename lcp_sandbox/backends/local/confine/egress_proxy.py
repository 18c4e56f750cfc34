"""The host's egress proxy: all that a confined worker with a network policy reaches.

    worker (own network namespace: loopback only)     host process (one proxy per supervisor)
    its listener, 127.0.0.1:P ── once, by SCM_RIGHTS ─► its dialer: a unix stream connected
      (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY)               before the worker confined itself; its
                                                         first line, the token the host gave it
                                                         (so: which tenant and library, which
                                                         Policy), then the worker's listener:
    tool ──TCP──► 127.0.0.1:P ─────────────────────────► accepted by a thread of the proxy's
                                                         (egress_accept.py), which serves it:
    under the caps (its worker's, its tenant's, the host's) or 429/503 at once; read the
    request head (CONNECT host:port, or a plain-HTTP request with an absolute URL; its host in
    the one spelling the rules match, or 400), Policy.check() the name, resolve that same
    string, check every address: 403 naming the rule, or connect to an address that was
    checked and relay both ways until either side ends

The proxy's listening socket is a unix socket in a folder only the host's user may enter; a
worker reaches it only through the dialer it opened before its confinement (its system call
filter then refuses new unix sockets).  Where the host cannot make a network namespace for
its workers (a default container refuses unshare), a worker comes by port (egress_port.py).
Which way, the host decides as it gives the worker its token (give()) and records with the
token: the proxy answers by that record alone, never by what the worker sends.  A worker's
secrets are put in its requests on their way out (egress_secrets.py).

The worker is hostile: what it sends on its dialer may be anything (garbage, a file, a
pipe, a flood, the host's own descriptors it holds); from a worker in a namespace of its
own, one listening TCP socket of another network namespace (SO_NETNS_COOKIE) is taken, the
first, and every other descriptor is closed unread.  Connections at once are capped:
MAX_PER_WORKER a worker and MAX_PER_TENANT (a thirty-second of the host's) a tenant (429
beyond them), MAX_CONNECTIONS the host (503), each answered at once with ``Retry-After``.
A whole request head comes within HEAD_TIMEOUT_S (one deadline, not one a read) and
HEAD_LIMIT bytes.  Plain HTTP requests are forwarded with ``Connection: close``, so a
kept-alive connection cannot carry a second request to another host.  A connection lives
no longer than the worker it came from: when a worker's dialer ends, the proxy shuts down
both ends of each of its connections (a long poll keeps no slot of a worker that is gone).
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Coroutine, Optional

from .... import protocol as P
from ....core.egress_rules import Address, Decision, Policy, canonical_host, policy_of
from ....core.secrets import with_placeholders
from ....protocol.dialer import ASK_PORT, ASK_SOCKET, LISTENER
from ...metrics import Metrics
from ..slot import Slot
from .egress_accept import Acceptors, Serve, listening_socket
from .egress_conn import HEAD_TIMEOUT_S, ProxyRefusal, response, serve
from .egress_port import ByPort, Handed, worker_network
from .egress_secrets import Keeper, WorkerSecrets

log = logging.getLogger("lcp_sandbox.egress")

MAX_PER_WORKER = 64
MAX_CONNECTIONS = 4096
# A tenant's share of the host: four libraries at their own cap, and sixteen tenants to fill it
MAX_PER_TENANT = MAX_CONNECTIONS // 32
# What a refusal at a cap tells the client to wait (slots free as connections end, and a
# connection that sends no head ends within HEAD_TIMEOUT_S)
RETRY_AFTER_S = 1
_FDS_PER_MESSAGE = 8
TOKEN_BYTES = 32                 # hex digits of a dialer's token (128 bits)
_LOGGED_PER_WORKER = 20          # refusals logged per worker (then counted only)


@dataclass
class Identity:
    """Whose connections come in on a dialer: the worker's tenant and library, its policy,
    and whether the host sent it by port (else it is in a network namespace of its own)."""
    tenant: str
    library: str
    policy: Policy
    by_port: bool = False
    # its worker's secrets, if its policy binds any (egress_secrets.py)
    secrets: Optional[WorkerSecrets] = None
    active: int = 0
    refused: int = 0


class EgressProxy:
    """One per supervisor, started by the first worker with a network policy.  Its caps
    and its head deadline are attributes (the module's constants unless changed)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.max_per_worker = MAX_PER_WORKER
        self.max_per_tenant = MAX_PER_TENANT
        self.max_connections = MAX_CONNECTIONS
        self.head_timeout_s = HEAD_TIMEOUT_S
        # The host's secrets, put in its workers' requests (egress_secrets.py)
        self.secrets = Keeper(metrics, lambda: self._folder)
        self._ids: dict[str, Identity] = {}
        # id(slot): its token, while it lives.
        self._tokens: dict[int, str] = {}
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._folder = ""
        self.path = ""
        self.connections = 0
        # Connections at once by tenant (a tenant with none has no entry)
        self.tenants: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Connections being served.
        self._open: set[_Connection] = set()
        # The threads that accept and serve connections (made by _start(): Linux's epoll)
        self._acceptors: Optional[Acceptors] = None
        # Workers in the host's network (no namespace of their own): egress_port.py
        self.by_port: ByPort[Identity, _Connection] = ByPort(
            self._take, lambda: self.max_per_worker, self._accept_on, self._unlisten)

    def give(self, init: P.Init, slot: Slot) -> P.Init:
        """The INIT of ``slot``'s next worker with the proxy's socket, the slot's token (the
        proxy starts now if it has not), the way it comes (``no_namespace``: "", its own
        namespace, else why it comes by port) and its secrets' placeholders.  The token
        names the slot's tenant, library, policy and way for as long as the slot lives."""
        no_namespace = worker_network(init.disabled or ())
        with self._lock:
            if self._loop is None:
                self._start()
            token = self._tokens.get(id(slot))
            if token is None:
                token = self._tokens[id(slot)] = secrets.token_hex(TOKEN_BYTES // 2)
                rules = slot.limits.network
                assert isinstance(rules, dict), "only a worker with a network policy dials"
                self._ids[token] = Identity(slot.tenant, slot.library.name, policy_of(rules))
                weakref.finalize(slot, self._forget, id(slot), token)
            ident = self._ids[token]
            # (its worker before is gone: a slot has one at a time)
            ident.by_port = bool(no_namespace)
        egress: dict[str, Any] = {"socket": self.path, "token": token,
                                  "no_namespace": no_namespace}
        ident.secrets, placeholders = self.secrets.of(slot.secrets, ident.policy, init.configs)
        if ident.secrets is not None:
            egress.update(secrets=placeholders, ca_bundle=ident.secrets.authority.bundle)
            init = init._replace(configs=with_placeholders(init.configs, placeholders))
        return init._replace(confine={**(init.confine or {}), "egress": egress})

    def _forget(self, slot_id: int, token: str) -> None:
        """A slot is gone: its token dials no more."""
        self._tokens.pop(slot_id, None)
        self._ids.pop(token, None)

    def _start(self) -> None:
        # Mode 0700.
        self._folder = tempfile.mkdtemp(prefix="lcp-sandbox-egress-")
        self.path = os.path.join(self._folder, "proxy.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(512)
        listener.setblocking(False)
        self._acceptors = Acceptors()
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
            # Their threads' reads end.
            for conn in self._open:
                conn.end()
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            shutil.rmtree(self._folder, ignore_errors=True)
        if self._acceptors is not None:
            self._acceptors.close()

    def _accept_on(self, listener: socket.socket, serve: Serve) -> None:
        """The proxy's threads accept on ``listener`` and serve each connection with
        ``serve`` (the proxy started: a dialer came)."""
        assert self._acceptors is not None, "a listener comes through a dialer"
        self._acceptors.add(listener, serve)

    def _unlisten(self, listener: socket.socket) -> None:
        """The proxy's threads accept on ``listener`` no more; it is closed."""
        if self._acceptors is not None:
            self._acceptors.remove(listener)

    # ------------------------------------------------------------ dialers
    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            dialer, _ = await loop.sock_accept(listener)
            self._spawn(loop, self._dialer(dialer))

    async def _dialer(self, dialer: socket.socket) -> None:
        """One worker's dialer: its token, then the sockets it hands over, until it ends;
        then the connections that came through it end too.  A dialer ends when its worker
        has (stopped, killed, its session over): a connection of a worker that is gone
        keeps no slot, whatever the server beyond it does (a long poll never ends by
        itself)."""
        with dialer:
            loop = asyncio.get_running_loop()
            # Exactly the token's line: what follows may carry descriptors.
            try:
                line = await asyncio.wait_for(_exactly(loop, dialer, TOKEN_BYTES + 1),
                                              self.head_timeout_s)
            except (asyncio.TimeoutError, OSError):
                return
            ident = self._ids.get(line.strip().decode("ascii", "replace"))
            if ident is None:
                return
            came: set[_Connection] = set()
            handed: Handed[Identity, _Connection] = Handed(ident, came, ident.by_port)
            try:
                await self._handed(loop, dialer, handed)
            finally:
                if handed.listener is not None:
                    self._unlisten(handed.listener)
                with self._lock:
                    # (a connection accepted meanwhile is refused by _take())
                    handed.ended = True
                    for conn in came:
                        conn.end()
                self.by_port.forget(handed)

    async def _handed(self, loop: asyncio.AbstractEventLoop, dialer: socket.socket,
                      handed: Handed[Identity, _Connection]) -> None:
        """Take the listener a dialer hands over (its connections each into ``handed.came``
        while served), and answer what it asks (the by-port listener's port, a socket),
        until it ends.  Each message is read in the loop's own wake-up (a reader callback:
        a task woken by a future took a second turn of the loop, a socket asked for by
        port waited for both)."""
        ended = loop.create_future()

        def readable() -> None:
            if not self._message(dialer, handed) and not ended.done():
                loop.remove_reader(dialer.fileno())
                ended.set_result(None)
        loop.add_reader(dialer.fileno(), readable)
        try:
            await ended
        finally:
            loop.remove_reader(dialer.fileno())

    def _message(self, dialer: socket.socket, handed: Handed[Identity, _Connection]) -> bool:
        """One message on a dialer, taken and answered: False once the dialer has ended."""
        try:
            data, fds, _, _ = socket.recv_fds(dialer, 64, _FDS_PER_MESSAGE,
                                              socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data and not fds:
            # The worker ended.
            return False
        # (a descriptor that comes with anything else is closed unread: it proves nothing)
        if LISTENER in data and fds:
            self._listener(handed, fds)
        else:
            _close(fds)
        for asked in data:
            if asked == ASK_PORT[0]:
                self.by_port.send_port(dialer, handed)
            elif asked == ASK_SOCKET[0]:
                self.by_port.hand(dialer, handed)
        return True

    def _listener(self, handed: Handed[Identity, _Connection], fds: list[int]) -> None:
        """(LISTENER came with ``fds``, all taken or closed here) the first, if the host
        gave this dialer's worker a namespace of its own and it is the dialer's first
        listener, one of another network namespace: accepted on from now until the dialer
        ends."""
        if handed.listener is not None or handed.by_port:
            _close(fds)
            return
        # (the first taken or closed there)
        listener = listening_socket(fds[0])
        _close(fds[1:])
        if listener is None:
            return
        handed.listener = listener
        self._accept_on(listener, lambda conn, _: self._take(handed, conn))

    def _take(self, handed: Handed[Identity, _Connection], sock: socket.socket) -> None:
        """A connection of the worker whose dialer ``handed`` stands for: served to its end,
        in this thread, if its worker, its tenant and the host are under their caps; else
        answered at once (429 or 503, with Retry-After) and closed.  One accepted as its
        dialer ended (the worker is gone, nothing would end it) is closed unserved."""
        ident = handed.ident
        conn = _Connection(sock, handed.came)
        with self._lock:
            gone = handed.ended
            full = None if gone else self._full(ident)
            if not gone and full is None:
                ident.active += 1
                self.tenants[ident.tenant] = self.tenants.get(ident.tenant, 0) + 1
                self.connections += 1
                self._open.add(conn)
                handed.came.add(conn)
        if gone:
            sock.close()
            return
        if full is None:
            self._serve(ident, conn)
            return
        with sock:
            try:
                # Never blocks: an answer of a few hundred bytes fits at once
                sock.send(response(full.status, str(full), full.retry_after), socket.MSG_DONTWAIT)
            except OSError:
                pass

    def _full(self, ident: Identity) -> Optional[ProxyRefusal]:
        """The cap ``ident``'s next connection would pass (the lock held), or None."""
        for status, held, cap, whose in (
                (429, ident.active, self.max_per_worker, "this worker's"),
                (429, self.tenants.get(ident.tenant, 0), self.max_per_tenant, "this tenant's"),
                (503, self.connections, self.max_connections, "the host's")):
            if held >= cap:
                return ProxyRefusal(status, f"lcp-sandbox egress proxy: {whose} limit of {cap} "
                                       f"connections at once is reached", RETRY_AFTER_S)
        return None

    def _release(self, ident: Identity, conn: _Connection) -> None:
        """A connection ended: its slot back to its worker, its tenant and the host."""
        with self._lock:
            ident.active -= 1
            left = self.tenants.pop(ident.tenant) - 1
            if left:
                self.tenants[ident.tenant] = left
            self.connections -= 1
            self._open.discard(conn)
            conn.came.discard(conn)

    def _track(self, conn: _Connection, upstream: Optional[socket.socket]) -> None:
        """(egress_conn.serve's) The server's end of ``conn`` while it is open (None: it is
        about to close); one that opens after its connection was ended is shut down now."""
        with self._lock:
            conn.upstream = upstream
            if conn.ended:
                conn.end()

    # ------------------------------------------------------------ one connection
    def _serve(self, ident: Identity, conn: _Connection) -> None:
        """A connection (egress_conn.serve) on the socket, under ``ident``'s policy."""
        sock = conn.client
        try:
            sock.setblocking(True)
            # (an answer's head and body, written apart, must not wait for an ACK)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            serve(sock, lambda host, port: self._admit(ident, host, port), self.head_timeout_s,
                  lambda upstream: self._track(conn, upstream), ident.secrets)
        except OSError:
            pass
        except Exception:                                   # noqa: BLE001 (a bug: say it)
            log.exception("egress proxy: a connection of tenant %s, library %s failed",
                          ident.tenant, ident.library)
        finally:
            self._release(ident, conn)
            sock.close()

    def _admit(self, ident: Identity, host: str, port: int) -> list[Address]:
        """The addresses (host, port) may be reached at, or ProxyRefusal.  The name first: a
        name no rule admits is never resolved (no lookups on the host's resolver for
        names a tool chose); then exactly the string the rules matched is resolved, and
        every address it resolved to is checked: those a rule admits are returned."""
        named = ident.policy.check(host, port, [])
        self._decide(ident, named, host, port)
        decision = ident.policy.check(named.host, port, _resolve(named.host, port))
        self._decide(ident, decision, named.host, port, count=True)
        return list(decision.addresses)

    def _decide(self, ident: Identity, decision: Decision, host: str, port: int,
                count: bool = False) -> None:
        """Go on if ``decision`` admits (counted when ``count``: the last check); else
        count, log (the first few of a worker) and refuse: 403 naming the rule."""
        if decision.admitted:
            if count:
                self.metrics.egress(True, decision.rule)
            return
        self.metrics.egress(False, decision.rule)
        ident.refused += 1
        if ident.refused <= _LOGGED_PER_WORKER:
            log.warning("egress refused: tenant %s, library %s, to %s port %d: %s%s",
                        ident.tenant, ident.library, host, port, decision.why,
                        " (further refusals of this worker are counted, not logged)"
                        if ident.refused == _LOGGED_PER_WORKER else "")
        raise ProxyRefusal(403, f"lcp-sandbox network policy: {decision.why}")


@dataclass(eq=False)
class _Connection:
    """A connection being served: the worker's socket, the server's while it is open, and
    the set of the connections that came through the same dialer (it is one of them)."""
    client: socket.socket
    came: set["_Connection"]
    upstream: Optional[socket.socket] = None
    ended: bool = False

    def end(self) -> None:
        """Shut both ends down: the connection's thread sees them end and lets go (called
        with the proxy's lock held, so neither socket is closed meanwhile)."""
        self.ended = True
        for sock in (self.client, self.upstream):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


async def _exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock``, not one more."""
    got = b""
    while len(got) < n:
        data = await loop.sock_recv(sock, n - len(got))
        if not data:
            raise ConnectionResetError("the dialer closed before its token")
        got += data
    return got


def _resolve(host: str, port: int) -> list[Address]:
    """Every address of ``host``, a canonical_host() (the host's resolver, in the
    connection's own thread; an address is itself).  The name goes to the resolver as the
    ASCII bytes the rules matched: no codec re-spells it on the way."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        if canonical_host(host) != host:
            raise ValueError(f"{host!r} is not spelled as the rules match names")
    except ValueError as exc:
        raise ProxyRefusal(400, f"lcp-sandbox egress proxy: {exc}") from None
    try:
        infos = socket.getaddrinfo(host.encode("ascii"), port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ProxyRefusal(502, f"{host} cannot be resolved ({exc})") from None
    return list(dict.fromkeys(ipaddress.ip_address(str(i[4][0]).split("%")[0]) for i in infos))


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
