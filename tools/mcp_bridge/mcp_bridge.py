"""
mcp_bridge.py — call tools hosted on MCP (Model Context Protocol) servers.

Tools: ``tool_list_mcp_tools`` (the tools of one or all configured servers,
with their JSON schemas) and ``tool_call_mcp_tool`` (call one of them).
``tool_mcp_bridge_prompt`` is the library's dynamic context (not a tool): the
configured servers and the tools already known.

The servers are host configuration, never chosen by the LLM::

    host_tool_configs = {"mcp_bridge": {"servers": [
        {"alias": "files", "type": "stdio", "command": "npx",
         "args": ["-y", "@modelcontextprotocol/server-filesystem", "/data"],
         "env": {"LOG_LEVEL": "warn"}},
        {"alias": "search", "type": "http", "url": "http://localhost:8000/mcp",
         "headers": {"Authorization": "Bearer ..."}},
    ]}}

Server keys: ``alias`` (required, unique), ``type`` (``"stdio"``, the default
when ``command`` is given, or ``"http"``, streamable HTTP, the default when
``url`` is given).  stdio: ``command``, ``args`` (a list, or a string split
like a shell would), ``env`` (merged over the SDK's minimal environment:
HOME, LOGNAME, PATH, SHELL, TERM, USER), ``inherit_env`` (true: merge ``env``
over this process's whole environment instead), ``cwd`` (default: the
workspace of the call that started the server).  http: ``url``, ``headers``.
Timeouts, at the top level or per server: ``connect_timeout_s`` (start and
MCP handshake, default 20) and ``call_timeout_s`` (one request, default 30).
``connect_on_init`` (top level, default true) starts every server in the
background as soon as the library is loaded.

How it works: ``init_tools_library`` builds one MCP client for the library,
an asyncio event loop on a daemon thread that keeps one ``ClientSession``
(official ``mcp`` SDK, 2.x; 1.x works too) open per server.  The tools are
plain synchronous functions that submit a coroutine to that loop and wait
for it with a deadline, so a dead or silent server can never hang a call.
A stdio server is a child process of the process running this library (with
lcp_sandbox: the library's worker, so it is killed with the worker's tree).
A server whose connection is lost is restarted on its next use; a tool call
is never retried by the bridge (it may not be idempotent).  The ``mcp``
package is imported lazily in ``init_tools_library``: without it the library
still loads and every tool says how to install it.
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import os
import shlex
import subprocess
import sys
import threading
from typing import Any, Dict, List, Optional

TOOL_LIBRARY_NAME = "MCP Bridge"
TOOL_LIBRARY_DESC = "Lists and calls tools hosted on the MCP servers configured by the host (stdio or HTTP)."
TOOL_LIBRARY_ICON = "🔗"

DEFAULT_CONNECT_TIMEOUT_S = 20.0
DEFAULT_CALL_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 3.0             # stopping every server when the library is unloaded
_GUARD_S = 5.0                    # extra wait on the loop beyond the MCP-level deadlines
_MAX_LIST_PAGES = 50
_SEPARATOR = "::"                 # alias::tool, lollms' MCPBinding naming

_bridge: Optional["_Bridge"] = None
_setup_error: Optional[str] = None
_config_key: Optional[str] = None


class BridgeError(Exception):
    """A failure explained in words the LLM can act on."""


# ------------------------------------------------------------------ host configuration
def init_tools_library(config: Optional[dict] = None) -> None:
    """Builds the MCP client from host_tool_configs['mcp_bridge'] (servers and timeouts)."""
    global _bridge, _setup_error, _config_key
    config = config if isinstance(config, dict) else {}
    settings = {k: config.get(k) for k in ("servers", "connect_timeout_s", "call_timeout_s",
                                           "connect_on_init")}
    try:
        key = json.dumps(settings, sort_keys=True, default=repr)
    except Exception:
        key = repr(settings)
    if key == _config_key and (_bridge is not None or _setup_error is not None):
        return                      # same configuration: keep the running servers
    _shutdown()
    _config_key = key
    _setup_error = None

    servers = config.get("servers")
    if not servers:
        _setup_error = ("The MCP bridge has no servers configured: the host must set "
                        "host_tool_configs['mcp_bridge']['servers'] to a list of servers.")
        return
    if not isinstance(servers, (list, tuple)):
        _setup_error = ("The MCP bridge configuration is invalid: host_tool_configs['mcp_bridge']"
                        f"['servers'] must be a list, not {type(servers).__name__}.")
        return
    try:
        sdk = _import_sdk()
    except ImportError as exc:
        _setup_error = ("The MCP bridge needs the official 'mcp' Python package, which is not "
                        f"installed here ({exc}). Install it (pip install 'mcp>=2', or the "
                        "lcp_sandbox 'mcp' extra) and restart the tool worker.")
        return
    defaults = {"connect_timeout_s": _seconds(config.get("connect_timeout_s"), DEFAULT_CONNECT_TIMEOUT_S),
                "call_timeout_s": _seconds(config.get("call_timeout_s"), DEFAULT_CALL_TIMEOUT_S)}
    specs = _parse_servers(servers, defaults)
    _bridge = _Bridge(specs, sdk)
    if _to_bool(config.get("connect_on_init"), True):
        _bridge.start_all()


def tool_mcp_bridge_prompt() -> str:
    """Dynamic library context: the configured MCP servers and their known tools (not a tool)."""
    if _bridge is None:
        return f"MCP bridge unavailable: {_setup_error or 'not configured.'}"
    lines = ["MCP servers reachable with tool_call_mcp_tool (list their tools with tool_list_mcp_tools):"]
    for srv in _bridge.servers.values():
        if srv.spec.error:
            lines.append(f"- {srv.spec.alias}: misconfigured ({srv.spec.error})")
        elif srv.tools is not None:
            names = ", ".join(t.name for t in srv.tools) or "no tools"
            lines.append(f"- {srv.spec.alias}: {names}")
        elif srv.last_error:
            lines.append(f"- {srv.spec.alias}: not available ({srv.last_error})")
        else:
            lines.append(f"- {srv.spec.alias}: starting")
    return "\n".join(lines)


# ------------------------------------------------------------------ tools
def tool_list_mcp_tools(server_alias: str = "") -> Dict[str, Any]:
    """
    Lists the tools offered by the configured MCP servers, with their parameters.

    Call this before tool_call_mcp_tool to learn the exact tool names and the
    arguments each tool expects (a JSON schema).

    Args:
        server_alias (str): The alias of one server; empty to list every configured server.
    """
    try:
        bridge = _require_bridge()
        alias = str(server_alias or "").strip()
        if alias:
            srv = bridge.server(alias)
            entries = [bridge.run(bridge.describe(srv), srv.spec.connect_timeout_s
                                  + srv.spec.call_timeout_s + _GUARD_S)]
            if "error" in entries[0]:
                return _fail(entries[0]["error"])
        else:
            timeout = max((s.spec.connect_timeout_s + s.spec.call_timeout_s
                           for s in bridge.servers.values()), default=0) + _GUARD_S
            entries = bridge.run(bridge.describe_all(), timeout)
            if entries and all("error" in e for e in entries):
                details = "; ".join(f"{e['server_alias']}: {e['error']}" for e in entries)
                return _fail(f"No configured MCP server is available. {details}")
    except BridgeError as exc:
        return _fail(str(exc))
    return {"success": True, "output": {
        "servers": entries,
        "usage": "tool_call_mcp_tool(server_alias, mcp_tool_name, arguments) with arguments "
                 "a JSON object string matching the tool's parameters.",
    }}


def tool_call_mcp_tool(server_alias: str, mcp_tool_name: str, arguments: str = "{}") -> Dict[str, Any]:
    """
    Calls a tool hosted on a configured MCP server and returns its result.

    Args:
        server_alias (str): The alias of the configured MCP server (e.g. 'filesystem').
        mcp_tool_name (str): The name of the tool on that server (e.g. 'read_file'), as listed by tool_list_mcp_tools.
        arguments (str): A JSON object string with the tool's arguments, e.g. '{"path": "notes.txt"}'.
    """
    alias = str(server_alias or "").strip()
    name = str(mcp_tool_name or "").strip()
    if _SEPARATOR in name:                      # 'alias::tool' accepted as the tool name
        prefix, _, rest = name.partition(_SEPARATOR)
        if not alias or alias == prefix:
            alias, name = prefix, rest
    if not name:
        return _fail("'mcp_tool_name' is empty: give the name of a tool listed by tool_list_mcp_tools.")
    try:
        payload = _parse_arguments(arguments)
    except BridgeError as exc:
        return _fail(str(exc))
    try:
        bridge = _require_bridge()
        if not alias:
            if len(bridge.servers) != 1:
                raise BridgeError("'server_alias' is empty. Configured MCP servers: "
                                  f"{', '.join(bridge.servers)}.")
            alias = next(iter(bridge.servers))
        srv = bridge.server(alias)
        result = bridge.run(bridge.call(srv, name, payload),
                            srv.spec.connect_timeout_s + 2 * srv.spec.call_timeout_s + _GUARD_S)
    except BridgeError as exc:
        return _fail(str(exc))
    return _to_lcp(alias, name, result)


# ------------------------------------------------------------------ helpers
def _fail(message: str) -> Dict[str, Any]:
    """The failure shape; ``output`` repeats the error so the LLM never sees a success text."""
    return {"success": False, "error": message, "output": message}


def _require_bridge() -> "_Bridge":
    if _bridge is None:
        raise BridgeError(_setup_error or (
            "The MCP bridge is not configured: the host must set "
            "host_tool_configs['mcp_bridge']['servers']."))
    return _bridge


def _parse_arguments(arguments: Any) -> dict:
    if arguments is None:
        return {}
    if isinstance(arguments, dict):
        return dict(arguments)
    if not isinstance(arguments, str):
        raise BridgeError(f"'arguments' must be a JSON object string, not {type(arguments).__name__}.")
    if not arguments.strip():
        return {}
    try:
        payload = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise BridgeError(f"Invalid JSON in 'arguments': {exc}. Give a JSON object such as "
                          '\'{"name": "value"}\'.') from None
    if payload is None:
        return {}
    if not isinstance(payload, dict):
        raise BridgeError(f"'arguments' must decode to a JSON object, not {type(payload).__name__}.")
    return payload


def _seconds(value: Any, default: float) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return default
    return value if value > 0 else default


def _to_bool(value: Any, default: bool) -> bool:
    if isinstance(value, bool):
        return value
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "y", "on"):
        return True
    if text in ("false", "0", "no", "n", "off"):
        return False
    return default


def _root_cause(exc: BaseException) -> BaseException:
    """The most telling leaf of an exception group (anyio task groups wrap errors).

    A cancellation is only the echo of a sibling task's failure, so another leaf wins.
    """
    leaves: List[BaseException] = []

    def walk(e: BaseException) -> None:
        subs = getattr(e, "exceptions", None)
        if subs:
            for sub in subs:
                walk(sub)
        else:
            leaves.append(e)
    walk(exc)
    for leaf in leaves:
        if not isinstance(leaf, asyncio.CancelledError):
            return leaf
    return leaves[0] if leaves else exc


def _closed(session: Any) -> bool:
    """Best effort: whether the SDK already saw this session's connection close.

    Reads a private attribute of the 2.x SDK's JSON-RPC dispatcher; when it is not
    there (another SDK version), a closed connection is found by the next request.
    """
    return getattr(getattr(session, "_dispatcher", None), "_closed", False) is True


def _errlog() -> Any:
    """Where a stdio server's stderr goes: this process's stderr (the host log under lcp_sandbox)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            stream.fileno()
            return stream
        except Exception:
            continue
    return subprocess.DEVNULL


