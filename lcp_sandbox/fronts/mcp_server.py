"""The MCP front of the engine: ``lcp-sandbox serve-mcp`` (official ``mcp`` SDK 2.x).

    MCP client ══ stdio, or Streamable HTTP at /mcp (mcp_transports.py) ══► McpFront
                                                              (a low-level mcp Server)
      each MCP session ─► _Session: one SandboxedBinding, tenant "mcp-s<hash of the session id>",
                          workspace <workspace-root>/s<hash> (stdio: one session, --workspace)
      signed in (--auth-issuer) ─► the user's _Session, shared by all of the user's sessions:
                          tenant "mcp-u<hash of iss and claim>" (mcp_users.py), kept when
                          they end, removed after --tenant-idle-timeout with none
      --auth-policy ─► tools/list shows, tools/call runs, only what the user's claims allow
      tools/list ─► refresh ─► discover_tools() in a thread ─► mcp_mapping.tool_entry
      tools/call ─► refresh ─► check (unknown tool, arguments vs inputSchema)
                 ─► thread: execute_tool(name, args, tool_context=ToolContext)
                    ─► mcp_mapping.call_result
                      on that thread, the confirm / user-interaction handlers and emit_progress
                      hop to the event loop (anyio.from_thread.run) to elicit / notify the client
                 cancelled ─► binding.interrupt(thread), retried until the call reached its worker
      refresh: a library file changed on disk ─► restart_library,
               discover_tools(force_refresh=True), notifications/tools/list_changed
      session ends (DELETE, idle timeout, stdin closed) ─► binding.close(): its workers stop
               HTTP: ─► Supervisor.remove_tenant(): its disk, its workspace, its uid go too
      initialize (HTTP) ─► _track: the session counts for its client (mcp_limits.ClientSessions)
                           until it ends
    One Supervisor serves every session (--ray: a RaySupervisor, mcp_ray.py); at the start of
    an HTTP server, the sessions an earlier one left (stopped without ending them: killed)
    are removed (sweep).

Only the public API of SandboxedBinding and Supervisor is used.  mcp 2.3 gives a
low-level handler no public way to its connection (per-connection state and
teardown); ``_connection_of`` reads the one attribute the SDK's own tests use.
"""
from __future__ import annotations

import copy
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import anyio
import anyio.lowlevel
import mcp_types as types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.shared.exceptions import MCPError
from opentelemetry import trace

from ..core.version import __version__
from . import mcp_mapping as M
from .lollms import SandboxedBinding
from .mcp_calls import ToolCall, current_call
from .mcp_limits import (
    DEFAULT_SESSIONS_PER_CLIENT,
    ClientSessions,
    default_max_sessions,
    rate_error,
)
from .mcp_ray import ServerBackend, held_tenants
from .mcp_sessions import Session as _Session
from .mcp_sessions import snapshot as _snapshot
from .mcp_users import NOT_ALLOWED, TenantNames, Users, allowed, permits, signed_in, user_tenant

log = logging.getLogger("lcp_sandbox.mcp")

# Tool calls waiting in threads at once, all sessions together.
CALL_THREADS = 128
_tracer = trace.get_tracer("lcp_sandbox")
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_STATE_KEY = "lcp_sandbox.session"
_COUNTED_KEY = "lcp_sandbox.counted"

NO_ELICITATION = ("The MCP client cannot confirm actions (it did not declare the elicitation "
                  "capability), so the action was rejected.")
AUTO_ALLOWED = ("Allowed without asking: the MCP client cannot confirm actions "
                "(--auto-confirm allow).")


