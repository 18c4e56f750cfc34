"""``lcp-sandbox serve-mcp`` driven by the official MCP SDK client, as any MCP host would.

One Streamable HTTP server (on 127.0.0.1, a free port, with a bearer token) serves
most tests, each test opening sessions of its own; it serves a copy of
tests/fixtures/mcp_front_libs (the list_changed test rewrites a file of it).  One stdio
server checks stdout purity, the stdio workspace and --auto-confirm.  Needs the
``mcp`` extra (the guard below only skips on machines without it).
"""
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import FIXTURES, stop_server, wait_gone

pytest.importorskip("mcp")

import anyio  # noqa: E402
import httpx2  # noqa: E402
import mcp_types as types  # noqa: E402
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

from lcp_sandbox import SandboxedBinding  # noqa: E402

FRONT_LIBS = FIXTURES / "mcp_front_libs"
SERVE = [sys.executable, "-m", "lcp_sandbox.fronts.cli", "serve-mcp"]
TOKEN = "test-token-0123456789"
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
NO_TOKEN_ENV = {k: v for k, v in os.environ.items() if k != "LCP_SANDBOX_MCP_TOKEN"}


# ---------------------------------------------------------------- the servers
@dataclass
class HttpServer:
    url: str
    root: Path
    libs: Path
    proc: subprocess.Popen
    log: list


def _pump(stream, lines: list, ready: queue.Queue) -> None:
    for line in stream:
        lines.append(line)
        if "serving http" in line:
            ready.put(line)
    ready.put(None)


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("mcp_libs") / "libs"
    shutil.copytree(FRONT_LIBS, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


@pytest.fixture(scope="module")
def server(libs, tmp_path_factory):
    base = tmp_path_factory.mktemp("mcp_http")
    (base / "config.json").write_text(json.dumps({"host_tool_configs": {"faulty": {"sandbox": {"timeout_s": 1}}}}))
    (base / "token").write_text(TOKEN + "\n")
    proc = subprocess.Popen([*SERVE, str(libs), "--transport", "http", "--port", "0",
                             "--workspace-root", str(base / "sessions"), "--config", str(base / "config.json"),
                             "--token-file", str(base / "token"), "--timeout", "30", "-v"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=NO_TOKEN_ENV)
    lines: list = []
    ready: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stderr, lines, ready), daemon=True).start()
    try:
        line = ready.get(timeout=60)
        assert line is not None, "".join(lines)
        url = re.search(r"serving (http://\S+)", line).group(1)
        yield HttpServer(url, base / "sessions", libs, proc, lines)
    finally:
        stop_server(proc)
    assert proc.returncode == 0, "".join(lines[-50:])


def test_http_confines_its_sessions_by_default_and_says_so(server, libs, tmp_path):
    """Every HTTP session is a tenant: confined unless --no-confine (stdio: one local client,
    unconfined unless --confine)."""
    ready = next(line for line in server.log if "serving http" in line)
    assert "workers confined; --no-confine to run them unconfined" in ready
    proc = subprocess.Popen([*SERVE, str(libs), "--transport", "http", "--port", "0",
                             "--workspace-root", str(tmp_path / "s"), "--no-confine"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=NO_TOKEN_ENV)
    lines: list = []
    got: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stderr, lines, got), daemon=True).start()
    try:
        line = got.get(timeout=60)
        assert line is not None and "workers unconfined (--no-confine)" in line, "".join(lines)
    finally:
        stop_server(proc)
    helped = " ".join(subprocess.run([*SERVE, "--help"], capture_output=True, text=True).stdout.split())
    assert "--no-confine" in helped and "the default over http" in helped


@asynccontextmanager
async def http_session(srv: HttpServer, **kwargs):
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        async with streamable_http_client(srv.url, http_client=http) as (read, write):
            async with ClientSession(read, write, **kwargs) as session:
                await session.initialize()
                yield session


def run(fn, *args):
    """Run an async test body (the SDK is anyio-based) to its end."""
    return anyio.run(fn, *args)


async def call(session: ClientSession, name: str, arguments: dict | None = None, **kwargs) -> types.CallToolResult:
    return await session.call_tool(name, arguments or {}, **kwargs)


def out(result: types.CallToolResult):
    """The LCP output of a successful call."""
    assert not result.is_error, result
    return result.structured_content["output"]


