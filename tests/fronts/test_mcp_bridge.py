"""The mcp_bridge library (tools/mcp_bridge) run through the real engine.

The bridge runs inside its worker and starts the MCP servers of its host config
itself: ``tests/fixtures/mcp_servers/echo_server.py`` (written with the official SDK's
``MCPServer``) as a stdio child of the worker, plus servers that cannot work
(a missing command, a process that exits, one that never answers, an entry
without a command).  One binding (one worker, one echo server) serves most
tests; the process-tree test and the HTTP test use bindings of their own.
Needs the ``mcp`` extra (the guard below only skips on machines without it).
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import FIXTURES, REPO, stop_server, wait_gone

pytest.importorskip("mcp")

from lcp_sandbox import SandboxedBinding  # noqa: E402

TOOLS = REPO / "tools"
ECHO = FIXTURES / "mcp_servers" / "echo_server.py"
CALL_TIMEOUT_S = 1.5

ECHO_SERVER = {"alias": "echo", "type": "stdio", "command": sys.executable, "args": [str(ECHO)],
               "env": {"BRIDGE_TEST_VAR": "from-host-config"}, "call_timeout_s": CALL_TIMEOUT_S}
BROKEN_SERVERS = [
    {"alias": "missing", "type": "stdio", "command": "/nonexistent/mcp-server"},
    {"alias": "exits", "type": "stdio", "command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"]},
    {"alias": "silent", "type": "stdio", "command": sys.executable,
     "args": ["-c", "import time; time.sleep(60)"], "connect_timeout_s": 1},
    {"alias": "nocmd", "type": "stdio"},
]


# ---------------------------------------------------------------- fixtures and helpers
@pytest.fixture(scope="module")
def binding(supervisor, tmp_path_factory):
    b = SandboxedBinding(tools_folders=[str(TOOLS)],
                         host_tool_configs={"mcp_bridge": {"servers": [ECHO_SERVER, *BROKEN_SERVERS]}},
                         workspace=str(tmp_path_factory.mktemp("mcp_ws")),
                         supervisor=supervisor, tenant="mcp-main", timeout_s=30)
    yield b
    b.close()


def call(b, server_alias, mcp_tool_name, arguments="{}", **kw):
    return b.execute_tool("tool_call_mcp_tool", {"server_alias": server_alias, "mcp_tool_name": mcp_tool_name,
                                                 "arguments": arguments}, **kw)


def server_info(b, alias="echo"):
    r = call(b, alias, "info", json.dumps({"env_var": "BRIDGE_TEST_VAR"}))
    assert r["success"], r
    return json.loads(r["output"])


def worker_pid(b):
    pids = [s["pid"] for s in b.stats() if s["library"] == "mcp_bridge" and s["pid"]]
    assert len(pids) == 1, b.stats()
    return pids[0]


# ---------------------------------------------------------------- listing
def test_discovered_tools(binding):
    specs = {s["name"]: s for s in binding.discover_tools()}
    assert {"tool_list_mcp_tools", "tool_call_mcp_tool"} <= set(specs)
    assert "tool_mcp_bridge_prompt" not in specs            # the library context, not a tool
    schema = specs["tool_call_mcp_tool"]["input_schema"]
    assert list(schema["properties"]) == ["server_alias", "mcp_tool_name", "arguments"]
    assert schema["required"] == ["server_alias", "mcp_tool_name"]
    assert "JSON object" in schema["properties"]["arguments"]["description"]


def test_lists_the_tools_of_one_server(binding):
    r = binding.execute_tool("tool_list_mcp_tools", {"server_alias": "echo"})
    assert r["success"] and r["status_code"] == 200, r
    [entry] = r["output"]["servers"]
    tools = {t["name"]: t for t in entry["tools"]}
    assert entry["server_alias"] == "echo"
    assert set(tools) == {"add", "echo", "fail", "info", "sleep", "pixel"}
    assert tools["add"]["description"] == "Adds two integers."
    assert tools["add"]["parameters"]["required"] == ["a", "b"]
    assert tools["add"]["parameters"]["properties"]["a"]["type"] == "integer"


def test_lists_every_server_with_the_reason_of_each_failure(binding):
    r = binding.execute_tool("tool_list_mcp_tools", {})
    assert r["success"], r
    entries = {e["server_alias"]: e for e in r["output"]["servers"]}
    assert list(entries) == ["echo", "missing", "exits", "silent", "nocmd"]
    assert "add" in [t["name"] for t in entries["echo"]["tools"]]
    assert "command not found" in entries["missing"]["error"]
    assert "closed the connection during the MCP handshake" in entries["exits"]["error"]
    assert "did not complete the MCP handshake within 1 s" in entries["silent"]["error"]
    assert "needs a 'command'" in entries["nocmd"]["error"]


def test_listing_one_unavailable_server_fails(binding):
    r = binding.execute_tool("tool_list_mcp_tools", {"server_alias": "missing"})
    assert not r["success"] and r["status_code"] == 500
    assert "MCP server 'missing'" in r["error"] and "command not found" in r["error"]
    r = binding.execute_tool("tool_list_mcp_tools", {"server_alias": "nope"})
    assert not r["success"] and "Unknown MCP server 'nope'" in r["error"]


# ---------------------------------------------------------------- calls
def test_calls_tools(binding):
    r = call(binding, "echo", "add", '{"a": 2, "b": 40}')
    assert r == {"output": "42", "status_code": 200, "success": True}
    text = 'héllo "quoted"\nsecond line ✓'
    assert call(binding, "echo", "echo", json.dumps({"text": text}))["output"] == text
    # 'alias::tool' as the tool name, arguments given as an object by a host
    assert call(binding, "", "echo::add", {"a": 1, "b": 1})["output"] == "2"


def test_server_gets_its_env_and_the_workspace_as_cwd(binding):
    info = server_info(binding)
    assert info["env"] == "from-host-config"
    assert Path(info["cwd"]) == Path(binding.workspace).resolve()


def test_image_results_are_passed_through(binding):
    r = call(binding, "echo", "pixel")
    assert r["success"], r
    assert r["image_media_types"] == ["image/png"]
    assert r["images"][0].startswith("iVBORw0KGgo")         # base64 of a PNG
    assert "1 image" in r["output"]


@pytest.mark.parametrize("alias, tool, arguments, expected", [
    ("echo", "fail", '{"message": "disk on fire"}', "MCP tool 'echo::fail' reported an error: "),
    ("echo", "add", '{"a": "x", "b": 1}', "reported an error"),              # argument validation
    ("echo", "nope", "{}", "MCP server 'echo' has no tool 'nope'. Its tools: add, echo, fail"),
    ("zzz", "add", "{}", "Unknown MCP server 'zzz'. Configured servers: echo, missing, exits"),
    ("echo", "add", '{"a": 1,', "Invalid JSON in 'arguments'"),
    ("echo", "add", "[1, 2]", "'arguments' must decode to a JSON object, not list"),
    ("echo", "", "{}", "'mcp_tool_name' is empty"),
    ("", "add", "{}", "'server_alias' is empty. Configured MCP servers: echo, missing"),
    ("missing", "add", "{}", "could not be started: command not found: '/nonexistent/mcp-server'"),
    ("exits", "add", "{}", "closed the connection during the MCP handshake: it exited"),
    ("silent", "add", "{}", "did not complete the MCP handshake within 1 s (connect_timeout_s)"),
    ("nocmd", "add", "{}", "MCP server 'nocmd' is misconfigured: a 'stdio' server needs a 'command'"),
])
def test_errors_are_clear_failures(binding, alias, tool, arguments, expected):
    r = call(binding, alias, tool, arguments)
    assert r["success"] is False and r["status_code"] == 500, r
    assert expected in r["error"], r["error"]
    assert r["output"] == r["error"]
    if tool == "fail":
        assert r["error"].endswith("disk on fire")


def test_a_call_past_its_timeout_is_cancelled_and_the_server_kept(binding):
    before = server_info(binding)["pid"]
    t0 = time.monotonic()
    r = call(binding, "echo", "sleep", '{"seconds": 20}')
    assert time.monotonic() - t0 < CALL_TIMEOUT_S + 3
    assert not r["success"]
    assert f"did not answer tools/call 'sleep' within {CALL_TIMEOUT_S:g} s" in r["error"]
    assert call(binding, "echo", "add", '{"a": 1, "b": 2}')["output"] == "3"
    assert server_info(binding)["pid"] == before


def test_sandbox_timeout_interrupts_the_wait_and_keeps_worker_and_server(binding):
    pid, server = worker_pid(binding), server_info(binding)["pid"]
    r = call(binding, "echo", "sleep", '{"seconds": 20}', timeout_s=0.3)
    assert r["status_code"] == 504 and "kept" in r["error"], r
    assert call(binding, "echo", "echo", '{"text": "still here"}')["output"] == "still here"
    assert worker_pid(binding) == pid and server_info(binding)["pid"] == server


def test_a_server_that_died_is_started_again(binding):
    old = server_info(binding)["pid"]
    os.kill(old, signal.SIGKILL)
    assert wait_gone(old)
    r = call(binding, "echo", "add", '{"a": 2, "b": 2}')
    if not r["success"]:           # the death was not seen yet: the call says so, the next one restarts
        assert "The connection to MCP server 'echo' was lost" in r["error"], r
        r = call(binding, "echo", "add", '{"a": 2, "b": 2}')
    assert r["output"] == "4", r
    assert server_info(binding)["pid"] != old


def test_library_context_names_servers_and_tools(binding):
    call(binding, "echo", "add", '{"a": 0, "b": 1}')
    text = binding.library_context("mcp_bridge")
    assert "- echo: add, echo, fail, info, sleep, pixel" in text
    assert "- nocmd: misconfigured" in text


# ---------------------------------------------------------------- process tree
def test_the_server_runs_under_the_worker_and_close_stops_it(tmp_path):
    b = SandboxedBinding(tools_folders=[str(TOOLS)],
                         host_tool_configs={"mcp_bridge": {"servers": [ECHO_SERVER]}},
                         workspace=str(tmp_path))
    try:
        info = server_info(b)
        worker = worker_pid(b)
        server = psutil.Process(info["pid"])
        assert server.ppid() == worker == info["ppid"]
        assert worker in [p.pid for p in server.parents()]
        assert info["pid"] not in [c.pid for c in psutil.Process().children()]
        assert "echo_server.py" in " ".join(server.cmdline())
    finally:
        b.close()
    assert wait_gone(info["pid"]), "the MCP server outlived b.close()"
    assert wait_gone(worker)


# ---------------------------------------------------------------- other configurations
@pytest.fixture
def http_server():
    """echo_server.py serving streamable HTTP on a free local port (a host process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(ECHO), "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "HTTP MCP server did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_server(proc, 5)


def test_http_server(supervisor, tmp_path, http_server):
    servers = [{"alias": "web", "type": "http", "url": http_server},
               {"alias": "down", "url": "http://127.0.0.1:1/mcp", "connect_timeout_s": 2}]
    b = SandboxedBinding(tools_folders=[str(TOOLS)], host_tool_configs={"mcp_bridge": {"servers": servers}},
                         workspace=str(tmp_path), supervisor=supervisor, tenant="mcp-http")
    try:
        assert call(b, "web", "add", '{"a": 20, "b": 22}')["output"] == "42"
        r = call(b, "down", "add", "{}")
        assert not r["success"] and "could not be reached" in r["error"], r
    finally:
        b.close()


def test_unconfigured_bridge_says_what_to_configure(supervisor, tmp_path):
    b = SandboxedBinding(tools_folders=[str(TOOLS)], workspace=str(tmp_path),
                         supervisor=supervisor, tenant="mcp-unconfigured")
    try:
        for r in (b.execute_tool("tool_list_mcp_tools", {}), call(b, "echo", "add")):
            assert not r["success"] and "host_tool_configs['mcp_bridge']['servers']" in r["error"], r
    finally:
        b.close()


def test_library_loads_without_the_mcp_package(monkeypatch):
    """In-process: with ``mcp`` unimportable the library still loads and explains."""
    monkeypatch.setitem(sys.modules, "mcp", None)
    spec = importlib.util.spec_from_file_location("mcp_bridge_without_sdk", TOOLS / "mcp_bridge" / "mcp_bridge.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.init_tools_library({"servers": [ECHO_SERVER]})
    for r in (mod.tool_list_mcp_tools(), mod.tool_call_mcp_tool("echo", "add", "{}")):
        assert r["success"] is False
        assert "needs the official 'mcp' Python package" in r["error"], r
    assert "unavailable" in mod.tool_mcp_bridge_prompt()
