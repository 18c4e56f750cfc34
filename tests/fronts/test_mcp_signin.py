"""``serve-mcp --auth-issuer``: users signed in by OAuth, a tenant per user, tools per role,
on a real server driven by the MCP SDK's own client sending the token.

The tests are the issuer (tests/support/issuer.py, on 127.0.0.1); two users, alice (groups
eng) and bob (groups ops), with different tools allowed by an --auth-policy file.
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
import time
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from conftest import FIXTURES, poll, stop_server

pytest.importorskip("mcp")
pytest.importorskip("jwt")

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402
from support.issuer import AUDIENCE, Issuer  # noqa: E402

FRONT_LIBS = FIXTURES / "mcp_front_libs"
SERVE = [sys.executable, "-m", "lcp_sandbox.fronts.cli", "serve-mcp"]
NO_TOKEN_ENV = {k: v for k, v in os.environ.items() if k != "LCP_SANDBOX_MCP_TOKEN"}
POLICY = {"rules": [{"claim": "groups", "value": "eng", "allow": ["shapes"]},
                    {"claim": "groups", "value": "ops", "allow": ["shapes.tool_echo"]},
                    {"claim": "scope", "value": "faulty.use", "allow": ["faulty.tool_alive"]}]}


@dataclass
class Server:
    url: str
    base: str
    root: Path
    proc: subprocess.Popen
    log: list


def _pump(stream, lines: list, ready: queue.Queue) -> None:
    for line in stream:
        lines.append(line)
        if "serving http" in line:
            ready.put(line)
    ready.put(None)


@contextmanager
def serving(tmp_path: Path, issuer: Issuer, *args: str) -> Iterator[Server]:
    libs = tmp_path / "libs"
    if not libs.exists():
        shutil.copytree(FRONT_LIBS, libs, ignore=shutil.ignore_patterns("__pycache__"))
    root = tmp_path / "sessions"
    proc = subprocess.Popen([*SERVE, str(libs), "--transport", "http", "--port", "0",
                             "--workspace-root", str(root), "--auth-issuer", issuer.url,
                             "--auth-audience", AUDIENCE, "--timeout", "30", "-v", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=NO_TOKEN_ENV)
    lines: list = []
    ready: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stderr, lines, ready), daemon=True).start()
    try:
        line = ready.get(timeout=60)
        assert line is not None, "".join(lines)
        url = re.search(r"serving (http://\S+)", line).group(1)
        yield Server(url, url.rsplit("/mcp", 1)[0], root, proc, lines)
    finally:
        stop_server(proc)
    assert proc.returncode == 0, "".join(lines[-50:])


@pytest.fixture(scope="module")
def issuer():
    made = Issuer().start()
    yield made
    made.stop()


@pytest.fixture(scope="module")
def server(issuer, tmp_path_factory):
    base = tmp_path_factory.mktemp("signin")
    (base / "policy.json").write_text(json.dumps(POLICY))
    with serving(base, issuer, "--auth-policy", str(base / "policy.json"), "--metrics",
                 "--tenant-idle-timeout", "3600") as srv:
        yield srv


@asynccontextmanager
async def session_of(srv: Server, token: str):
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with streamable_http_client(srv.url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


def out(result):
    assert not result.is_error, result
    return result.structured_content["output"]


def post(srv: Server, headers: dict, body: dict | None = None) -> httpx2.Response:
    body = body or {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}
    with httpx2.Client(timeout=30) as c:
        return c.post(srv.url, json=body, headers={
            "Accept": "application/json, text/event-stream", **headers})


# ---------------------------------------------------------------- the resource server
def test_no_token_or_a_bad_one_gets_401_naming_the_metadata(server, issuer):
    issuer.add_key("stranger")                      # a key the issuer never published
    metadata = f"{server.base}/.well-known/oauth-protected-resource/mcp"
    for headers in ({}, {"Authorization": "Bearer not-a-jwt"},
                    {"Authorization": f"Bearer {issuer.unsigned()}"},
                    {"Authorization": f"Bearer {issuer.hs256_with_public_key()}"},
                    {"Authorization": f"Bearer {issuer.token(aud='elsewhere')}"},
                    {"Authorization": f"Bearer {issuer.token(exp=int(time.time()) - 120)}"},
                    {"Authorization": f"Bearer {issuer.tampered(issuer.token(), sub='x')}"},
                    {"Authorization": f"Bearer {issuer.token(kid='stranger')}"}):
        r = post(server, headers)
        assert r.status_code == 401, (headers, r.text)
        assert f'resource_metadata="{metadata}"' in r.headers["www-authenticate"]
    # No session, no workspace was made for any of them.
    assert not server.root.exists() or not os.listdir(server.root)


def test_the_protected_resource_metadata_names_the_issuer(server, issuer):
    with httpx2.Client(timeout=30) as c:
        for path in ("/.well-known/oauth-protected-resource/mcp",
                     "/.well-known/oauth-protected-resource"):
            doc = c.get(server.base + path).json()
            assert doc["resource"] == server.url
            assert [a.rstrip("/") for a in doc["authorization_servers"]] == [issuer.url]


def test_a_missing_scope_gets_403_insufficient_scope(issuer, tmp_path):
    with serving(tmp_path, issuer, "--auth-required-scope", "tools.call") as srv:
        r = post(srv, {"Authorization": f"Bearer {issuer.token(scope='tools.read')}"})
        assert r.status_code == 403
        assert 'error="insufficient_scope"' in r.headers["www-authenticate"]
        ok = post(srv, {"Authorization": f"Bearer {issuer.token(scope='tools.read tools.call')}"})
        assert ok.status_code == 200, ok.text
        doc = httpx2.get(srv.base + "/.well-known/oauth-protected-resource").json()
        assert doc["scopes_supported"] == ["tools.call"]


# ---------------------------------------------------------------- a tenant per user
def test_a_users_second_session_finds_the_first_ones_file_and_state_another_user_neither(
        server, issuer):
    alice, bob = issuer.token("alice", groups=["eng"]), issuer.token("bob", groups=["eng"])

    async def body():
        async with session_of(server, alice) as s:
            wrote = out(await s.call_tool("tool_where", {"file_name": "a.txt", "content": "hi"}))
            first = out(await s.call_tool("tool_count", {"step": 5}))
        # The first session ended (DELETE): the user comes back.
        async with session_of(server, alice) as again:
            found = out(await again.call_tool("tool_where", {}))
            second = out(await again.call_tool("tool_count", {"step": 1}))
        async with session_of(server, bob) as other:
            bobs = out(await other.call_tool("tool_where", {}))
            bob_count = out(await other.call_tool("tool_count", {"step": 1}))
        return wrote, first, found, second, bobs, bob_count
    wrote, first, found, second, bobs, bob_count = anyio.run(body)
    assert "a.txt" in found["files"] and found["cwd"] == wrote["cwd"]
    assert (first["counter"], second["counter"]) == (5, 6) and first["pid"] == second["pid"]
    assert "a.txt" not in bobs["files"] and bobs["cwd"] != wrote["cwd"]
    assert bob_count["counter"] == 1 and bob_count["pid"] != first["pid"]
    # The folders say nothing of who the users are.
    for name in os.listdir(server.root):
        assert "alice" not in name and "bob" not in name


def test_two_users_at_once_share_nothing(server, issuer):
    tokens = {u: issuer.token(u, kid=k, groups=["eng"]) for u, k in (("carol", "rsa1"),
                                                                       ("dave", "ec1"))}
    seen: dict = {}

    async def one(user: str) -> None:
        async with session_of(server, tokens[user]) as s, session_of(server, tokens[user]) as t:
            await s.call_tool("tool_where", {"file_name": f"{user}.txt", "content": user})
            a = out(await s.call_tool("tool_count", {"step": 1}))
            b = out(await t.call_tool("tool_count", {"step": 1}))
            seen[user] = (a, b, out(await t.call_tool("tool_where", {})))

    async def body():
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "carol")
            tg.start_soon(one, "dave")
    anyio.run(body)
    for user, other in (("carol", "dave"), ("dave", "carol")):
        a, b, where = seen[user]
        # Two sessions of one user at once: one tenant, one worker, one counter.
        assert (a["counter"], b["counter"]) == (1, 2) and a["pid"] == b["pid"]
        assert f"{user}.txt" in where["files"] and f"{other}.txt" not in where["files"]
    assert seen["carol"][0]["pid"] != seen["dave"][0]["pid"]


def test_a_session_cannot_be_used_with_another_users_token(server, issuer):
    """A session id is bound to the user who opened it: bob's token on alice's session is
    answered as if it did not exist."""
    alice, bob = issuer.token("alice", groups=["eng"]), issuer.token("bob", groups=["eng"])
    opened = post(server, {"Authorization": f"Bearer {alice}"})
    sid = opened.headers["mcp-session-id"]
    listed = post(server, {"Authorization": f"Bearer {bob}", "mcp-session-id": sid,
                           "mcp-protocol-version": "2025-06-18"},
                  {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    assert listed.status_code == 404


def test_an_idle_users_tenant_is_removed(issuer, tmp_path):
    token = issuer.token("erin")
    with serving(tmp_path, issuer, "--tenant-idle-timeout", "1", "--no-confine") as srv:
        async def body():
            async with session_of(srv, token) as s:
                return out(await s.call_tool("tool_where", {"file_name": "x", "content": "1"}))
        where = anyio.run(body)
        assert Path(where["cwd"]).exists()
        assert poll(lambda: not Path(where["cwd"]).exists(), 30), "the idle tenant stayed"
        assert any("idle, removed" in line for line in srv.log)


# ---------------------------------------------------------------- tools per role
def test_tools_per_role_list_call_refusal_and_metrics(server, issuer):
    eng = issuer.token("frank", groups=["eng"])
    ops = issuer.token("grace", groups=["ops"])
    nobody = issuer.token("heidi", groups=["sales"], scope="faulty.use other")

    async def body():
        got = {}
        for name, token in (("eng", eng), ("ops", ops), ("nobody", nobody)):
            async with session_of(server, token) as s:
                tools = sorted(t.name for t in (await s.list_tools()).tools)
                refused = await s.call_tool("tool_count", {"step": 1})
                got[name] = (tools, refused)
        return got
    got = anyio.run(body)
    eng_tools, eng_call = got["eng"]
    assert "tool_count" in eng_tools and "tool_echo" in eng_tools and "tool_hang" not in eng_tools
    assert not eng_call.is_error
    assert got["ops"][0] == ["tool_echo"]
    assert got["nobody"][0] == ["tool_alive"]
    for name in ("ops", "nobody"):
        refused = got[name][1]
        assert refused.is_error
        assert refused.content[0].text == "Tool 'tool_count' is not allowed for this user " \
                                          "(--auth-policy)."
    metrics = httpx2.get(server.base + "/metrics",
                         headers={"Authorization": f"Bearer {eng}"}).text
    assert 'lcp_sandbox_policy_refusals_total{tool="tool_count"} 2.0' in metrics
    assert "grace" not in metrics and "heidi" not in metrics
    assert any("refused by --auth-policy" in line and "mcp-u" in line for line in server.log)


def test_a_refused_call_never_runs_a_worker(server, issuer):
    ops = issuer.token("ivan", groups=["ops"])

    async def body():
        async with session_of(server, ops) as s:
            refused = await s.call_tool("tool_where", {"file_name": "x", "content": "1"})
            echoed = await s.call_tool("tool_echo", {"text": "hi"})
            return refused, echoed
    refused, echoed = anyio.run(body)
    assert refused.is_error and "not allowed for this user" in refused.content[0].text
    assert not echoed.is_error
    # The refused tool wrote nothing anywhere.
    assert not list(server.root.rglob("x"))


# ---------------------------------------------------------------- the command line
@pytest.mark.parametrize("args, says", [
    (["--auth-issuer", "https://i.example.org"], "needs --auth-audience"),
    (["--auth-audience", "a"], "--auth-audience needs --auth-issuer"),
    (["--auth-issuer", "http://issuer.example.org", "--auth-audience", "a"], "https"),
    (["--auth-issuer", "https://i.example.org", "--auth-audience", "a", "--token-file", "T"],
     "exclude each other"),
    (["--tenant-idle-timeout", "5"], "--tenant-idle-timeout needs --auth-issuer"),
])
def test_auth_flags_that_cannot_hold_exit_2_naming_them(tmp_path, args, says):
    (tmp_path / "T").write_text("tok")
    args = [str(tmp_path / "T") if a == "T" else a for a in args]
    p = subprocess.run([*SERVE, str(FRONT_LIBS), "--transport", "http", "--port", "0",
                        "--workspace-root", str(tmp_path / "s"), *args],
                       capture_output=True, text=True, env=NO_TOKEN_ENV, timeout=60)
    assert p.returncode == 2 and says in p.stderr, p.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("policy, says", [
    ('{"rules": [], "extra": 1}', "the one key"),
    ('{"rules": [{"claim": "g", "value": "e", "allow": ["a"], "allow": ["b"]}]}', "twice"),
    ('{"rules": [{"claim": "g", "value": "e", "alow": ["a"]}]}', "unknown keys ['alow']"),
    ('{"rules": [{"claim": "g", "value": 3, "allow": ["a"]}]}', "value must be"),
    ('{"rules": [{"claim": "g", "value": "e", "allow": ["a.b.c"]}]}', "allow must be"),
])
def test_a_bad_policy_file_exits_2(tmp_path, issuer, policy, says):
    (tmp_path / "p.json").write_text(policy)
    p = subprocess.run([*SERVE, str(FRONT_LIBS), "--transport", "http", "--port", "0",
                        "--workspace-root", str(tmp_path / "s"), "--auth-issuer", issuer.url,
                        "--auth-audience", "a", "--auth-policy", str(tmp_path / "p.json")],
                       capture_output=True, text=True, env=NO_TOKEN_ENV, timeout=60)
    assert p.returncode == 2 and says in p.stderr, p.stderr


# ---------------------------------------------------------------- names that tell nothing
def test_a_workspace_path_tells_nothing_that_reaches_a_session(tmp_path):
    """Without sign-in every session is a tenant of its own. Its workspace's path (which a
    tool's command line may carry, and other tenants may read in /proc) is a keyed hash:
    it holds no session id, and sent as one it reaches no session."""
    libs = tmp_path / "libs"
    shutil.copytree(FRONT_LIBS, libs, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.Popen([*SERVE, str(libs), "--transport", "http", "--port", "0",
                             "--workspace-root", str(tmp_path / "sessions"), "--no-confine"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=NO_TOKEN_ENV)
    lines: list = []
    ready: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stderr, lines, ready), daemon=True).start()
    try:
        line = ready.get(timeout=60)
        assert line is not None, "".join(lines)
        url = re.search(r"serving (http://\S+)", line).group(1)
        srv = Server(url, url.rsplit("/mcp", 1)[0], tmp_path / "sessions", proc, lines)
        opened = post(srv, {})
        sid = opened.headers["mcp-session-id"]
        h = {"mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"}
        post(srv, h, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        called = post(srv, h, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                               "params": {"name": "tool_where", "arguments": {}}})
        cwd = json.loads(called.text.split("data: ", 1)[1].splitlines()[0])[
            "result"]["structuredContent"]["output"]["cwd"]
        assert Path(cwd).parent == srv.root.resolve()
        assert sid not in cwd
        # The folder's name, or the tenant's, sent as a session id: no session.
        for guess in (Path(cwd).name, "mcp-" + Path(cwd).name):
            r = post(srv, {**h, "mcp-session-id": guess},
                     {"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
            assert r.status_code == 404, r.text
    finally:
        stop_server(proc)


# ---------------------------------------------------------------- caps per user
def test_caps_are_per_user_opening_sessions_gains_nothing(issuer, tmp_path):
    """--max-sessions-per-client and --rate-limit count a signed-in user, whatever sessions
    they open (all the clients here share one address: the address is not what counts)."""
    alice, bob = issuer.token("alice"), issuer.token("bob")
    with serving(tmp_path, issuer, "--max-sessions-per-client", "2", "--rate-limit", "1",
                 "--no-confine") as srv:
        a = [post(srv, {"Authorization": f"Bearer {alice}"}) for _ in range(3)]
        assert [r.status_code for r in a] == [200, 200, 429]
        assert post(srv, {"Authorization": f"Bearer {bob}"}).status_code == 200
        # Alice's two sessions draw on one bucket: 2 s worth of burst at 1 call a second (a
        # session's first call, which makes its tenant, is not metered). Apart, each of the
        # two would have a burst of its own and all six calls would pass.
        codes = []
        for i in range(6):
            h = {"Authorization": f"Bearer {alice}", "mcp-protocol-version": "2025-06-18",
                 "mcp-session-id": a[i % 2].headers["mcp-session-id"]}
            codes.append(post(srv, h, {"jsonrpc": "2.0", "id": 5 + i, "method": "tools/call",
                                       "params": {"name": "tool_echo",
                                                  "arguments": {"text": "x"}}}).status_code)
        assert codes[:4] == [200] * 4 and 429 in codes[4:], codes


# ---------------------------------------------------------------- MCP Inspector's CLI
INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


@pytest.fixture(scope="session")
def inspector() -> str:
    """MCP Inspector's command (npm's package, installed once into the user's cache);
    skipped, saying why, on a machine without Node.js and npm or the npm registry."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("MCP Inspector runs on Node.js: node and npm are not installed")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    prefix = cache / "lcp-sandbox-tests" / INSPECTOR.replace("/", "+")
    command = prefix / "node_modules" / ".bin" / "mcp-inspector"
    if not command.exists():
        got = subprocess.run(["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                              "--ignore-scripts", INSPECTOR], capture_output=True, text=True,
                             timeout=600)
        if got.returncode != 0 or not command.exists():
            pytest.skip(f"npm could not install {INSPECTOR}: {got.stderr[-500:]}")
    return str(command)


def inspect(inspector: str, srv: Server, *args: str, token: str | None = None):
    headers = ["--header", f"Authorization: Bearer {token}"] if token else []
    return subprocess.run([inspector, "--cli", srv.url, "--transport", "http", *headers, *args],
                          capture_output=True, text=True, timeout=120)


def test_mcp_inspectors_cli_sends_the_users_token(server, issuer, inspector):
    """The Inspector's CLI with --header "Authorization: Bearer ...": the user's tools as
    the policy shows them, a call run as that user; without the header, the 401 sends it to
    sign in (OAuth, which it cannot do without a terminal)."""
    token = issuer.token("ivan", groups=["ops"])
    listed = inspect(inspector, server, "--method", "tools/list", token=token)
    assert listed.returncode == 0, listed.stderr
    assert [t["name"] for t in json.loads(listed.stdout)["tools"]] == ["tool_echo"]
    called = inspect(inspector, server, "--method", "tools/call", "--tool-name", "tool_echo",
                     "--tool-arg", "text=from the inspector", token=token)
    assert called.returncode == 0, called.stderr
    result = json.loads(called.stdout)
    assert result["isError"] is False and result["structuredContent"]["output"] == \
        "from the inspector"
    refused = inspect(inspector, server, "--method", "tools/list")
    assert refused.returncode != 0 and '"code":"auth_required"' in refused.stderr, refused.stderr