# ---------------------------------------------------------------- tools/list
def test_tools_list_is_the_discovered_tools(server, tmp_path):
    with SandboxedBinding(tools_folders=[server.libs], workspace=str(tmp_path)) as reference:
        specs = reference.discover_tools()

    async def body():
        async with http_session(server) as s:
            return (await s.list_tools()).tools
    tools = run(body)
    assert [t.name for t in tools] == [s["name"] for s in specs]
    by_name = {t.name: t for t in tools}
    for spec in specs:
        tool = by_name[spec["name"]]
        assert tool.description == spec["description"]
        schema, lcp = tool.input_schema, spec["input_schema"]
        assert schema["type"] == "object" and schema["required"] == lcp["required"]
        assert list(schema["properties"]) == list(lcp["properties"])
        for name, prop in lcp["properties"].items():
            assert schema["properties"][name]["type"] == prop["type"]
            assert schema["properties"][name]["description"] == prop["description"]
        assert not any(k.startswith("_") for k in tool.model_dump(by_alias=True, exclude_none=True))
    assert by_name["tool_dynamic"].description == "Dynamic description, computed in the worker (counter 0)."
    # hidden host parameters never appear
    assert list(by_name["tool_ask"].input_schema["properties"]) == ["prompt", "kind", "options"]
    assert list(by_name["tool_progress"].input_schema["properties"]) == ["steps"]


def test_input_schema_keeps_literal_defaults_only(server):
    async def body():
        async with http_session(server) as s:
            return {t.name: t for t in (await s.list_tools()).tools}
    schema = run(body)["tool_schema"].input_schema
    props = schema["properties"]
    assert schema["required"] == ["count"]
    assert {k: p["type"] for k, p in props.items()} == {
        "count": "integer", "ratio": "number", "flag": "boolean", "items": "array", "options": "object",
        "mode": "string", "label": "string", "path": "string", "limit": "integer"}
    assert props["count"]["description"] == "how many"
    defaults = {k: p["default"] for k, p in props.items() if "default" in p}
    assert defaults == {"ratio": 0.5, "flag": False, "items": None, "options": None, "label": "plain",
                        "limit": 10}                 # mode=DEFAULT_MODE and path=Path(".") are not literals


# ---------------------------------------------------------------- tools/call
def test_results_of_every_shape(server):
    async def body():
        async with http_session(server) as s:
            return {name: await call(s, name, args) for name, args in [
                ("tool_echo", {"text": "héllo ✓"}), ("tool_structured", {}), ("tool_fails", {}),
                ("tool_fails_bare", {}), ("tool_raises", {}), ("tool_image", {})]}
    r = run(body)

    echo = r["tool_echo"]
    assert not echo.is_error and [c.text for c in echo.content] == ["héllo ✓"]
    assert echo.structured_content == {"output": "héllo ✓", "status_code": 200, "success": True}

    structured = r["tool_structured"]
    expected = {"numbers": [1, 2], "tags": ["a", "b"], "raw": "/wA=", "text": "hi", "nan": "nan"}
    assert json.loads(structured.content[0].text) == expected
    assert structured.structured_content["output"] == expected and not structured.is_error

    fails = r["tool_fails"]
    assert fails.is_error and [c.text for c in fails.content] == ["Error: the disk is full"]
    assert fails.structured_content == {"output": "Error: the disk is full", "error": "the disk is full",
                                        "success": False, "status_code": 500}

    bare = r["tool_fails_bare"]                     # LCP's own output text, then the error
    assert bare.is_error and [c.text for c in bare.content] == ["Tool executed successfully.", "bad input"]

    raised = r["tool_raises"]
    assert raised.is_error and "boom" in raised.content[0].text
    assert "ValueError: boom" in raised.structured_content["traceback"]

    image = r["tool_image"]
    assert not image.is_error and image.content[0].text == "one pixel"
    assert image.content[1].type == "image" and image.content[1].data == PIXEL
    assert image.content[1].mime_type == "image/png"
    assert image.structured_content["prompt_injection"] == "look at the pixel"