def _import_sdk() -> Any:
    """The parts of the ``mcp`` SDK the bridge uses (ImportError when it is missing)."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    try:
        from mcp.shared.exceptions import MCPError          # 2.x
    except ImportError:                                      # 1.x
        from mcp.shared.exceptions import McpError as MCPError
    try:
        from mcp.client.streamable_http import streamable_http_client as http_client
    except ImportError:
        try:
            from mcp.client.streamable_http import streamablehttp_client as http_client
        except ImportError:
            http_client = None
    try:
        from mcp.types import PaginatedRequestParams
    except ImportError:
        PaginatedRequestParams = None

    class SDK:
        pass
    sdk = SDK()
    sdk.anyio, sdk.ClientSession, sdk.StdioServerParameters = anyio, ClientSession, StdioServerParameters
    sdk.stdio_client, sdk.http_client, sdk.MCPError = stdio_client, http_client, MCPError
    sdk.PaginatedRequestParams = PaginatedRequestParams
    sdk.closed_errors = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream,
                         BrokenPipeError, ConnectionError)
    return sdk


class _Spec:
    """One configured server, validated; ``error`` says why it cannot be used."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.kind = "stdio"
        self.command = ""
        self.args: List[str] = []
        self.env: Dict[str, str] = {}
        self.inherit_env = False
        self.cwd: Optional[str] = None
        self.url = ""
        self.headers: Dict[str, str] = {}
        self.connect_timeout_s = DEFAULT_CONNECT_TIMEOUT_S
        self.call_timeout_s = DEFAULT_CALL_TIMEOUT_S
        self.error: Optional[str] = None

    def describe(self) -> str:
        if self.kind == "http":
            return f"http {self.url}"
        return "stdio: " + " ".join(shlex.quote(p) for p in [self.command, *self.args])