@dataclass
class ServeOptions:
    """What every session's binding is made with (the command line's options)."""
    folders: list
    host_tool_configs: dict = field(default_factory=dict)
    # Stdio: the one session's workspace (default: CWD)
    workspace: Optional[str] = None
    # Http: <root>/<a hash of the session id or user> per tenant.
    workspace_root: str = "mcp-workspaces"
    # True, False or "best-effort".
    confine: Union[bool, str] = False
    # True, False or a policy (core/egress_rules.py)
    network: Union[bool, dict] = True
    timeout_s: Optional[float] = 60.0
    memory_mb: Optional[float] = None
    # The answer when the client cannot be asked.
    auto_confirm: Optional[str] = None
    # What keeps one client from taking the server (docs/mcp.md; mcp_limits.py)
    max_sessions: int = field(default_factory=default_max_sessions)
    # Per bearer token / address.
    max_sessions_per_client: int = DEFAULT_SESSIONS_PER_CLIENT
    session_idle_timeout_s: float = 1800.0
    # Root host: the sessions' uids.
    uid_range: Optional[tuple[int, int]] = None
    # The supervisor's pool.
    max_workers: Optional[int] = None
    max_workers_per_session: Optional[int] = None
    # More wait their turn.
    max_calls_per_session: int = 8
    # tools/call per second per session.
    rate_limit: Optional[float] = None
    # GET /metrics (http)
    metrics: bool = False
    # Http connections at once (more: 503)
    max_connections: int = 1024
    # Tokens checked (--auth-issuer): a tenant per signed-in user.
    signed_in: bool = False
    tenant_idle_timeout_s: float = 3600.0
    keep_workspaces: bool = False
    # --auth-policy's rules (mcp_users.Rule); None: every tool for everyone.
    policy: Optional[list] = None
    # --secret's values (the egress proxy's), --upstream-ca-file
    secrets: dict = field(default_factory=dict)
    upstream_ca_file: Optional[str] = None
    # --ray: the Ray cluster's address ("auto": the one Ray finds); None: this machine
    ray: Optional[str] = None


def _connection_of(ctx: Any) -> Any:
    # mcp 2.3: ServerRequestContext has no public accessor for the Connection
    # (state, exit_stack, session_id) yet; its own tests read this attribute.
    return getattr(ctx.session, "_connection", None)


# ---------------------------------------------------------------- the server
class _Server(Server):
    def create_initialization_options(
            self, notification_options: Optional[NotificationOptions] = None,
            experimental_capabilities: Optional[dict] = None,
            extensions: Optional[dict] = None) -> Any:
        # tools.listChanged is declared on every transport (the HTTP session
        # manager asks for the default options).
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities, extensions)