def test_unknown_tools_and_invalid_arguments(server):
    async def body():
        async with http_session(server) as s:
            return [await call(s, "tool_nope"), await call(s, "tool_schema", {"count": "three"}),
                    await call(s, "tool_schema", {}), await call(s, "tool_schema", {"count": 3, "items": None})]
    unknown, wrong_type, missing, fine = run(body)
    assert unknown.is_error and unknown.content[0].text == "Unknown tool: tool_nope"
    assert wrong_type.is_error and wrong_type.content[0].text.startswith("Input validation error: count: ")
    assert missing.is_error and "'count' is a required property" in missing.content[0].text
    assert out(fine)["count"] == 3 and out(fine)["items"] is None and out(fine)["label"] == "plain"


def test_state_persists_across_calls(server):
    async def body():
        async with http_session(server) as s:
            return [out(await call(s, "tool_count", {"step": step})) for step in (1, 2, 3)]
    counts = run(body)
    assert [c["counter"] for c in counts] == [1, 3, 6]
    assert len({c["pid"] for c in counts}) == 1


def test_two_sessions_have_their_own_state_workspace_and_workers(server):
    async def body():
        async with http_session(server) as a, http_session(server) as b:
            a1 = out(await call(a, "tool_count"))
            a2 = out(await call(a, "tool_count"))
            b1 = out(await call(b, "tool_count"))
            wa = out(await call(a, "tool_where", {"file_name": "mine.txt", "content": "a"}))
            wb = out(await call(b, "tool_where"))
        return a1, a2, b1, wa, wb
    a1, a2, b1, wa, wb = run(body)
    assert (a1["counter"], a2["counter"], b1["counter"]) == (1, 2, 1)
    assert a1["pid"] != b1["pid"]
    assert wa["cwd"] != wb["cwd"]
    assert Path(wa["cwd"]).parent == Path(wb["cwd"]).parent == server.root.resolve()
    assert "mine.txt" in wa["files"] and "mine.txt" not in wb["files"]
    # the sessions ended: their workers stopped
    assert wait_gone(a1["pid"]) and wait_gone(b1["pid"]) and wait_gone(wa["pid"])


# ---------------------------------------------------------------- HTTP security
def test_foreign_origin_host_and_missing_token_are_refused_before_any_session(server):
    before = sorted(os.listdir(server.root))
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                  "clientInfo": {"name": "probe", "version": "0"}}})
    base = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {TOKEN}"}
    port = server.url.split(":")[2].split("/")[0]
    with httpx2.Client(timeout=30) as http:
        cases = [({"Origin": "http://evil.example"}, 403), ({"Host": "evil.example"}, 421),
                 ({"Host": f"evil.example:{port}"}, 421), ({"Authorization": ""}, 401),
                 ({"Authorization": "Bearer wrong"}, 401)]
        for headers, status in cases:
            r = http.post(server.url, headers={**base, **headers}, content=init)
            assert r.status_code == status, (headers, r.status_code, r.text)
            assert "mcp-session-id" not in r.headers
        # the server's own origin is fine
        r = http.post(server.url, headers={**base, "Origin": f"http://127.0.0.1:{port}"}, content=init)
        assert r.status_code == 200 and r.headers.get("mcp-session-id")
        http.delete(server.url, headers={**base, "mcp-session-id": r.headers["mcp-session-id"]})
    # no session got a workspace (or a worker); earlier tests' ended sessions may be going
    assert set(os.listdir(server.root)) <= set(before)


def test_a_request_body_that_gives_a_key_twice_is_a_parse_error(server):
    """A JSON-RPC body with a key twice in an object gets 400 and JSON-RPC's parse error
    naming the key, as the SDK answers a body that is no JSON: whatever reads the message
    (the guard's rate check, the SDK) cannot take another meaning from it."""
    base = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {TOKEN}"}
    init = ('{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": '
            '"2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0", '
            '"name": "twice"}}}')
    call = ('{"jsonrpc": "2.0", "id": 2, "method": "tools/list", "method": "tools/call", '
            '"params": {"name": "tool_echo", "arguments": {}}}')
    with httpx2.Client(timeout=30) as http:
        r = http.post(server.url, headers=base, content=init)
        assert r.status_code == 400 and "mcp-session-id" not in r.headers, r.text
        assert r.json()["error"] == {
            "code": -32700, "message": "Parse error: the key 'name' is given twice at "
            "params.clientInfo.name: JSON readers keep one of the two silently (Python's the "
            "last); give each key once"}
        opened = http.post(server.url, headers=base, content=init.replace(', "name": "twice"', ""))
        assert opened.status_code == 200, opened.text
        h = {**base, "mcp-session-id": opened.headers["mcp-session-id"]}
        r = http.post(server.url, headers=h, content=call)
        assert r.status_code == 400 and r.json()["error"]["code"] == -32700, r.text
        assert "'method' is given twice at method" in r.json()["error"]["message"]
        http.delete(server.url, headers=h)


