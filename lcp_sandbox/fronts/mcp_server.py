"""The MCP front of the engine: ``lcp-sandbox serve-mcp`` (official ``mcp`` SDK 2.x).

    MCP client ══ stdio, or Streamable HTTP at /mcp (mcp_transports.py) ══► McpFront
                                                              (a low-level mcp Server)
      each MCP session ─► _Session: one SandboxedBinding, tenant "mcp-<session id>",
                          workspace <workspace-root>/<session id> (stdio: one session, --workspace)
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
    One Supervisor serves every session.

Only the public API of SandboxedBinding and Supervisor is used.  mcp 2.3 gives a
low-level handler no public way to its connection (per-connection state and
teardown); ``_connection_of`` reads the one attribute the SDK's own tests use.
"""
from __future__ import annotations

import copy
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import anyio
import anyio.lowlevel
import mcp_types as types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.shared.exceptions import MCPError

from ..backends.local import Supervisor
from ..core.version import __version__
from . import mcp_mapping as M
from .lollms import SandboxedBinding

log = logging.getLogger("lcp_sandbox.mcp")

ELICIT_TIMEOUT_S = 600.0         # a question nobody answers is a rejection after this long
CALL_THREADS = 128               # tool calls waiting in threads at once, all sessions together
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_STATE_KEY = "lcp_sandbox.session"
_current = threading.local()     # .call: the _Call whose execute_tool runs on this thread

NO_ELICITATION = ("The MCP client cannot confirm actions (it did not declare the elicitation "
                  "capability), so the action was rejected.")
AUTO_ALLOWED = ("Allowed without asking: the MCP client cannot confirm actions "
                "(--auto-confirm allow).")


@dataclass
class ServeOptions:
    """What every session's binding is made with (the command line's options)."""
    folders: list
    host_tool_configs: dict = field(default_factory=dict)
    workspace: Optional[str] = None          # stdio: the one session's workspace (default: CWD)
    workspace_root: str = "mcp-workspaces"   # http: <root>/<session id> per session
    confine: bool = False
    timeout_s: Optional[float] = 60.0
    memory_mb: Optional[float] = None
    auto_confirm: Optional[str] = None       # the answer when the client cannot be asked


# ---------------------------------------------------------------- sessions
def _snapshot(folders: list) -> dict:
    """{path: (library, mtime_ns, size)} of the folders' library files (discovery's
    rules: each ``X/`` folder's ``.py`` files are library X, a loose ``Y.py`` is Y)."""
    out = {}
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir():
                    for f in os.scandir(entry.path):
                        if f.name.endswith(".py") and f.name != "__init__.py" and f.is_file():
                            st = f.stat()
                            out[f.path] = (entry.name, st.st_mtime_ns, st.st_size)
                elif entry.name.endswith(".py") and entry.name != "__init__.py" and entry.is_file():
                    st = entry.stat()
                    out[entry.path] = (entry.name[:-3], st.st_mtime_ns, st.st_size)
            except OSError:
                continue
    return out


class _Session:
    """One MCP session: its binding (tenant, workers, workspace) and what it saw on disk."""

    def __init__(self, binding: SandboxedBinding, folders: list, workspace: str) -> None:
        self.binding = binding
        self.folders = folders
        self.workspace = workspace
        self.files = _snapshot(folders)
        self.refresh_lock: Optional[anyio.Lock] = None      # made on the event loop
        self.closed = False
        self._specs: Any = None
        self._by_name: dict = {}
        self._validators: dict = {}

    def check(self, name: str, arguments: dict) -> Optional[str]:
        """None when ``name`` is a tool and ``arguments`` fit its inputSchema, else the
        text of the error result."""
        specs = self.binding.discovered_tools
        if specs is not self._specs:
            self._specs, self._by_name, self._validators = specs, {s["name"]: s for s in specs}, {}
        spec = self._by_name.get(name)
        if spec is None:
            return M.UNKNOWN_TOOL.format(name=name)
        validator = self._validators.get(name)
        if validator is None:
            from jsonschema.validators import validator_for
            schema = M.validation_schema(M.tool_entry(spec)["inputSchema"])
            validator = self._validators[name] = validator_for(schema)(schema)
        from jsonschema.exceptions import best_match
        error = best_match(validator.iter_errors(arguments))
        if error is None:
            return None
        where = ".".join(str(p) for p in error.absolute_path)
        message = f"{where}: {error.message}" if where else error.message
        return M.INVALID_INPUT.format(message=message)

    def close(self) -> None:
        self.closed = True
        self.binding.close()


