"""The transports of the MCP server: stdio, and Streamable HTTP behind a guard.

    stdio:  stdio_server() ══► McpFront.server.run()          one session, made before serving
    http:   uvicorn ─► Starlette /mcp ─► _Guard ─► StreamableHTTPSessionManager ─► McpFront.server
            _Guard: Host (421) and Origin (403) against the allowlists, then the bearer
            token (401), before the session manager sees the request (no session, no worker);
            a POST body that gives a key twice in an object: 400 + JSON-RPC parse error
            (core/strict_json; the SDK's parser would keep the last silently);
            a session's tools/call over --rate-limit: 429 + Retry-After (the body is read
            here, then handed on); a request that would open a session for a client (its
            bearer token, else its address) that holds --max-sessions-per-client: 429 +
            Retry-After; the manager's 503 for a session over --max-sessions gets a
            Retry-After on its way out
            /metrics (--metrics): the same guard, then McpFront.metrics() as Prometheus text
            /healthz: outside the guard, 200 "ok" while the server serves (probes)
            signed in (--auth-issuer): the guard's bearer check is the SDK's BearerAuthBackend
            over mcp_auth.JwtVerifier, then its RequireAuthMiddleware (401 with
            resource_metadata, 403 insufficient_scope); the verified user in scope["user"]
            (the SDK binds each session to it); RFC 9728 metadata at
            /.well-known/oauth-protected-resource[/mcp], outside the guard
            uvicorn: at most --max-connections at once (more: 503), a listen backlog to match
"""
from __future__ import annotations

import hmac
import ipaddress
import os
import signal
import socket
import sys
import threading
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Callable, Optional

import anyio
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings

from ..backends.local import Supervisor
from ..core import strict_json
from .mcp_limits import (
    ClientSessions,
    client_of,
    rate_error,
    retry_after,
    too_many_sessions,
)
from .mcp_ray import ServerBackend, ray_supervisor
from .mcp_server import McpFront, ServeOptions
from .mcp_users import signed_in, user_tenant

if TYPE_CHECKING:
    from .mcp_auth import AuthConfig, JwtVerifier

MCP_PATH = "/mcp"
METRICS_PATH = "/metrics"
HEALTH_PATH = "/healthz"
SESSION_HEADER = b"mcp-session-id"
# The SDK's own cap on a request body.
MAX_PEEK = 4 * 1024 * 1024
# Retry-After of a new session refused at the cap.
SESSION_CAP_RETRY_S = 5.0
# JSON-RPC's "Parse error".
PARSE_ERROR = -32700
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def serve_stdio(options: ServeOptions) -> int:
    """One session over stdin/stdout until the client closes stdin.  The SDK's stdio
    transport moves fd 1 to stderr while it runs, so nothing but protocol messages
    reaches stdout (the zygote is started later and inherits that)."""
    from mcp.server.stdio import stdio_server

    async def main() -> None:
        supervisor = (ray_supervisor(options, http=False) if options.ray is not None
                      else Supervisor(confine=options.confine, **_uid_range(options)))
        front = McpFront(options, supervisor)
        try:
            async with stdio_server() as (read, write):
                workspace = os.path.realpath(options.workspace or os.getcwd())
                session = await anyio.to_thread.run_sync(front.make_session, workspace, "mcp")
                front.stdio_session = session
                try:
                    await front.server.run(read, write,
                                           front.server.create_initialization_options())
                finally:
                    with anyio.CancelScope(shield=True):
                        await front.end_session(session)
        finally:
            supervisor.close()
    anyio.run(main)
    return 0


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the server on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def transport_security(host: str, port: int, allowed_hosts: tuple = (),
                       allowed_origins: tuple = ()) -> TransportSecuritySettings:
    """Host and Origin allowlists: the bound address (and the loopback names when it is a
    loopback or wildcard address) on this port, plus the ones given."""
    names = [host]
    if is_loopback(host) or host in ("0.0.0.0", "::"):
        names += [n for n in _LOOPBACK_NAMES if n != host]
    names = [n for n in names if n not in ("0.0.0.0", "::")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[_netloc(n, port) for n in names] + list(allowed_hosts),
        allowed_origins=[f"http://{_netloc(n, port)}" for n in names] + list(allowed_origins))


def _bearer_ok(header: Optional[str], token: bytes) -> bool:
    scheme, _, value = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token)