def test_a_non_loopback_bind_without_a_token_is_refused(tmp_path):
    p = subprocess.run([*SERVE, str(FRONT_LIBS), "--transport", "http", "--host", "0.0.0.0", "--port", "0",
                        "--workspace-root", str(tmp_path)], capture_output=True, text=True, timeout=60,
                       env=NO_TOKEN_ENV)
    assert p.returncode == 2, p.stderr
    assert "refusing to serve on '0.0.0.0' without a bearer token" in p.stderr
    assert "LCP_SANDBOX_MCP_TOKEN" in p.stderr and not os.listdir(tmp_path)


# ---------------------------------------------------------------- --config, checked at the start
def _start(tmp_path: Path, config, *args: str) -> tuple:
    """Start serve-mcp on FRONT_LIBS with ``config`` as --config (a str: the file's text):
    (its exit status, or None if it served (then stopped), what it wrote on stderr)."""
    (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    proc = subprocess.Popen([*SERVE, str(FRONT_LIBS), "--workspace-root", str(tmp_path / "sessions"),
                             "--config", str(tmp_path / "config.json"), *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=NO_TOKEN_ENV)
    lines: list = []
    ready: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stderr, lines, ready), daemon=True).start()
    served = ready.get(timeout=60) is not None
    if served:
        stop_server(proc)
    else:
        proc.wait(60)
    return None if served else proc.returncode, "".join(lines)


HTTP = ("--transport", "http", "--port", "0")


@pytest.mark.parametrize("config, args, said", [
    ({"faulty": {"Sandbox": {"network": False}}}, HTTP,
     "host_tool_configs['faulty'] has 'Sandbox', which is not 'sandbox'"),
    ({"faulty": {"sandbox ": {"network": False}}}, HTTP,
     "host_tool_configs['faulty'] has 'sandbox ', which is not 'sandbox'"),
    ({"faulty": {"sandbox": []}}, HTTP,
     "host_tool_configs['faulty']['sandbox'] must be a dict of sandbox settings, not []"),
    ({"faulty": {"sandbox": False}}, HTTP,
     "host_tool_configs['faulty']['sandbox'] must be a dict of sandbox settings, not False"),
    ({"faulty": {"sandbox": {"netwrok": False}}}, HTTP,
     "'netwrok' is no sandbox setting (did you mean 'network'?)"),
    ({"faulty": {"sandbox": {"timeout_s": "5"}}}, HTTP, "'timeout_s' must be a number"),
    ({"faulty": {"sandbox": {"run_as": [True, True]}}}, HTTP, "run_as"),
    ({"faulty": {"sandbox": {"disk_mb": 8}}}, (*HTTP, "--no-confine"),
     "'disk_mb' is 8: it caps a confined worker's root (confine=True)"),
    ({"fauty": {"sandbox": {"network": False}}}, HTTP,
     "host_tool_configs['fauty'] names no library of this binding (did you mean 'faulty'?)"),
    ({"weather": {"sandbox": {"network": False}}}, HTTP,
     "host_tool_configs['weather'] has \"sandbox\" settings but names no library of the "
     "served folders: they would protect nothing; the libraries: changing, faulty, interact"),
    ({"faulty.py": {"sandbox": {"network": False}}}, HTTP,
     "host_tool_configs['faulty.py'] names no library of this binding (did you mean 'faulty'?)"),
    ({"host_tool_config": {"faulty": {"sandbox": {"network": False}}}}, HTTP,
     "has 'host_tool_config', which is not 'host_tool_configs'"),
    ({"host_tool_configs": {"faulty": {"sandbox": {"network": False}}}, "netwrok": False}, HTTP,
     "has 'netwrok' beside 'host_tool_configs'"),
    ({"faulty": {"sandbox": {"netwrok": False}}}, (), "'netwrok' is no sandbox setting"),
], ids=["Sandbox", "sandbox-space", "sandbox-list", "sandbox-false", "netwrok", "timeout-str",
        "run_as-bools", "disk-unconfined", "library-slip", "no-library", "library-file", "wrapper-slip",
        "beside-wrapper", "stdio"])
