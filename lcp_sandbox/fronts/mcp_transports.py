"""The transports of the MCP server: stdio, and Streamable HTTP behind a guard.

    stdio:  stdio_server() ══► McpFront.server.run()          one session, made before serving
    http:   uvicorn ─► Starlette /mcp ─► _Guard ─► StreamableHTTPSessionManager ─► McpFront.server
            _Guard: Host (421) and Origin (403) against the allowlists, then the bearer
            token (401), before the session manager sees the request (no session, no worker).
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
from typing import Any, Callable, Optional

import anyio
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings

from ..backends.local import Supervisor
from .mcp_server import McpFront, ServeOptions

MCP_PATH = "/mcp"
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def serve_stdio(options: ServeOptions) -> int:
    """One session over stdin/stdout until the client closes stdin.  The SDK's stdio
    transport moves fd 1 to stderr while it runs, so nothing but protocol messages
    reaches stdout (the zygote is started later and inherits that)."""
    from mcp.server.stdio import stdio_server

    async def main() -> None:
        supervisor = Supervisor(confine=options.confine)
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


class _Guard:
    """Every HTTP request passes here first: a foreign Host (421) or Origin (403), or a
    missing or wrong bearer token (401), is refused before any session exists."""

    def __init__(self, app: Callable, security: TransportSecuritySettings,
                 token: Optional[str]) -> None:
        self.app = app
        self.check = TransportSecurityMiddleware(security)
        self.token = token.encode() if token else None

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
        await self.app(scope, receive, send)


def http_app(front: McpFront, security: TransportSecuritySettings, token: Optional[str] = None,
             on_ready: Optional[Callable[[], None]] = None) -> Any:
    """The Starlette app: Streamable HTTP at /mcp behind the guard."""
    from starlette.applications import Starlette
    from starlette.routing import Route
    manager = StreamableHTTPSessionManager(app=front.server, security_settings=security)

    @asynccontextmanager
    async def lifespan(app: Any) -> Any:
        async with manager.run():
            if on_ready is not None:
                on_ready()
            yield

    guard = _Guard(manager.handle_request, security, token)
    return Starlette(routes=[Route(MCP_PATH, endpoint=guard)], lifespan=lifespan)


def serve_http(options: ServeOptions, host: str, port: int, token: Optional[str] = None,
               allowed_hosts: tuple = (), allowed_origins: tuple = ()) -> int:
    """Serve Streamable HTTP until SIGINT / SIGTERM.  The ready line on stderr names the URL."""
    import uvicorn
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(128)
    port = sock.getsockname()[1]
    url = f"http://{_netloc(host.strip('[]'), port)}{MCP_PATH}"
    os.makedirs(options.workspace_root, exist_ok=True)
    supervisor = Supervisor(confine=options.confine, tenants_root=options.workspace_root)
    front = McpFront(options, supervisor)
    security = transport_security(host.strip("[]"), port, tuple(allowed_hosts),
                                  tuple(allowed_origins))

    def ready() -> None:
        print(f"lcp-sandbox serve-mcp: serving {url} (sessions' workspaces under "
              f"{options.workspace_root})", file=sys.stderr, flush=True)

    app = http_app(front, security, token, on_ready=ready)
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", ws="none",
                            timeout_graceful_shutdown=5)
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
