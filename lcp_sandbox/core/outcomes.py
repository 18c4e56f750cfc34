"""Sandbox outcomes: how a call ends when the sandbox, not the tool, ends it.

Each outcome is an exception that builds its own LCP failure result
(``.result``, the shape of a tool's failure with its own ``status_code``);
the binding returns that result.  Every text names the library and the tool,
says what happened and what was done about it.

Every failure the package defines, where, and what the caller of a call gets of it (the
classes of this module are the public outcomes; the others never leave the engine):

    SandboxEvent                     this module: execute_tool returns its .result
    ├── Unavailable          503     not run: closed, quarantined, no room, could not start
    ├── Refused              403     not run: a confinement root the worker must not own
    ├── CallFailed           500     the host could not send the call, or failed handling it
    ├── WorkerDied           500     the worker died during the call (signal, exit code)
    ├── ProtocolViolated     500     the worker broke the protocol: killed, never believed
    ├── Cancelled            499     the host cancelled the call: interrupted, worker kept
    ├── TimedOut             504     interrupted (worker kept) or killed after the grace
    └── OutOfMemory          507     an uncaught MemoryError, or killed over the limit

    Raised in the host, each turned into one of the above by the supervisor
    (backends/local/supervisor.py) or by the code that catches it:
    WorkerGone                       backends/local/process.py: the worker hung up
    │                                ─► WorkerDied, or OutOfMemory when the watchdog killed it
    └── NeverReceived                it hung up before the call reached it
                                     ─► the call goes once to a fresh worker
    DeadlinePassed                   backends/local/process.py ─► TimedOut (killed)
    NotConfined                      backends/local/supervisor.py: a protection asked for is not
                                     in force ─► Unavailable (not_confined)
    ZygoteGone                       backends/local/zygote_client.py ─► Unavailable (no_start)
    BadMessage                       protocol/messages.py: what a worker sent breaks the
                                     protocol ─► ProtocolViolated
    PayloadError                     protocol/messages.py: the parameters cannot be sent
                                     ─► CallFailed (the worker kept)
    BuildFailed                      backends/envs/build.py ─► CallFailed
    DeclarationError (ValueError)    core/requirements.py: a requirement that is not a name
                                     ─► CallFailed naming it
    ProxyRefusal                     backends/local/confine/egress_conn.py: a connection the
                                     egress proxy does not make ─► an HTTP answer to the tool
    SecretMisuse                     core/secrets.py: a placeholder sent to a host its secret
                                     is not bound to ─► ProxyRefusal (403), counted, logged
    HostGone                         backends/ray/relay.py: the driver gave up ─► the Ray
                                     agent ends the call as the driver said
    InvalidToken                     fronts/mcp_auth.py: a bearer token refused ─► HTTP 401
                                     (the reason logged, never the token)

    Raised in a worker, answered to the host as a tool's failure (500, the worker kept):
    LoadFailed                       worker/loop.py: the library did not import or init
    ToolTimeout (BaseException)      worker/loop.py: the soft timeout ─► TimedOut (kept)
    Unsendable                       protocol/codec.py: a result the protocol cannot carry
    EnvironmentConflict              worker/environment.py: a package the host pinned apart
    NotInEnvironment (ImportError)   worker/packages.py: pipmaster asked for what is not
                                     declared

    Raised to a person at a command line (exit status 2), never by a call:
    UsageError                       fronts/cli.py
    ConfigError (ValueError)         fronts/mcp_config.py: serve-mcp's --config
    AuthSetupError (ValueError)      fronts/mcp_auth.py: serve-mcp's --auth-* flags, or an
                                     issuer's metadata that cannot be used
    PolicyError (ValueError)         fronts/mcp_users.py: serve-mcp's --auth-policy file
    DuplicateKey (ValueError)        core/strict_json.py: a JSON key given twice ─► ConfigError,
                                     UsageError, or (serve-mcp's HTTP) a JSON-RPC parse error
    Missing                          fronts/settings_table.py: a setting with no description
"""
from __future__ import annotations

from typing import Any, Optional

from .normalize import (
    CANCELLED,
    FORBIDDEN,
    OUT_OF_MEMORY,
    TIMED_OUT,
    TOOL_FAILED,
    UNAVAILABLE,
    failure,
)

_LOST = "will be replaced on the next call (module state was lost)."


class SandboxEvent(Exception):
    """A call ended by the sandbox, not by the tool; ``result`` is what to return."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("error"))
        self.result = result


class _Said(SandboxEvent):
    """An outcome told in one text, with its class's status code; ``reason`` names a
    refusal for the metrics (busy, pool_full, quarantine, closed, no_start)."""
    status_code = TOOL_FAILED

    def __init__(self, text: str, reason: str = "") -> None:
        super().__init__(failure(text, self.status_code))
        self.reason = reason

    @classmethod
    def not_run(cls, library: str, tool: str, why: str, reason: str = "") -> "_Said":
        return cls(f"[{library}] tool '{tool}' not run: {why}", reason)


class Unavailable(_Said):
    status_code = UNAVAILABLE


class Refused(_Said):
    status_code = FORBIDDEN


class CallFailed(_Said):
    status_code = TOOL_FAILED


class WorkerDied(SandboxEvent):
    def __init__(self, library: str, tool: str, how: str) -> None:
        super().__init__(failure(
            f"[{library}] the worker running tool '{tool}' {how}. The host is unaffected; a "
            f"fresh worker will be started on the next call (module state was lost).",
            TOOL_FAILED))


class ProtocolViolated(SandboxEvent):
    def __init__(self, library: str, tool: str, what: str) -> None:
        super().__init__(failure(
            f"[{library}] protocol violation by the worker running tool '{tool}': {what}. "
            f"Its process tree was killed and a fresh worker will be started on the next call "
            f"(module state was lost).", TOOL_FAILED))


class TimedOut(SandboxEvent):
    def __init__(self, library: str, tool: str, seconds: float, killed: bool) -> None:
        if killed:
            text = (f"[{library}] tool '{tool}' timed out after {seconds:g} s and did not stop "
                    f"when interrupted; its worker was killed and {_LOST}")
        else:
            text = (f"[{library}] tool '{tool}' timed out after {seconds:g} s; it was interrupted "
                    f"and its worker (with its module state) was kept.")
        super().__init__(failure(text, TIMED_OUT))


class Cancelled(SandboxEvent):
    def __init__(self, library: str, tool: str) -> None:
        super().__init__(failure(f"[{library}] tool '{tool}' was cancelled by the host; it was "
                                 f"interrupted and its worker (with its module state) was kept.",
                                 CANCELLED))


class OutOfMemory(SandboxEvent):
    def __init__(self, text: str) -> None:
        super().__init__(failure(text, OUT_OF_MEMORY))

    @classmethod
    def killed(cls, library: str, tool: str, why: str) -> "OutOfMemory":
        """The watchdog killed the worker's tree over its limit."""
        return cls(f"[{library}] tool '{tool}': {why}; the worker's process tree was killed "
                   f"and {_LOST}")

    @classmethod
    def uncaught(cls, library: str, tool: str, detail: str,
                 limit: Optional[float]) -> "OutOfMemory":
        """An allocation failed in the tool, which did not catch the MemoryError."""
        return cls(f"[{library}] tool '{tool}' ran out of memory: an allocation failed"
                   + (f" ({detail})" if detail else "")
                   + (f" against the {limit:g} MB limit" if limit else "")
                   + "; the tool did not catch the MemoryError and the worker was kept.")