def test_a_wrong_config_stops_the_server_before_it_serves(tmp_path, config, args, said):
    """A --config mistake is the command's: exit status 2 with one line naming it, before
    the server listens or makes anything (over stdio too), not a 500 at the first call."""
    status, err = _start(tmp_path, config, *args)
    assert status == 2, err
    assert err.startswith(f"lcp-sandbox serve-mcp: --config {str(tmp_path / 'config.json')!r}: "), err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "sessions").exists()


@pytest.mark.parametrize("text, where", [
    ('{"faulty": {"sandbox": {"network": false, "network": true}}}',
     "the key 'network' is given twice at faulty.sandbox.network"),
    ('{"faulty": {"sandbox": {"network": false}, "sandbox": {"timeout_s": 5}}}',
     "the key 'sandbox' is given twice at faulty.sandbox"),
    ('{"faulty": {"sandbox": {"network": false}}, "faulty": {"x": 1}}',
     "the key 'faulty' is given twice at faulty"),
    ('{"host_tool_configs": {"faulty": {"sandbox": {"network": false, "network": true}}}}',
     "the key 'network' is given twice at host_tool_configs.faulty.sandbox.network"),
    ('{"host_tool_configs": {"faulty": {"sandbox": {"network": false}}}, "host_tool_configs": {}}',
     "the key 'host_tool_configs' is given twice at host_tool_configs"),
], ids=["network", "sandbox", "library", "wrapped", "wrapper"])
def test_a_key_given_twice_in_the_config_stops_the_server_before_it_serves(tmp_path, text, where):
    """JSON keeps the last of two equal keys: "network": false then true would read as the
    network on, the library's first entry (its protection) dropped.  Refused, naming the
    file, the key and where it is, before anything is served."""
    status, err = _start(tmp_path, text, *HTTP)
    assert status == 2, err
    assert err.startswith(f"lcp-sandbox serve-mcp: --config {str(tmp_path / 'config.json')!r}: "
                          f"{where}: "), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "sessions").exists()


def test_a_config_entry_of_no_library_without_sandbox_is_a_warning_at_the_start(tmp_path):
    """An entry with no "sandbox" holds the library's own settings, no protection: logged
    once, before the ready line, and the server serves."""
    status, err = _start(tmp_path, {"faulty": {"sandbox": {"timeout_s": 5}}, "fauty": {"x": 1}},
                         *HTTP)
    assert status is None, err
    warning = err.index("host_tool_configs['fauty'] names no library of this binding "
                        "(did you mean 'faulty'?)")
    assert warning < err.index("serving http"), err


# ---------------------------------------------------------------- elicitation
def answering(*answers):
    """An elicitation callback giving these answers in turn; it records what it was asked."""
    asked = []

    async def callback(context, params):
        asked.append(params)
        return answers[len(asked) - 1]
    return callback, asked


@pytest.mark.parametrize("answer, expected", [
    (types.ElicitResult(action="accept", content={"decision": "allow"}), {"decision": "allow", "reason": ""}),
    (types.ElicitResult(action="accept", content={"decision": "reject", "reason": "not today"}),
     "rejected: not today"),
    (types.ElicitResult(action="decline"), "rejected: The user declined the action."),
    (types.ElicitResult(action="cancel"), "rejected: The user dismissed the confirmation request"),
], ids=["allow", "reject", "decline", "cancel"])
def test_confirmation_is_an_elicitation(server, answer, expected):
    callback, asked = answering(answer)

    async def body():
        async with http_session(server, elicitation_callback=callback) as s:
            return await call(s, "tool_guarded", {"action": "deploy"})
    r = run(body)
    [params] = asked
    assert params.message.startswith("A tool asks for your confirmation: interact: deploy")
    assert "This would deploy now." in params.message and '["do", "deploy"]' in params.message
    decision = params.requested_schema["properties"]["decision"]
    assert [o["const"] for o in decision["oneOf"]] == ["allow", "always", "reject"]
    assert params.requested_schema["required"] == ["decision"]
    if isinstance(expected, dict):
        assert out(r)["asked"] is True and {k: out(r)[k] for k in expected} == expected
    else:
        assert r.is_error and r.structured_content["error"].startswith(expected), r