class McpFront:
    """The MCP server over one engine (a Supervisor, or a RaySupervisor with --ray): a
    session per MCP session (HTTP) or one (stdio)."""

    def __init__(self, options: ServeOptions, supervisor: ServerBackend) -> None:
        self.options = options
        self.supervisor = supervisor
        self.stdio_session: Optional[_Session] = None
        # HTTP sessions by MCP session id.
        self.sessions: dict[str, _Session] = {}
        # The front's: session cap, rate.
        self.refusals: dict[str, int] = {}
        # HTTP: sessions per client.
        self.clients: Optional[ClientSessions] = None
        self._create_lock: Optional[anyio.Lock] = None
        self._limiter: Optional[anyio.CapacityLimiter] = None
        # Tenants named by keyed hashes (mcp_users.py); signed-in users' tenants.
        self.names = TenantNames()
        self.users = Users(options.tenant_idle_timeout_s) if options.signed_in else None
        # Tools/call refused by --auth-policy, by tool.
        self.policy_refusals: dict[str, int] = {}
        self.server = _Server("lcp-sandbox", version=__version__,
                              instructions="Tools of LCP libraries, each library run in an "
                                           "isolated worker process of this session.",
                              on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        self.server.middleware.append(self._track)

    # -------------------------------------------- sessions
    def make_session(self, workspace: str, tenant: str,
                     workspace_root: Optional[str] = None) -> _Session:
        """A session's binding on the shared supervisor (blocking: call it in a thread)."""
        os.makedirs(workspace, exist_ok=True)
        o = self.options
        binding = SandboxedBinding(tools_folders=list(o.folders),
                                   host_tool_configs=copy.deepcopy(o.host_tool_configs),
                                   workspace=workspace, workspace_root=workspace_root,
                                   tenant=tenant, timeout_s=o.timeout_s, memory_mb=o.memory_mb,
                                   supervisor=self.supervisor, confine=o.confine,
                                   network=o.network)
        binding.set_confirm_handler(self._confirm)
        binding.set_user_interaction_handler(self._ask)
        log.info("session %s: workspace %s", tenant, workspace)
        return _Session(binding, list(o.folders), workspace, o, workspace_root is not None)

    async def _session(self, ctx: Any) -> _Session:
        if self.stdio_session is not None:
            return self.stdio_session
        conn = _connection_of(ctx)
        sid = getattr(conn, "session_id", None)
        if conn is None or not isinstance(sid, str) or not _SESSION_ID.fullmatch(sid):
            raise MCPError(types.INVALID_REQUEST,
                           "lcp-sandbox keeps tool state per MCP session: connect with a "
                           "stateful session (initialize) over Streamable HTTP")
        session = conn.state.get(_STATE_KEY)
        if session is None:
            self._create_lock = self._create_lock or anyio.Lock()
            async with self._create_lock:
                session = conn.state.get(_STATE_KEY)
                if session is None:
                    session = await self._open(conn, sid, _access(ctx))
        return session

    async def _open(self, conn: Any, sid: str, access: Any) -> _Session:
        """The session of a new MCP session: its own, or its signed-in user's."""
        users = self.users
        if users is None:
            tenant = self.names.session(sid)
            session = await self._make(tenant)
            conn.exit_stack.push_async_callback(self.end_session, session, sid)
        else:
            if access is None:
                raise MCPError(types.INVALID_REQUEST, "sign in: this server takes a bearer "
                                                      "token from its issuer")
            tenant = user_tenant(self.names, access)
            session = users.sessions.get(tenant) or await self._make(tenant)
            users.sessions[tenant] = session
            users.joined(tenant, sid)
            conn.exit_stack.callback(self._left, tenant, sid)
        conn.state[_STATE_KEY] = session
        self.sessions[sid] = session
        return session

    async def _make(self, tenant: str) -> _Session:
        workspace = os.path.join(self.options.workspace_root, tenant[len("mcp-"):])
        return await anyio.to_thread.run_sync(self.make_session, workspace, tenant, workspace)

    def _left(self, tenant: str, sid: str) -> None:
        """A signed-in user's MCP session ended: the user's tenant stays (idle)."""
        self.sessions.pop(sid, None)
        if self.users is not None:
            self.users.left(tenant, sid)

    async def reap_users(self, every_s: Optional[float] = None) -> None:
        """(runs while the HTTP server serves) Remove the tenants of users idle for
        --tenant-idle-timeout; when the server ends, every user's."""
        users = self.users
        if users is None:
            return
        every = every_s or max(0.05, min(30.0, users.idle_s / 4))
        try:
            while True:
                await anyio.sleep(every)
                self._create_lock = self._create_lock or anyio.Lock()
                async with self._create_lock:
                    for session in users.idle():
                        log.info("user tenant %s: idle, removed", session.binding.tenant)
                        await anyio.to_thread.run_sync(self._finish, session)
        finally:
            with anyio.CancelScope(shield=True):
                for session in users.all():
                    await anyio.to_thread.run_sync(self._finish, session)

    async def end_session(self, session: _Session, sid: Optional[str] = None) -> None:
        """Stop the session's workers (its running calls were cancelled, so interrupted);
        over HTTP, remove its workspace, its disk and give its uid back too."""
        log.info("session %s ended", session.binding.tenant)
        self.sessions.pop(sid or "", None)
        await anyio.to_thread.run_sync(self._finish, session, abandon_on_cancel=True)

    def _finish(self, session: _Session) -> None:
        session.close()
        if session.own_workspace:
            keep = self.options.keep_workspaces
            self._remove(session.binding.tenant, None if keep else session.workspace)

    def _remove(self, tenant: str, workspace: Optional[str]) -> None:
        try:
            self.supervisor.remove_tenant(tenant, workspace)
        except (OSError, ValueError) as exc:
            log.warning("session %s: not all of it was removed: %s", tenant, exc)

    def sweep(self) -> int:
        """Remove the sessions an earlier server on this workspace root left (their tenants
        still hold a uid in its store: it was stopped without ending them); how many."""
        root = self.options.workspace_root
        stale = [t for t in held_tenants(self.supervisor)
                 if t.startswith("mcp-") and _SESSION_ID.fullmatch(t[4:])]
        for tenant in stale:
            self._remove(tenant, os.path.join(root, tenant[4:]))
        if stale:
            log.info("removed %d sessions an earlier server left in %s", len(stale), root)
        return len(stale)

    async def _track(self, ctx: Any, call_next: Any) -> Any:
        """(server middleware) An HTTP session counts for its client from its initialize
        until it ends (the connection's exit stack)."""
        clients = self.clients
        if ctx.method == "initialize" and clients is not None:
            conn = _connection_of(ctx)
            sid = getattr(conn, "session_id", None)
            if conn is not None and isinstance(sid, str) and _COUNTED_KEY not in conn.state:
                conn.state[_COUNTED_KEY] = True
                clients.started(sid)
                conn.exit_stack.callback(clients.ended, sid)
        return await call_next(ctx)

    # -------------------------------------------- load: refusals and numbers
    def refused(self, reason: str) -> None:
        """Count a request the front refused (``session_cap``, ``rate``)."""
        self.refusals[reason] = self.refusals.get(reason, 0) + 1

    def metrics(self) -> dict[str, Any]:
        """The engine's numbers (Supervisor.metrics()) and the front's: live sessions,
        refusals by reason (the front's added to the engine's), and the egress proxy's
        open connections."""
        snap = self.supervisor.metrics()
        refusals = dict(snap.get("refusals", {}))
        for reason, n in self.refusals.items():
            refusals[reason] = refusals.get(reason, 0) + n
        live = len(self.sessions) + (self.stdio_session is not None)
        return {**snap, "refusals": refusals, "sessions": live,
                "egress_open": self._egress_open(), "policy_refusals": dict(self.policy_refusals)}

    def _egress_open(self) -> dict[str, int]:
        """The egress proxy's connections at once, host-wide, and the tenants holding one
        (by count only: a tenant's name holds its session's id)."""
        proxy = getattr(self.supervisor, "egress", None)
        if proxy is None:
            return {"connections": 0, "tenants": 0}
        return {"connections": proxy.connections, "tenants": len(proxy.tenants)}

    async def _refresh(self, session: _Session, ctx: Any) -> None:
        """Library files changed on disk: restart their workers, list again, tell the client."""
        if _snapshot(session.folders) == session.files:
            return
        session.refresh_lock = session.refresh_lock or anyio.Lock()
        async with session.refresh_lock:
            now = _snapshot(session.folders)
            moved = set(now.items()) ^ set(session.files.items())
            changed = sorted({entry[0] for _, entry in moved})
            if not changed:
                return
            session.files = now

            def apply() -> None:
                for library in changed:
                    session.binding.restart_library(library)
                session.binding.discover_tools(force_refresh=True)
            await anyio.to_thread.run_sync(apply)
            log.info("session %s: libraries changed on disk: %s", session.binding.tenant,
                     ", ".join(changed))
            try:
                await ctx.session.send_notification(types.ToolListChangedNotification(),
                                                    related_request_id=ctx.request_id)
            except Exception as exc:
                log.warning("tools/list_changed not sent: %s", exc)

    # -------------------------------------------- handlers
    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        session = await self._session(ctx)
        await self._refresh(session, ctx)
        specs = await anyio.to_thread.run_sync(session.binding.discover_tools)
        names = self._allowed(ctx)
        if names is not None:
            specs = [s for s in specs if permits(names, _library(session, s["name"]), s["name"])]
        tools = [types.Tool.model_validate(M.tool_entry(s)) for s in specs]
        return types.ListToolsResult(tools=tools)

    async def _call_tool(self, ctx: Any,
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        session = await self._session(ctx)
        # Over HTTP the guard answered 429 before.
        if session is self.stdio_session:
            wait = session.throttled()
            if wait is not None:
                self.refused("rate")
                error = rate_error(self.options.rate_limit or 0.0, wait)
                raise MCPError(error["code"], error["message"], data=error["data"])
        await self._refresh(session, ctx)
        arguments = params.arguments or {}
        problem = self._refuse(session, ctx, params.name) or session.check(params.name, arguments)
        if problem is not None:
            return types.CallToolResult(content=[types.TextContent(type="text", text=problem)],
                                        is_error=True)
        session.calls = session.calls or anyio.Semaphore(session.max_calls)
        # This session's calls beyond the cap wait here.
        async with session.calls:
            with _tracer.start_as_current_span(f"lcp_sandbox {params.name}") as span:
                result = await self._run(session, ctx, params.name, arguments)
                if span.is_recording():
                    _describe(span, session, params.name, result)
        content, structured, is_error = M.call_result(result)
        return types.CallToolResult.model_validate(
            {"content": content, "structuredContent": structured, "isError": is_error})

    def _allowed(self, ctx: Any) -> Optional[frozenset]:
        """What --auth-policy lets this request's user use (None: no policy: everything)."""
        if self.options.policy is None:
            return None
        access = _access(ctx)
        return allowed(self.options.policy, access.claims or {}) if access else frozenset()

    def _refuse(self, session: _Session, ctx: Any, name: str) -> Optional[str]:
        """The error text of a tool the policy does not allow this user, counted by tool (a
        tool that exists: a made-up name is no new label) and logged with the tenant."""
        names = self._allowed(ctx)
        library = _library(session, name)
        if names is None or permits(names, library, name):
            return None
        label = name if library else "(unknown)"
        self.policy_refusals[label] = self.policy_refusals.get(label, 0) + 1
        log.warning("user tenant %s: tool %r refused by --auth-policy", session.binding.tenant,
                    name[:128])
        return NOT_ALLOWED.format(name=name)

    async def _run(self, session: _Session, ctx: Any, name: str, arguments: dict) -> dict:
        call = ToolCall(session, ctx)
        self._limiter = self._limiter or anyio.CapacityLimiter(CALL_THREADS)
        try:
            return await anyio.to_thread.run_sync(call.run, name, arguments,
                                                  abandon_on_cancel=True, limiter=self._limiter)
        except anyio.get_cancelled_exc_class():
            call.cancel()
            raise

    # -------------------------------------------- the binding's handlers (on a call's thread)
    def _confirm(self, *args: Any, **kwargs: Any) -> tuple[str, str]:
        source, label, argv = M.confirm_request(args, kwargs)
        call = current_call()
        if call is None:
            return "reject", "No MCP tool call is running to ask the user through."
        if not call.can_elicit:
            if self.options.auto_confirm == "allow":
                return "allow", AUTO_ALLOWED
            return "reject", NO_ELICITATION
        action, content = call.elicit(*M.confirm_form(source, label, argv))
        return M.confirm_decision(action, content)

    def _ask(self, *args: Any, **kwargs: Any) -> Optional[str]:
        call = current_call()
        form = M.ask_form(M.ask_request(args, kwargs))
        if call is None or not call.can_elicit or form is None:
            return None
        return M.ask_answer(*call.elicit(*form))


def _access(ctx: Any) -> Any:
    """The verified token of the request being handled (HTTP, signed in), or None."""
    request = getattr(ctx, "request", None)
    return signed_in(getattr(request, "scope", None))


def _library(session: _Session, tool: str) -> str:
    """The library of a discovered tool, or "" for no tool."""
    route = session.binding.catalog.routes.get(tool)
    return route.library.name if route is not None else ""


def _describe(span: Any, session: _Session, tool: str, result: dict) -> None:
    """The attributes of a recorded tool-call span (only when a tracing SDK records)."""
    route = session.binding.catalog.routes.get(tool)
    library = route.library.name if route is not None else ""
    start = next((row.get("start") for row in session.binding.stats()
                  if row.get("library") == library), None)
    span.set_attributes({"lcp.library": library, "lcp.tool": tool,
                         "lcp.tenant": session.binding.tenant,
                         "lcp.status": int(result.get("status_code") or 0),
                         "lcp.worker_start": str(start or "")})