def _parse_servers(servers: Any, defaults: dict) -> List[_Spec]:
    specs: List[_Spec] = []
    seen = set()
    for i, entry in enumerate(servers):
        if not isinstance(entry, dict):
            spec = _Spec(f"#{i + 1}")
            spec.error = f"server entry #{i + 1} is a {type(entry).__name__}, not a dict"
            specs.append(spec)
            continue
        alias = str(entry.get("alias") or entry.get("name") or "").strip()
        spec = _Spec(alias or f"#{i + 1}")
        specs.append(spec)
        spec.connect_timeout_s = _seconds(entry.get("connect_timeout_s"), defaults["connect_timeout_s"])
        spec.call_timeout_s = _seconds(entry.get("call_timeout_s", entry.get("timeout_s")),
                                       defaults["call_timeout_s"])
        if not alias:
            spec.error = f"server entry #{i + 1} has no 'alias'"
            continue
        if alias in seen:
            spec.alias = f"{alias}#{i + 1}"
            spec.error = f"the alias '{alias}' is used by an earlier server entry"
            continue
        seen.add(alias)
        kind = str(entry.get("type") or ("http" if entry.get("url") and not entry.get("command")
                                         else "stdio")).strip().lower()
        if kind in ("http", "streamable-http", "streamable_http", "streamablehttp"):
            spec.kind = "http"
            spec.url = str(entry.get("url") or "").strip()
            if not spec.url:
                spec.error = "an 'http' server needs a 'url'"
            headers = entry.get("headers") or {}
            if isinstance(headers, dict):
                spec.headers = {str(k): str(v) for k, v in headers.items()}
            else:
                spec.error = "'headers' must be a dict"
        elif kind == "stdio":
            spec.command = str(entry.get("command") or "").strip()
            args = entry.get("args") or []
            if isinstance(args, str):
                args = shlex.split(args)
            if not isinstance(args, (list, tuple)):
                spec.error = "'args' must be a list of strings"
            spec.args = [str(a) for a in args] if isinstance(args, (list, tuple)) else []
            env = entry.get("env") or {}
            if isinstance(env, dict):
                spec.env = {str(k): str(v) for k, v in env.items()}
            else:
                spec.error = "'env' must be a dict"
            spec.inherit_env = _to_bool(entry.get("inherit_env"), False)
            spec.cwd = str(entry["cwd"]) if entry.get("cwd") else None
            if not spec.command:
                spec.error = "a 'stdio' server needs a 'command'"
        else:
            spec.error = f"unknown server type '{kind}' (use 'stdio' or 'http')"
    return specs