def test_always_stops_the_questions_for_the_session(server):
    callback, asked = answering(types.ElicitResult(action="accept", content={"decision": "always"}))

    async def body():
        async with http_session(server, elicitation_callback=callback) as s:
            return [out(await call(s, "tool_guarded", {"action": step})) for step in ("one", "two")]
    first, second = run(body)
    assert first["asked"] is True and first["decision"] == "always"
    assert second == {"done": "two", "asked": False} and len(asked) == 1


def test_user_questions_are_elicitations(server):
    callback, asked = answering(types.ElicitResult(action="accept", content={"answer": "blue"}),
                                types.ElicitResult(action="accept", content={"answer": "b"}),
                                types.ElicitResult(action="decline"))

    async def body():
        async with http_session(server, elicitation_callback=callback) as s:
            return [out(await call(s, "tool_ask", {"prompt": "Favourite colour?"})),
                    out(await call(s, "tool_ask", {"prompt": "Pick one", "kind": "select", "options": ["a", "b"]})),
                    out(await call(s, "tool_ask", {"prompt": "Really?"})),
                    out(await call(s, "tool_ask", {"prompt": "Your password", "kind": "secret"}))]
    text, select, declined, secret = run(body)
    assert (text, select, declined, secret) == ({"answer": "blue"}, {"answer": "b"}, {"answer": None},
                                                {"answer": None})
    assert len(asked) == 3                          # a secret is never asked in a form (MCP forbids it)
    assert asked[0].message == "Favourite colour?"
    assert asked[0].requested_schema["properties"]["answer"]["title"] == "Question"
    assert asked[1].requested_schema["properties"]["answer"]["enum"] == ["a", "b"]


def test_a_client_without_elicitation_gets_rejections(server):
    async def body():
        async with http_session(server) as s:
            return await call(s, "tool_guarded", {"action": "deploy"}), await call(s, "tool_ask", {"prompt": "?"})
    guarded, ask = run(body)
    assert guarded.is_error
    assert "The MCP client cannot confirm actions (it did not declare the elicitation capability)" \
        in guarded.structured_content["error"]
    assert out(ask) == {"answer": None}


# ---------------------------------------------------------------- progress, faults, cancellation
def test_progress_notifications(server):
    seen = []

    async def progress(value, total, message):
        seen.append((value, total, message))

    async def body():
        async with http_session(server) as s:
            return (await call(s, "tool_progress", {"steps": 3}, progress_callback=progress),
                    await call(s, "tool_progress", {"steps": 2}))
    with_token, without = run(body)
    assert seen == [(1.0, 3.0, "step 1 of 3"), (2.0, 3.0, "step 2 of 3"), (3.0, 3.0, "step 3 of 3")]
    assert out(with_token)["emitted"] == [True, True, True] and out(without)["emitted"] == [True, True]
    assert Path(out(with_token)["workspace"]).parent == server.root.resolve()


def test_a_timeout_and_a_crash_leave_the_session_working(server):
    async def body():
        async with http_session(server) as s:
            return [await call(s, name) for name in ("tool_alive", "tool_hang", "tool_alive", "tool_crash",
                                                      "tool_alive")]
    alive1, hang, alive2, crash, alive3 = run(body)
    assert hang.is_error and hang.structured_content["status_code"] == 504
    assert "timed out after 1 s" in hang.content[0].text and "kept" in hang.content[0].text
    assert out(alive2) == {"counter": 2, "pid": out(alive1)["pid"]}          # same worker, state kept
    assert crash.is_error and crash.structured_content["status_code"] == 500
    assert "SIGSEGV" in crash.structured_content["error"]
    assert out(alive3)["counter"] == 1 and out(alive3)["pid"] != out(alive1)["pid"]   # a fresh worker


