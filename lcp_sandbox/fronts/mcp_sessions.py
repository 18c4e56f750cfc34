"""One MCP session's state in the MCP server (mcp_server.py): its binding, what it saw
of the library files on disk, its checks of a tool call's arguments, its rate and calls.

A signed-in user's MCP sessions share one Session (mcp_users.py): its tenant, workers, rate
and concurrent calls are the user's.
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Optional

import anyio

from . import mcp_mapping as M
from .mcp_limits import TokenBucket

if TYPE_CHECKING:
    from .lollms import SandboxedBinding

# A session's rate limit lets this many seconds' calls burst.
RATE_BURST_S = 2.0


def snapshot(folders: list) -> dict:
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


class Session:
    """One MCP session: its binding (tenant, workers, workspace) and what it saw on disk."""

    def __init__(self, binding: SandboxedBinding, folders: list, workspace: str,
                 options: Any, own_workspace: bool = False) -> None:
        self.binding = binding
        self.folders = folders
        self.workspace = workspace
        # HTTP: a folder of the session's own, removed when it ends (stdio: the user's)
        self.own_workspace = own_workspace
        self.files = snapshot(folders)
        # Made on the event loop.
        self.refresh_lock: Optional[anyio.Lock] = None
        # Likewise
        self.calls: Optional[anyio.Semaphore] = None
        self.max_calls = max(1, options.max_calls_per_session)
        rate = options.rate_limit
        self.bucket = TokenBucket(rate, max(1.0, rate * RATE_BURST_S)) if rate else None
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

    def throttled(self) -> Optional[float]:
        """Take a token for one tools/call: None, or the seconds until one is there."""
        return None if self.bucket is None else self.bucket.take(time.monotonic())

    def close(self) -> None:
        self.closed = True
        self.binding.close()