def _tool_entry(tool: Any) -> dict:
    entry = {"name": tool.name, "description": (tool.description or "").strip()}
    schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None)
    if isinstance(schema, dict):
        entry["parameters"] = {k: v for k, v in schema.items() if k != "title"}
    return entry


def _to_lcp(alias: str, name: str, result: Any) -> Dict[str, Any]:
    """An MCP CallToolResult in the LCP shape: text as output, images passed through."""
    texts: List[str] = []
    images: List[str] = []
    media: List[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            texts.append(block.text)
        elif kind == "image":
            images.append(block.data)
            media.append(getattr(block, "mime_type", None) or getattr(block, "mimeType", "image/png"))
        elif kind == "resource":
            res = block.resource
            text = getattr(res, "text", None)
            texts.append(text if text is not None else f"[binary resource {res.uri}]")
        elif kind == "resource_link":
            texts.append(f"[resource link: {block.uri}]")
        else:
            texts.append(f"[{kind} content not shown]")
    text = "\n".join(texts)
    if getattr(result, "is_error", getattr(result, "isError", False)):
        return _fail(f"MCP tool '{alias}{_SEPARATOR}{name}' reported an error: {text or 'no details given.'}")
    structured = getattr(result, "structured_content", getattr(result, "structuredContent", None))
    if not text and structured is not None:
        text = json.dumps(structured, ensure_ascii=False, default=str)
    if not text:
        text = (f"(the MCP tool returned {len(images)} image(s), attached)" if images
                else "(the MCP tool returned no content)")
    out: Dict[str, Any] = {"success": True, "output": text}
    if images:
        out["images"] = images
        out["image_media_types"] = media
    return out


# ------------------------------------------------------------------ the MCP client
class _Server:
    """Connection state of one server; touched only on the bridge's loop (reads excepted)."""

    def __init__(self, spec: _Spec) -> None:
        self.spec = spec
        self.session: Any = None
        self.tools: Optional[list] = None      # the last listing
        self.owner: Optional[asyncio.Task] = None
        self.ready: Optional[asyncio.Future] = None
        self.stop: Optional[asyncio.Event] = None
        self.lock: Optional[asyncio.Lock] = None
        self.last_error: Optional[str] = None
        self.starts = 0


class _Bridge:
    """An asyncio loop on a daemon thread holding one MCP session per configured server."""

    def __init__(self, specs: List[_Spec], sdk: Any) -> None:
        self.sdk = sdk
        self.servers: Dict[str, _Server] = {s.alias: _Server(s) for s in specs}
        self.closed = False
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run_loop, name="mcp-bridge-loop", daemon=True)
        self.thread.start()
        atexit.register(self.close)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                self.loop.close()
            except Exception:
                pass

    # -------------------------------------------------------- sync side
    def server(self, alias: str) -> _Server:
        srv = self.servers.get(alias)
        if srv is None:
            raise BridgeError(f"Unknown MCP server '{alias}'. Configured servers: "
                              f"{', '.join(self.servers) or 'none'}.")
        return srv

    def run(self, coro: Any, timeout: float) -> Any:
        """Run a coroutine on the loop and wait at most ``timeout`` seconds for it."""
        if self.closed:
            coro.close()
            raise BridgeError("The MCP bridge has been shut down.")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise BridgeError(f"The MCP bridge got no answer within {timeout:.0f} s; "
                              "the request was abandoned.") from None
        except concurrent.futures.CancelledError:
            raise BridgeError("The MCP request was cancelled.") from None
        except BaseException:
            fut.cancel()            # e.g. the sandbox's timeout raised in this thread
            raise

    def start_all(self) -> None:
        """Start every usable server in the background (errors are kept for later)."""
        for srv in self.servers.values():
            if not srv.spec.error:
                asyncio.run_coroutine_threadsafe(self._start_quietly(srv), self.loop)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop every server (closing stdin, then the SDK's kill escalation) and the loop."""
        if self.closed:
            return
        self.closed = True
        try:
            atexit.unregister(self.close)
        except Exception:
            pass
        if not self.loop.is_closed() and self.thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._close_all(timeout), self.loop).result(timeout + 1)
            except BaseException:
                pass
            try:
                self.loop.call_soon_threadsafe(self.loop.stop)
            except RuntimeError:
                pass
            self.thread.join(1.0)

    # -------------------------------------------------------- loop side
    async def _start_quietly(self, srv: _Server) -> None:
        try:
            await self._session(srv)
        except BaseException:
            pass

    async def _session(self, srv: _Server) -> Any:
        """The live session of ``srv``, starting the server when needed (one start at a time)."""
        if srv.spec.error:
            raise BridgeError(f"MCP server '{srv.spec.alias}' is misconfigured: {srv.spec.error}.")
        if srv.lock is None:
            srv.lock = asyncio.Lock()
        async with srv.lock:
            if srv.session is not None and _closed(srv.session) and not srv.stop.is_set():
                # The server went away while idle (its transport saw EOF): nothing was sent
                # yet, so starting it again here is transparent to the caller.
                srv.stop.set()
                srv.tools = None
            if srv.owner is not None and not srv.owner.done() and srv.stop.is_set():
                # The previous connection is winding down (it was lost): let it finish first.
                await asyncio.wait([srv.owner], timeout=CLOSE_TIMEOUT_S + 2)
            if srv.owner is None or srv.owner.done() or srv.stop.is_set():
                srv.ready = self.loop.create_future()
                srv.stop = asyncio.Event()
                srv.starts += 1
                srv.owner = self.loop.create_task(self._hold(srv, srv.ready, srv.stop))
            ready = srv.ready
        try:
            return await asyncio.wait_for(asyncio.shield(ready), srv.spec.connect_timeout_s + _GUARD_S)
        except asyncio.TimeoutError:
            raise BridgeError(f"MCP server '{srv.spec.alias}' ({srv.spec.describe()}) did not finish "
                              f"starting within {srv.spec.connect_timeout_s:.0f} s.") from None

    async def _hold(self, srv: _Server, ready: asyncio.Future, stop: asyncio.Event) -> None:
        """Owns one connection: opens it, publishes the session, keeps it until ``stop``."""
        sdk, spec = self.sdk, srv.spec
        phase = "start"

        def publish_failure(exc: BaseException) -> None:
            # Called before the transport is torn down: the SDK's shutdown of a stdio
            # server that ignores its closed stdin takes seconds, nobody should wait for it.
            if ready.done():
                return
            message = self._start_failure(srv, phase, _root_cause(exc))
            srv.last_error = message
            ready.set_exception(BridgeError(message))
            ready.exception()       # retrieved: a failed background start must stay quiet

        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    if spec.kind == "stdio":
                        env = dict(os.environ) if spec.inherit_env else {}
                        env.update(spec.env)
                        params = sdk.StdioServerParameters(command=spec.command, args=spec.args,
                                                           env=env or None, cwd=spec.cwd)
                        read, write = await stack.enter_async_context(
                            sdk.stdio_client(params, errlog=_errlog()))
                    else:
                        if sdk.http_client is None:
                            raise BridgeError("this version of the mcp package has no streamable HTTP client")
                        kwargs = {}
                        if spec.headers:
                            try:
                                import httpx2 as httpx          # what mcp 2.x uses
                            except ImportError:
                                import httpx                    # mcp 1.x
                            kwargs["http_client"] = await stack.enter_async_context(
                                httpx.AsyncClient(headers=spec.headers, timeout=spec.call_timeout_s))
                        streams = await stack.enter_async_context(sdk.http_client(spec.url, **kwargs))
                        read, write = streams[0], streams[1]
                    session = await stack.enter_async_context(sdk.ClientSession(read, write))
                    phase = "handshake"
                    with sdk.anyio.fail_after(spec.connect_timeout_s):
                        await session.initialize()
                        srv.tools = await self._list_tools(session)
                except BaseException as exc:
                    if not isinstance(_root_cause(exc), asyncio.CancelledError):
                        publish_failure(exc)     # else the real error surfaces from the teardown
                    raise
                srv.session = session
                srv.last_error = None
                ready.set_result(session)
                phase = "open"
                await stop.wait()
                phase = "stop"
        except BaseException as exc:
            publish_failure(exc)
            if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
                raise
        finally:
            srv.session = None
            if not ready.done():
                ready.set_exception(BridgeError(f"MCP server '{spec.alias}' stopped."))
                ready.exception()

    def _start_failure(self, srv: _Server, phase: str, exc: BaseException) -> str:
        spec = srv.spec
        where = f"MCP server '{spec.alias}' ({spec.describe()})"
        if isinstance(exc, BridgeError):
            return f"{where}: {exc}"
        if isinstance(exc, TimeoutError):
            return (f"{where} did not complete the MCP handshake within "
                    f"{spec.connect_timeout_s:.0f} s (connect_timeout_s).")
        if isinstance(exc, FileNotFoundError) and phase == "start" and spec.kind == "stdio":
            return f"{where} could not be started: command not found: {spec.command!r}."
        if isinstance(exc, OSError) and phase == "start":
            return f"{where} could not be started: {type(exc).__name__}: {exc}."
        if phase == "handshake" and (isinstance(exc, self.sdk.closed_errors) or
                                     getattr(exc, "code", None) == -32000):
            hint = (" Its stderr is in the host log (logger lcp_sandbox.tool.mcp_bridge)."
                    if spec.kind == "stdio" else "")
            return (f"{where} closed the connection during the MCP handshake: it exited, or it "
                    f"is not an MCP server.{hint}")
        if spec.kind == "http" and phase in ("start", "handshake"):
            return (f"{where} could not be reached or refused the MCP handshake: "
                    f"{type(exc).__name__}: {exc}.")
        if phase == "open":
            return f"{where}: the connection was lost ({type(exc).__name__}: {exc})."
        return f"{where} failed during {phase}: {type(exc).__name__}: {exc}"

    async def _list_tools(self, session: Any) -> list:
        tools, cursor = [], None
        for _ in range(_MAX_LIST_PAGES):
            if cursor and self.sdk.PaginatedRequestParams is not None:
                page = await session.list_tools(params=self.sdk.PaginatedRequestParams(cursor=cursor))
            else:
                page = await session.list_tools()
            tools.extend(page.tools)
            cursor = getattr(page, "next_cursor", getattr(page, "nextCursor", None))
            if not cursor:
                break
        return tools

    def _lost(self, srv: _Server, exc: BaseException) -> BridgeError:
        """The connection broke: release it so the next use starts the server again."""
        if srv.stop is not None:
            srv.stop.set()
        srv.session = None
        srv.tools = None
        srv.last_error = f"the connection was lost ({type(exc).__name__}: {exc})"
        return BridgeError(f"The connection to MCP server '{srv.spec.alias}' was lost "
                           f"({type(exc).__name__}: {exc}). The server will be started again "
                           "on the next use.")

    def _request_error(self, srv: _Server, what: str, exc: BaseException) -> BridgeError:
        exc = _root_cause(exc)
        code = getattr(exc, "code", None)
        if isinstance(exc, self.sdk.closed_errors) or code == -32000:
            return self._lost(srv, exc)
        if code == -32001 or isinstance(exc, TimeoutError):
            return BridgeError(f"MCP server '{srv.spec.alias}' did not answer {what} within "
                               f"{srv.spec.call_timeout_s:g} s (call_timeout_s); the request was "
                               "cancelled. The server is kept running.")
        if isinstance(exc, self.sdk.MCPError):
            return BridgeError(f"MCP server '{srv.spec.alias}' rejected {what}: "
                               f"{getattr(exc, 'message', exc)} (code {code}).")
        return BridgeError(f"MCP request {what} to '{srv.spec.alias}' failed: "
                           f"{type(exc).__name__}: {exc}")

    async def _refresh_tools(self, srv: _Server, session: Any) -> list:
        try:
            with self.sdk.anyio.fail_after(srv.spec.call_timeout_s):
                srv.tools = await self._list_tools(session)
        except Exception as exc:
            raise self._request_error(srv, "tools/list", exc) from None
        return srv.tools

    async def describe(self, srv: _Server) -> dict:
        """One server's entry for tool_list_mcp_tools (an 'error' key when it is unavailable)."""
        entry: Dict[str, Any] = {"server_alias": srv.spec.alias}
        try:
            session = await self._session(srv)
            tools = await self._refresh_tools(srv, session)
        except BridgeError as exc:
            entry["error"] = str(exc)
            return entry
        except Exception as exc:
            entry["error"] = f"listing failed: {type(exc).__name__}: {exc}"
            return entry
        entry["tools"] = [_tool_entry(t) for t in tools]
        return entry

    async def describe_all(self) -> list:
        return list(await asyncio.gather(*(self.describe(s) for s in self.servers.values())))

    async def call(self, srv: _Server, name: str, arguments: dict) -> Any:
        session = await self._session(srv)
        if srv.tools is None or name not in {t.name for t in srv.tools}:
            tools = await self._refresh_tools(srv, session)     # the list may have changed
            if name not in {t.name for t in tools}:
                known = ", ".join(t.name for t in tools) or "none"
                raise BridgeError(f"MCP server '{srv.spec.alias}' has no tool '{name}'. "
                                  f"Its tools: {known}.")
        try:
            return await session.call_tool(name, arguments,
                                           read_timeout_seconds=srv.spec.call_timeout_s)
        except Exception as exc:
            raise self._request_error(srv, f"tools/call '{name}'", exc) from None

    async def _close_all(self, timeout: float) -> None:
        owners = []
        for srv in self.servers.values():
            if srv.stop is not None:
                srv.stop.set()
            if srv.owner is not None and not srv.owner.done():
                owners.append(srv.owner)
        if owners:
            _, pending = await asyncio.wait(owners, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=0.5)


def _shutdown() -> None:
    global _bridge
    bridge, _bridge = _bridge, None
    if bridge is not None:
        bridge.close()