def _uid_range(options: ServeOptions) -> dict[str, Any]:
    """The supervisor's settings the options may hold: uids, secrets, upstream CAs."""
    return {**({} if options.uid_range is None else {"uid_range": options.uid_range}),
            "secrets": options.secrets, "upstream_ca_file": options.upstream_ca_file}


class _Guard:
    """Every HTTP request passes here first: a foreign Host (421) or Origin (403), or a
    missing or wrong bearer token (401), is refused before any session exists; with a
    front, a session's tools/call over its rate gets 429, a new session of a client at
    its cap gets 429, and a new session refused at the session cap gets its 503 with a
    Retry-After."""

    def __init__(self, app: Callable, security: TransportSecuritySettings,
                 token: Optional[str], front: Optional[McpFront] = None,
                 signin: Optional["SignIn"] = None) -> None:
        self.app = app
        self.check = TransportSecurityMiddleware(security)
        self.token = token.encode() if token else None
        self.front = front
        self.signin = signin
        # Keys the hash that names a token's client (never the token itself).
        self._salt = os.urandom(16)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        from starlette.requests import Request
        from starlette.responses import Response
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        refused = await self.check.validate_request(request, is_post=False)
        if (refused is None and self.token is not None
                and not _bearer_ok(request.headers.get("authorization"), self.token)):
            refused = Response("Unauthorized: send 'Authorization: Bearer <token>'",
                               status_code=401,
                               headers={"WWW-Authenticate": 'Bearer realm="lcp-sandbox"'})
        if refused is not None:
            await refused(scope, receive, send)
            return
        if self.signin is not None:
            return await self.signin.check(scope, receive, send, self._checked)
        await self._checked(scope, receive, send)

    async def _checked(self, scope: dict, receive: Callable, send: Callable) -> None:
        """A request past the Host, Origin and bearer checks."""
        from starlette.requests import Request
        request = Request(scope)
        if self.front is None:
            return await self.app(scope, receive, send)
        message: Any = None
        if scope["method"] == "POST":
            body, receive = await _peek(receive)
            message, twice = _message(body)
            if twice is not None:
                await _parse_error(twice)(scope, receive, send)
                return
        sid = request.headers.get("mcp-session-id")
        if sid is None and self.front.clients is not None:
            return await self._new_session(scope, receive, send, self.front.clients)
        session = self.front.sessions.get(sid) if sid else None
        if session is not None and session.bucket is not None and scope["method"] == "POST":
            wait = session.throttled() if _is_call(message) else None
            if wait is not None:
                self.front.refused("rate")
                await _rate_limited(wait, self.front.options.rate_limit)(scope, receive, send)
                return
        await self.app(scope, receive, send if sid else self._cap_aware(send))

    def _client(self, scope: dict) -> str:
        """Who a request comes from (mcp_limits.client_of): signed in, the user; else the
        bearer token it passed with when the server has one (the one token: every holder of
        it is one client), else its peer's address, loopback addresses all one."""
        client = scope.get("client")
        access = signed_in(scope)
        user = (user_tenant(self.front.names, access)
                if access is not None and self.front is not None else None)
        return client_of(client[0] if client else None, self.token, self._salt, user)

    async def _new_session(self, scope: dict, receive: Callable, send: Callable,
                           clients: ClientSessions) -> None:
        """A request without a session may open one: its client must have room."""
        assert self.front is not None
        client = self._client(scope)
        if not clients.admit(client):
            self.front.refused("client_sessions")
            await _too_many(clients.cap, self.front.options.session_idle_timeout_s)(
                scope, receive, send)
            return
        made: list[str] = []

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                made.extend(v.decode("latin-1") for k, v in message.get("headers", ())
                            if k.lower() == SESSION_HEADER)
            await send(message)
        try:
            await self.app(scope, receive, self._cap_aware(sending))
        finally:
            clients.opened(client, made[0] if made else None)

    def _cap_aware(self, send: Callable) -> Callable:
        """``send`` for a request without a session: a 503 (the session cap) gets a
        Retry-After, and is counted."""
        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start" and message["status"] == 503:
                assert self.front is not None
                self.front.refused("session_cap")
                headers = [*message.get("headers", ()),
                           (b"retry-after", retry_after(SESSION_CAP_RETRY_S).encode())]
                message = {**message, "headers": headers}
            await send(message)
        return sending