class ToolContext:
    """The ``tool_context`` a tool gets from the MCP server (lent to the worker as a
    proxy): ``emit_progress(text, meta=None)`` becomes ``notifications/progress``
    when the client asked for progress; it returns False once the call is cancelled."""

    def __init__(self, call: "_Call", workspace: str) -> None:
        self._call = call
        self.workspace_path = self.workspace_root = workspace
        self.client = self.discussion = self.personality = self.callback = None

    def emit_progress(self, text: Any, meta: Optional[dict] = None) -> bool:
        return self._call.progress(text, meta)

    def emit_tool_event(self, *args: Any, **kwargs: Any) -> bool:
        return True


class _Call:
    """One tools/call: the thread it runs on, its cancellation, its way back to the loop."""

    def __init__(self, session: _Session, ctx: Any) -> None:
        self.session, self.ctx = session, ctx
        self.token = anyio.lowlevel.current_token()
        self.cancel_event = anyio.Event()                  # for the loop side
        self.cancelled, self.done = threading.Event(), threading.Event()
        self.lock = threading.Lock()
        self.thread: Optional[int] = None
        meta = ctx.params.get("_meta") if isinstance(ctx.params, Mapping) else None
        token = meta.get("progressToken") if isinstance(meta, Mapping) else None
        if not isinstance(token, (str, int)) or isinstance(token, bool):
            token = None
        self.progress_token = token
        self.progress_count = 0
        caps = ctx.session.client_capabilities
        asks = caps.elicitation if caps is not None else None
        self.can_elicit = (asks is not None and ctx.session.can_send_request
                           and (asks.form is not None or asks.url is None))
        self.context = ToolContext(self, session.workspace)

    # -------------------------------------------- on the call's thread
    def run(self, name: str, arguments: dict) -> dict:
        with self.lock:
            self.thread = threading.get_ident()
        _current.call = self
        try:
            if self.cancelled.is_set():
                return {"output": "cancelled before it started", "success": False,
                        "status_code": 499}
            return self.session.binding.execute_tool(name, arguments, tool_context=self.context)
        finally:
            _current.call = None
            with self.lock:
                self.done.set()

    def progress(self, text: Any, meta: Optional[dict]) -> bool:
        if self.cancelled.is_set():
            return False
        if self.progress_token is None:
            return True
        self.progress_count += 1
        progress, total = float(self.progress_count), None
        if isinstance(meta, dict):
            p, t = meta.get("progress"), meta.get("total")
            if isinstance(p, (int, float)) and not isinstance(p, bool):
                progress = float(p)
            if isinstance(t, (int, float)) and not isinstance(t, bool):
                total = float(t)
        try:
            anyio.from_thread.run(self.ctx.session.report_progress, progress, total,
                                  str(text)[:4000], token=self.token)
        except Exception as exc:                           # the request or the loop is gone
            log.debug("progress not sent: %s", exc)
        return not self.cancelled.is_set()

    def elicit(self, message: str, schema: dict) -> tuple[str, Optional[dict]]:
        """Ask the client; ``(action, content)``, or ``(what went wrong, None)``."""
        if self.cancelled.is_set():
            return "the tool call was cancelled", None
        try:
            return anyio.from_thread.run(self._elicit, message, schema, token=self.token)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}", None

    async def _elicit(self, message: str, schema: dict) -> tuple[str, Optional[dict]]:
        outcome: tuple = ("the tool call was cancelled", None)
        async with anyio.create_task_group() as tg:
            async def ask() -> None:
                nonlocal outcome
                try:
                    with anyio.fail_after(ELICIT_TIMEOUT_S):
                        r = await self.ctx.session.elicit_form(
                            message, schema, related_request_id=self.ctx.request_id)
                    outcome = (r.action, r.content)
                except TimeoutError:
                    outcome = (f"no answer within {ELICIT_TIMEOUT_S:g} s", None)
                except MCPError as exc:
                    outcome = (f"the client answered with an error: {exc.message}", None)
                except Exception as exc:
                    outcome = (f"{type(exc).__name__}: {exc}", None)
                tg.cancel_scope.cancel()
            tg.start_soon(ask)
            await self.cancel_event.wait()                 # the tools/call was cancelled meanwhile
            tg.cancel_scope.cancel()
        return outcome

    # -------------------------------------------- on the event loop
    def cancel(self) -> None:
        """The client cancelled: interrupt the tool (now, or as soon as it reached its worker)."""
        self.cancelled.set()
        self.cancel_event.set()
        if not self._interrupt():
            threading.Thread(target=self._keep_interrupting, name="lcp-mcp-cancel",
                             daemon=True).start()

    def _interrupt(self) -> bool:
        with self.lock:
            if self.done.is_set():
                return True
            return self.thread is not None and self.session.binding.interrupt(self.thread)

    def _keep_interrupting(self) -> None:
        """The call was queued for its worker, or the worker was starting: try again."""
        idle = 0
        while not self.done.wait(0.05) and not self.session.closed:
            if self.thread is None:
                idle += 1
                if idle >= 100:              # its job never started (dropped with its task)
                    return
            elif self._interrupt():
                return


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
    """The MCP server over one Supervisor: a session per MCP session (HTTP) or one (stdio)."""

    def __init__(self, options: ServeOptions, supervisor: Supervisor) -> None:
        self.options = options
        self.supervisor = supervisor
        self.stdio_session: Optional[_Session] = None
        self._create_lock: Optional[anyio.Lock] = None
        self._limiter: Optional[anyio.CapacityLimiter] = None
        self.server = _Server("lcp-sandbox", version=__version__,
                              instructions="Tools of LCP libraries, each library run in an "
                                           "isolated worker process of this session.",
                              on_list_tools=self._list_tools, on_call_tool=self._call_tool)

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
                                   supervisor=self.supervisor, confine=o.confine)
        binding.set_confirm_handler(self._confirm)
        binding.set_user_interaction_handler(self._ask)
        log.info("session %s: workspace %s", tenant, workspace)
        return _Session(binding, list(o.folders), workspace)

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
                    workspace = os.path.join(self.options.workspace_root, sid)
                    session = await anyio.to_thread.run_sync(self.make_session, workspace,
                                                             f"mcp-{sid}", workspace)
                    conn.state[_STATE_KEY] = session
                    conn.exit_stack.push_async_callback(self.end_session, session)
        return session

    async def end_session(self, session: _Session) -> None:
        """Stop the session's workers (its running calls were cancelled, so interrupted)."""
        log.info("session %s ended", session.binding.tenant)
        await anyio.to_thread.run_sync(session.close, abandon_on_cancel=True)

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
        tools = [types.Tool.model_validate(M.tool_entry(s)) for s in specs]
        return types.ListToolsResult(tools=tools)

    async def _call_tool(self, ctx: Any,
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        session = await self._session(ctx)
        await self._refresh(session, ctx)
        arguments = params.arguments or {}
        problem = session.check(params.name, arguments)
        if problem is not None:
            return types.CallToolResult(content=[types.TextContent(type="text", text=problem)],
                                        is_error=True)
        call = _Call(session, ctx)
        self._limiter = self._limiter or anyio.CapacityLimiter(CALL_THREADS)
        try:
            result = await anyio.to_thread.run_sync(call.run, params.name, arguments,
                                                    abandon_on_cancel=True, limiter=self._limiter)
        except anyio.get_cancelled_exc_class():
            call.cancel()
            raise
        content, structured, is_error = M.call_result(result)
        return types.CallToolResult.model_validate(
            {"content": content, "structuredContent": structured, "isError": is_error})

    # -------------------------------------------- the binding's handlers (on a call's thread)
    def _confirm(self, *args: Any, **kwargs: Any) -> tuple[str, str]:
        source, label, argv = M.confirm_request(args, kwargs)
        call = getattr(_current, "call", None)
        if call is None:
            return "reject", "No MCP tool call is running to ask the user through."
        if not call.can_elicit:
            if self.options.auto_confirm == "allow":
                return "allow", AUTO_ALLOWED
            return "reject", NO_ELICITATION
        action, content = call.elicit(*M.confirm_form(source, label, argv))
        return M.confirm_decision(action, content)

    def _ask(self, *args: Any, **kwargs: Any) -> Optional[str]:
        call = getattr(_current, "call", None)
        form = M.ask_form(M.ask_request(args, kwargs))
        if call is None or not call.can_elicit or form is None:
            return None
        return M.ask_answer(*call.elicit(*form))
