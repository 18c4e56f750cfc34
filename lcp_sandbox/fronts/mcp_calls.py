"""One MCP tools/call: the thread it runs on, its cancellation, its way back to the loop.

    event loop: McpFront._call_tool ─► ToolCall(session, ctx) ─► thread: ToolCall.run
        run: execute_tool(name, args, tool_context=ToolContext) in the session's binding
        on that thread, the binding's confirm / user-interaction handlers find the call
        (current_call()) and hop to the event loop (anyio.from_thread.run) to elicit a
        form or send notifications/progress, under the call's cancellation
    cancelled (event loop) ─► cancel(): a thread: binding.interrupt(thread), retried until
        the call reached its worker
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Optional, Protocol

import anyio
import anyio.lowlevel
from mcp.shared.exceptions import MCPError

from ..binding.binding import SandboxedBinding

log = logging.getLogger("lcp_sandbox.mcp")

# A question nobody answers is a rejection after this long.
ELICIT_TIMEOUT_S = 600.0
# .call: the ToolCall whose execute_tool runs on this thread.
_current = threading.local()


class CallSession(Protocol):
    """What a call needs of its MCP session."""
    binding: SandboxedBinding
    workspace: str
    closed: bool


def current_call() -> Optional["ToolCall"]:
    """The call whose execute_tool runs on this thread (None outside a call)."""
    return getattr(_current, "call", None)


class ToolContext:
    """The ``tool_context`` a tool gets from the MCP server (lent to the worker as a
    proxy): ``emit_progress(text, meta=None)`` becomes ``notifications/progress``
    when the client asked for progress; it returns False once the call is cancelled."""

    def __init__(self, call: "ToolCall", workspace: str) -> None:
        self._call = call
        self.workspace_path = self.workspace_root = workspace
        self.client = self.discussion = self.personality = self.callback = None

    def emit_progress(self, text: Any, meta: Optional[dict] = None) -> bool:
        return self._call.progress(text, meta)

    def emit_tool_event(self, *args: Any, **kwargs: Any) -> bool:
        return True


class ToolCall:
    """One tools/call: the thread it runs on, its cancellation, its way back to the loop."""

    def __init__(self, session: CallSession, ctx: Any) -> None:
        self.session, self.ctx = session, ctx
        self.token = anyio.lowlevel.current_token()
        # For the loop side.
        self.cancel_event = anyio.Event()
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
        # The request or the loop is gone.
        except Exception as exc:
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
            # The tools/call was cancelled meanwhile.
            await self.cancel_event.wait()
            tg.cancel_scope.cancel()
        return outcome

    # -------------------------------------------- on the event loop
    def cancel(self) -> None:
        """The client cancelled: interrupt the tool (now, or as soon as it reached its worker),
        from a thread of its own: over Ray an interrupt is a round trip to the call's node,
        which the event loop does not wait for."""
        self.cancelled.set()
        self.cancel_event.set()
        threading.Thread(target=self._keep_interrupting, name="lcp-mcp-cancel",
                         daemon=True).start()

    def _interrupt(self) -> bool:
        with self.lock:
            if self.done.is_set():
                return True
            return self.thread is not None and self.session.binding.interrupt(self.thread)

    def _keep_interrupting(self) -> None:
        """At once, then every 50 ms while the call was queued for its worker, or the worker
        was starting."""
        idle = 0
        while not self.session.closed:
            if self.thread is None:
                idle += 1
                # Its job never started (dropped with its task)
                if idle >= 100:
                    return
            elif self._interrupt():
                return
            if self.done.wait(0.05):
                return