async def _peek(receive: Callable) -> tuple[bytes, Callable]:
    """The request's body (up to MAX_PEEK bytes), and a ``receive`` that gives it again."""
    chunks, size, more, extra = [], 0, True, None
    while more and size <= MAX_PEEK:
        message = await receive()
        if message["type"] != "http.request":
            extra = message
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False)
    body = b"".join(chunks)
    replay = [{"type": "http.request", "body": body, "more_body": more}]
    if extra is not None:
        replay.append(extra)

    async def again() -> dict:
        return replay.pop(0) if replay else await receive()
    return body, again


def _message(body: bytes) -> tuple[Any, Optional[strict_json.DuplicateKey]]:
    """A POST's JSON-RPC message (None when it is no JSON: the SDK answers that), or the
    key it gives twice in an object.  The SDK's parser keeps the last of two keys: refused
    here, no reader of the message can see another one than the next reader does."""
    try:
        return strict_json.loads(body), None
    except strict_json.DuplicateKey as exc:
        return None, exc
    except ValueError:
        return None, None


def _is_call(msg: Any) -> bool:
    msgs = msg if isinstance(msg, list) else [msg]
    return any(isinstance(m, dict) and m.get("method") == "tools/call" for m in msgs)


def _parse_error(twice: strict_json.DuplicateKey) -> Any:
    """The JSON-RPC parse error (HTTP 400, as the SDK's own) of a body with a key twice."""
    from starlette.responses import JSONResponse
    error = {"code": PARSE_ERROR, "message": f"Parse error: {twice}"}
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=400)


def _rate_limited(wait: float, rate: Optional[float]) -> Any:
    from starlette.responses import JSONResponse
    error = rate_error(rate or 0.0, wait)
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=429,
                        headers={"Retry-After": retry_after(wait)})


def _too_many(cap: int, idle_s: float) -> Any:
    from starlette.responses import JSONResponse
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": too_many_sessions(cap, idle_s)},
                        status_code=429,
                        headers={"Retry-After": retry_after(SESSION_CAP_RETRY_S)})


class SignIn:
    """Signed-in users (--auth-issuer): the MCP SDK's bearer backend over the verifier,
    then its RequireAuthMiddleware: 401 with ``resource_metadata`` for a missing or bad
    token, 403 ``insufficient_scope`` for a missing scope."""

    def __init__(self, config: "AuthConfig", verifier: "JwtVerifier", resource_url: str) -> None:
        from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
        from mcp.server.auth.routes import build_resource_metadata_url
        from pydantic import AnyHttpUrl
        self.config = config
        self.resource_url = resource_url
        self.backend = BearerAuthBackend(verifier)
        self.metadata_url = build_resource_metadata_url(AnyHttpUrl(resource_url))

    async def check(self, scope: dict, receive: Callable, send: Callable,
                    app: Callable) -> None:
        from mcp.server.auth.middleware.bearer_auth import RequireAuthMiddleware
        from starlette.requests import HTTPConnection
        found = await self.backend.authenticate(HTTPConnection(scope))
        if found is not None:
            scope["auth"], scope["user"] = found
        else:
            # Whatever came in (a user or auth of an outer layer) is no user here.
            scope.pop("user", None)
            scope.pop("auth", None)
        gate = RequireAuthMiddleware(app, list(self.config.required_scopes), self.metadata_url)
        await gate(scope, receive, send)

    def routes(self) -> list:
        """RFC 9728's document, at the resource's own path and at the bare well-known."""
        from mcp.server.auth.routes import create_protected_resource_routes
        from pydantic import AnyHttpUrl
        from starlette.routing import Route
        made = create_protected_resource_routes(
            AnyHttpUrl(self.resource_url), [AnyHttpUrl(self.config.issuer)],
            scopes_supported=list(self.config.required_scopes) or None,
            resource_name="lcp-sandbox")
        bare = "/.well-known/oauth-protected-resource"
        if made[0].path != bare:
            made.append(Route(bare, endpoint=made[0].endpoint, methods=["GET", "OPTIONS"]))
        return made


def http_app(front: McpFront, security: TransportSecuritySettings, token: Optional[str] = None,
             on_ready: Optional[Callable[[], None]] = None,
             signin: Optional[SignIn] = None) -> Any:
    """The Starlette app: Streamable HTTP at /mcp behind the guard."""
    from starlette.applications import Starlette
    from starlette.routing import Route
    o = front.options
    front.clients = ClientSessions(o.max_sessions_per_client)
    manager = StreamableHTTPSessionManager(app=front.server, security_settings=security,
                                           session_idle_timeout=o.session_idle_timeout_s,
                                           max_sessions=o.max_sessions)

    @asynccontextmanager
    async def lifespan(app: Any) -> Any:
        async with manager.run(), anyio.create_task_group() as tasks:
            tasks.start_soon(front.reap_users)
            if on_ready is not None:
                on_ready()
            yield
            tasks.cancel_scope.cancel()

    routes = [Route(MCP_PATH, endpoint=_Guard(manager.handle_request, security, token, front,
                                              signin)),
              Route(HEALTH_PATH, endpoint=_health, methods=["GET"])]
    if signin is not None:
        routes += signin.routes()
    if o.metrics:
        routes.append(Route(METRICS_PATH, endpoint=_Guard(_metrics_app(front), security, token,
                                                          signin=signin)))
    return Starlette(routes=routes, lifespan=lifespan)