def test_cancellation_interrupts_the_call_and_keeps_the_state(server):
    async def body():
        async with http_session(server) as s:
            before = out(await call(s, "tool_state"))
            started = anyio.Event()

            async def progress(value, total, message):
                started.set()

            async with anyio.create_task_group() as tg:
                async def waiting():
                    await call(s, "tool_wait", {"seconds": 60}, progress_callback=progress)
                tg.start_soon(waiting)
                await started.wait()
                tg.cancel_scope.cancel()                  # the client sends notifications/cancelled
            after = out(await call(s, "tool_state"))     # queued behind the interrupted call
            return before, after
    before, after = run(body)
    assert after == {"interrupted": 1, "finished": 0, "pid": before["pid"]}


def test_cancelling_a_call_that_waits_for_the_user_withdraws_the_question(server):
    asked, withdrawn = anyio.Event(), []

    async def never_answers(context, params):
        asked.set()
        try:
            await anyio.sleep_forever()
        finally:
            withdrawn.append(params.message)

    async def body():
        async with http_session(server, elicitation_callback=never_answers) as s:
            async with anyio.create_task_group() as tg:
                async def guarded():
                    await call(s, "tool_guarded", {"action": "wait"})
                tg.start_soon(guarded)
                await asked.wait()
                tg.cancel_scope.cancel()
            return out(await call(s, "tool_state"))       # the library's worker is free again
    state = run(body)
    assert state["interrupted"] == 0 and state["pid"]
    assert withdrawn and withdrawn[0].startswith("A tool asks for your confirmation: interact: wait")


def test_a_changed_library_is_reloaded_and_the_list_changed(server):
    notices = []

    async def on_message(message):
        notices.append(getattr(message, "method", None) or getattr(getattr(message, "root", None), "method", None))

    path = server.libs / "changing.py"

    async def body():
        async with http_session(server, message_handler=on_message) as s:
            first = [out(await call(s, "tool_version")) for _ in range(2)]
            text = path.read_text()
            path.write_text(text.replace('"version": 1', '"version": 2') + (
                '\n\ndef tool_added() -> dict:\n    """A tool that came with version 2."""\n'
                '    return {"success": True, "output": "added"}\n'))
            after = out(await call(s, "tool_version"))
            names = [t.name for t in (await s.list_tools()).tools]
            return first, after, names
    first, after, names = run(body)
    assert [f["counter"] for f in first] == [1, 2] and first[0]["version"] == 1
    assert after == {"version": 2, "counter": 1}          # a fresh worker with the new code
    assert "notifications/tools/list_changed" in notices
    assert "tool_added" in names


# ---------------------------------------------------------------- stdio
def test_stdio_writes_nothing_but_protocol_on_stdout(tmp_path):
    wire, errlog = tmp_path / "stdout.jsonl", tmp_path / "stderr.log"
    workspace = tmp_path / "ws"
    failures = []

    async def on_message(message):
        if isinstance(message, Exception):
            failures.append(message)

    # sh tees the server's stdout into a file on its way to the client
    params = StdioServerParameters(command="sh", args=[
        "-c", '"$@" | tee "$0"', str(wire), *SERVE, str(FRONT_LIBS), "--workspace", str(workspace),
        "--auto-confirm", "allow", "-v"], cwd=str(tmp_path))

    async def body():
        with errlog.open("w") as err:
            async with stdio_client(params, errlog=err) as (read, write):
                async with ClientSession(read, write, message_handler=on_message) as s:
                    await s.initialize()
                    names = [t.name for t in (await s.list_tools()).tools]
                    return (names, await call(s, "tool_noisy"), await call(s, "tool_where"),
                            await call(s, "tool_guarded", {"action": "deploy"}))
    names, noisy, where, guarded = run(body)
    assert "tool_noisy" in names and out(noisy) == "printed"
    assert out(where)["cwd"] == str(workspace.resolve())
    assert out(guarded)["decision"] == "allow" and "--auto-confirm allow" in out(guarded)["reason"]
    assert failures == []
    lines = [line for line in wire.read_text().splitlines() if line.strip()]
    assert len(lines) >= 4
    for line in lines:
        assert json.loads(line)["jsonrpc"] == "2.0", line
    logged = errlog.read_text()
    for marker in ("NOISY-IMPORT-TIME", "NOISY-PRINT", "NOISY-FD1", "NOISY-CHILD", "NOISY-STDERR"):
        assert marker in logged and marker not in wire.read_text(), marker