async def _health(request: Any) -> Any:
    """GET (or HEAD) /healthz: 200 "ok" while the server serves, for liveness and readiness
    probes.  Outside the guard: a kubelet's probe names the pod's address in its Host header
    and holds no token, and the answer tells nothing but that the server is up."""
    from starlette.responses import PlainTextResponse
    return PlainTextResponse("ok\n")


def _metrics_app(front: McpFront) -> Callable:
    from starlette.responses import Response

    from .mcp_metrics import CONTENT_TYPE, exposition
    render = exposition(front.metrics)

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["method"] not in ("GET", "HEAD"):
            await Response("GET /metrics", status_code=405)(scope, receive, send)
            return
        await Response(render(), media_type=CONTENT_TYPE)(scope, receive, send)
    return app


def serve_http(options: ServeOptions, host: str, port: int, token: Optional[str] = None,
               allowed_hosts: tuple = (), allowed_origins: tuple = (),
               forwarded_allow_ips: Optional[str] = None,
               auth: Optional[tuple["AuthConfig", "JwtVerifier"]] = None) -> int:
    """Serve Streamable HTTP until SIGINT / SIGTERM.  The ready line on stderr names the URL.
    ``forwarded_allow_ips``: the proxies whose X-Forwarded-For names the client (checked
    by the command line); None: the header is ignored, the peer is the client."""
    import uvicorn
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto
    # says TCP, and accepted sockets inherit it.  With proto 0, an SSE body written after
    # its headers waited for the client's delayed ACK: 40 ms on every kept-alive call.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(max(128, options.max_connections))
    port = sock.getsockname()[1]
    url = f"http://{_netloc(host.strip('[]'), port)}{MCP_PATH}"
    os.makedirs(options.workspace_root, exist_ok=True)
    supervisor: ServerBackend = (ray_supervisor(options, http=True) if options.ray is not None
                                 else Supervisor(confine=options.confine,
                                                 tenants_root=options.workspace_root,
                                                 max_workers=options.max_workers,
                                                 max_workers_per_tenant=options.max_workers_per_session,
                                                 **_uid_range(options)))
    front = McpFront(options, supervisor)
    front.sweep()
    security = transport_security(host.strip("[]"), port, tuple(allowed_hosts),
                                  tuple(allowed_origins))

    def ready() -> None:
        confined = {True: "confined", False: "unconfined (--no-confine)",
                    "best-effort": "confined as far as this host allows (--confine-best-effort)"}
        print(f"lcp-sandbox serve-mcp: serving {url} (sessions' workspaces under "
              f"{options.workspace_root}; workers {confined[options.confine]}"
              f"{'; --no-confine to run them unconfined' if options.confine is True else ''})",
              file=sys.stderr, flush=True)

    signin = None
    if auth is not None:
        signin = SignIn(auth[0], auth[1], auth[0].resource_url or url)
    app = http_app(front, security, token, on_ready=ready, signin=signin)
    # Past max_connections, uvicorn answers 503 at once: a flood gets answers, never a
    # dropped connection, and the sessions the server has keep being served.
    # uvicorn's proxy_headers defaults to on, trusting X-Forwarded-For from 127.0.0.1 (or
    # $FORWARDED_ALLOW_IPS): any local process could then name itself any client.
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", ws="none",
                            timeout_graceful_shutdown=5, limit_concurrency=options.max_connections,
                            backlog=max(128, options.max_connections), timeout_keep_alive=30,
                            proxy_headers=forwarded_allow_ips is not None,
                            forwarded_allow_ips=forwarded_allow_ips or "")
    if threading.current_thread() is threading.main_thread():
        # uvicorn shuts down gracefully on SIGINT / SIGTERM, then raises the signal again
        # under the handlers it found: let that land here, so the supervisor closes too.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        supervisor.close()
        sock.close()
    return 0
