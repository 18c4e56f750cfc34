"""``serve-mcp --transport http`` under load: caps, limits, refusals, numbers, spans.

Real servers on 127.0.0.1 (a free port each), driven by raw HTTP (httpx2, the
HTTP client the MCP SDK itself uses) and by the SDK's client.  Every flood is
bounded in count and time and ends by itself; nothing leaves the machine.
"""
from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import psutil
import pytest
from conftest import FIXTURES, poll, stop_server, wait_gone

pytest.importorskip("mcp")

import httpx2  # noqa: E402

from lcp_sandbox.backends.local.confine import disks  # noqa: E402

LIBS = FIXTURES / "mcp_load_libs"
SERVE = [sys.executable, "-m", "lcp_sandbox.fronts.cli", "serve-mcp"]
HTTP = ["--transport", "http", "--port", "0"]
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "load-test", "version": "1"}}}


@dataclass
class Server:
    url: str
    root: Path
    proc: subprocess.Popen

    @property
    def base(self) -> str:
        return self.url.rsplit("/", 1)[0]

    def workers(self) -> list[psutil.Process]:
        """The server's descendants: zygote, spares, templates and workers."""
        return psutil.Process(self.proc.pid).children(recursive=True)


@contextmanager
def serving(tmp_path: Path, *args: str, token: Optional[str] = None,
            folder: Path = LIBS) -> Iterator[Server]:
    root = tmp_path / "sessions"
    extra = list(args)
    if token:
        (tmp_path / "token").write_text(token)
        extra += ["--token-file", str(tmp_path / "token")]
    proc = subprocess.Popen([*SERVE, str(folder), *HTTP, "--workspace-root", str(root), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "serving http" in line:
                ready.set()
        ready.set()
    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.wait(60) and proc.poll() is None, "".join(lines)
        url = next(m.group(1) for line in lines if (m := re.search(r"serving (http://\S+)", line)))
        yield Server(url, root, proc)
    finally:
        stop_server(proc)


def open_session(c: httpx2.Client, srv: Server, headers: Optional[dict] = None) -> dict:
    """initialize + notifications/initialized: the headers of the new session."""
    r = c.post(srv.url, headers={**ACCEPT, **(headers or {})}, json=INIT)
    assert r.status_code == 200, (r.status_code, r.text)
    h = {**ACCEPT, **(headers or {}), "mcp-session-id": r.headers["mcp-session-id"]}
    c.post(srv.url, headers=h, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return h


def first_call(c: httpx2.Client, srv: Server, h: dict) -> Path:
    """The session's first tool call (tool_quick): the workspace folder it made (the one
    folder it added under the root: the folder's name is a hash, not the session id)."""
    before = set(os.listdir(srv.root)) if srv.root.exists() else set()
    assert result_of(call(c, srv, h, "tool_quick"))["result"]["isError"] is False
    made = [n for n in os.listdir(srv.root) if n not in before and (srv.root / n).is_dir()]
    assert len(made) == 1, made
    return srv.root / made[0]


def call(c: httpx2.Client, srv: Server, h: dict, tool: str, args: Optional[dict] = None,
         rid: int = 2) -> httpx2.Response:
    return c.post(srv.url, headers=h, json={"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                                            "params": {"name": tool, "arguments": args or {}}})


def result_of(r: httpx2.Response) -> dict:
    """The JSON-RPC message of a response (JSON, or the one SSE event)."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:] for line in r.text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])
    return r.json()


# ---------------------------------------------------------------- caps
def test_past_the_session_cap_a_new_session_gets_503_and_nothing_starts(tmp_path):
    with serving(tmp_path, "--max-sessions", "2") as srv, httpx2.Client(timeout=30) as c:
        held = [open_session(c, srv) for _ in range(2)]
        for h in held:
            assert result_of(call(c, srv, h, "tool_quick"))["result"]["isError"] is False
        before = {p.pid for p in srv.workers() if _works_in(p, srv.root)}
        assert len(before) == 2                                 # a worker each, in its workspace
        workspaces = sorted(p.name for p in srv.root.iterdir())
        r = c.post(srv.url, headers=ACCEPT, json=INIT)
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert "mcp-session-id" not in r.headers
        assert sorted(p.name for p in srv.root.iterdir()) == workspaces       # no workspace made
        assert {p.pid for p in srv.workers() if _works_in(p, srv.root)} == before   # none started
        c.delete(srv.url, headers=held[0])                                      # room again
        assert poll(lambda: c.post(srv.url, headers=ACCEPT, json=INIT).status_code == 200)


def test_an_idle_session_ends_and_its_workers_stop(tmp_path):
    with serving(tmp_path, "--session-idle-timeout", "1") as srv, httpx2.Client(timeout=30) as c:
        h = open_session(c, srv)
        workspace = first_call(c, srv, h)
        worker = next(p for p in srv.workers() if _works_in(p, srv.root))
        assert workspace.is_dir()
        assert wait_gone(worker.pid)
        assert call(c, srv, h, "tool_quick").status_code == 404             # the session is gone
        assert poll(lambda: not workspace.exists())                        # and its workspace


def _works_in(proc: psutil.Process, root: Path) -> bool:
    """Whether ``proc`` is a worker standing in a session's workspace under ``root``."""
    try:
        return proc.cwd().startswith(str(root))
    except psutil.Error:
        return False


def test_a_session_over_its_rate_gets_429_and_another_is_not_slowed(tmp_path):
    with serving(tmp_path, "--rate-limit", "2") as srv, httpx2.Client(timeout=30) as c:
        a, b = open_session(c, srv), open_session(c, srv)
        codes = [call(c, srv, a, "tool_quick", rid=i).status_code for i in range(12)]
        assert codes[0] == 200 and 429 in codes                 # a burst of 4, then the rate
        first = codes.index(429)
        assert all(code == 200 for code in codes[:first])
        r = call(c, srv, a, "tool_quick", rid=99)
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            err = r.json()["error"]
            assert err["code"] == -32029 and err["data"]["retryAfter"] >= 1
        assert call(c, srv, b, "tool_quick").status_code == 200     # b has a bucket of its own
        assert c.post(srv.url, headers=a, json={"jsonrpc": "2.0", "id": 7, "method": "tools/list"}
                      ).status_code == 200                          # only tools/call is metered


def test_over_stdio_a_call_over_the_rate_is_a_json_rpc_error_with_the_delay(tmp_path):
    """No HTTP status there: the call over the rate is refused with the JSON-RPC error
    the HTTP 429 carries, its data the delay; the session lives on."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.shared.exceptions import MCPError
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "lcp_sandbox.fronts.cli", "serve-mcp", str(LIBS), "--rate-limit", "1",
        "--workspace", str(tmp_path)])

    async def body() -> tuple:
        # errlog given: its default is whatever sys.stderr was when mcp.client.stdio was first
        # imported (a capturing test's stream, without a descriptor, in some orders)
        with (tmp_path / "server-stderr.log").open("w") as err:
            async with stdio_client(params, errlog=err) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                answered, refused = 0, []
                for _ in range(5):                      # a burst of 2, then 1 a second
                    try:
                        await session.call_tool("tool_quick", {})
                        answered += 1
                    except MCPError as exc:
                        refused.append(exc)
                listed = await session.list_tools()     # not metered
                return answered, refused, len(listed.tools)
    answered, refused, tools = anyio.run(body)
    assert answered >= 2 and refused and tools == 2
    assert refused[0].code == -32029 and refused[0].data["retryAfter"] >= 1


def test_one_sessions_flood_of_slow_calls_does_not_hold_up_another_session(tmp_path):
    release = tmp_path / "release"        # (outside the sessions' roots: unconfined workers)
    with serving(tmp_path, "--max-calls-per-session", "2", "--no-confine") as srv, \
            httpx2.Client(timeout=60) as c:
        a, b = open_session(c, srv), open_session(c, srv)
        answers: list = []

        def slow(i: int) -> None:
            with httpx2.Client(timeout=60) as own:
                answers.append(result_of(call(own, srv, a, "tool_held", {"release": str(release)},
                                              rid=100 + i)))
        threads = [threading.Thread(target=slow, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        quick = result_of(call(c, srv, b, "tool_quick"))
        assert quick["result"]["structuredContent"]["output"] == {"calls": 1}
        assert answers == []                     # a's calls were all still held meanwhile
        release.write_text("go")
        for t in threads:
            t.join(60)
        assert len(answers) == 10
        assert all(x["result"]["structuredContent"]["output"] == {"released": True} for x in answers)


# ---------------------------------------------------------------- floods
async def _client(url: str, tool: str, tally: dict) -> None:
    async with httpx2.AsyncClient(timeout=120) as c:
        try:
            r = await c.post(url, headers=ACCEPT, json=INIT)
            if r.status_code != 200:
                tally[f"initialize {r.status_code}"] = tally.get(f"initialize {r.status_code}", 0) + 1
                return
            h = {**ACCEPT, "mcp-session-id": r.headers["mcp-session-id"]}
            await c.post(url, headers=h, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            r = await c.post(url, headers=h, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                                   "params": {"name": tool, "arguments": {}}})
            tally[f"call {r.status_code}"] = tally.get(f"call {r.status_code}", 0) + 1
            await c.delete(url, headers=h)
        except httpx2.HTTPError as exc:                      # a dropped connection lands here
            tally[type(exc).__name__] = tally.get(type(exc).__name__, 0) + 1


def _uss(procs: list[psutil.Process]) -> int:
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().uss
        except psutil.Error:
            pass
    return total


def test_300_clients_at_once_are_all_answered_and_leave_nothing_behind(tmp_path):
    # 300 clients from one address: the per-client cap (64 by default) raised to let them in
    with serving(tmp_path, "--max-sessions-per-client", "400") as srv, \
            httpx2.Client(timeout=60) as c:
        warm = open_session(c, srv)                     # a session that lives through the flood
        warm_workspace = first_call(c, srv, warm)
        for _ in range(3):                              # the library's template is made by now
            h = open_session(c, srv)
            assert call(c, srv, h, "tool_quick").status_code == 200
            c.delete(srv.url, headers=h)
        in_root = lambda: [p for p in srv.workers() if _works_in(p, srv.root)]    # noqa: E731
        assert poll(lambda: len(in_root()) == 1)       # only the kept session's worker
        base = len(srv.workers())
        base_uss = _uss(srv.workers())
        tally: dict = {}

        async def flood() -> None:
            await asyncio.gather(*(_client(srv.url, "tool_quick", tally) for _ in range(300)))
        asyncio.run(asyncio.wait_for(flood(), 240))
        assert tally == {"call 200": 300}, tally
        assert result_of(call(c, srv, warm, "tool_quick", rid=5))["result"]["structuredContent"][
            "output"] == {"calls": 2}                      # the kept session kept its state
        assert poll(lambda: len(in_root()) == 1, 60), len(in_root())
        # The zygote and the library's template keep spares forked ahead, refilled a few ms
        # after each hand-out: one may be on its way when the baseline is read.
        assert poll(lambda: len(srv.workers()) <= base + 1, 60), (len(srv.workers()), base)
        assert _uss(srv.workers()) <= base_uss + 24 * 2**20
        assert poll(lambda: [p.name for p in srv.root.iterdir() if p.is_dir()] == [
            warm_workspace.name])                           # the ended sessions' workspaces: gone


def test_past_max_connections_clients_get_503_not_a_dropped_connection(tmp_path):
    """60 clients, each its own connection, against a server that takes 8 at once: every
    one gets an HTTP answer (uvicorn's 503 past the bound), none a dropped connection,
    and the session the server had is served once the flood has passed."""
    with serving(tmp_path, "--max-connections", "8") as srv, httpx2.Client(timeout=30) as c:
        kept = open_session(c, srv)
        assert call(c, srv, kept, "tool_quick").status_code == 200
        tally: dict = {}

        async def flood() -> None:
            await asyncio.gather(*(_client(srv.url, "tool_quick", tally) for _ in range(60)))
        asyncio.run(asyncio.wait_for(flood(), 240))
        assert set(tally) <= {"call 200", "initialize 503", "call 503"}, tally
        assert sum(tally.values()) == 60 and tally.get("initialize 503", 0) >= 1
        assert result_of(call(c, srv, kept, "tool_quick", rid=3))["result"][
            "structuredContent"]["output"] == {"calls": 2}


# ---------------------------------------------------------------- numbers
def test_metrics_are_prometheus_text_with_the_counts_of_the_calls_made(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families
    token = "metrics-token-0123456789"
    auth = {"Authorization": f"Bearer {token}"}
    with serving(tmp_path, "--metrics", "--rate-limit", "1", token=token) as srv, \
            httpx2.Client(timeout=30) as c:
        assert c.get(f"{srv.base}/metrics").status_code == 401
        h = open_session(c, srv, auth)
        codes = [call(c, srv, h, "tool_quick", rid=i).status_code for i in range(4)]
        assert codes[:2] == [200, 200] and 429 in codes
        r = c.get(f"{srv.base}/metrics", headers=auth)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for fam in text_string_to_metric_families(r.text) for s in fam.samples}
    ok = codes.count(200)
    assert samples[("lcp_sandbox_tool_calls_total",
                    (("library", "load"), ("status", "200"), ("tool", "tool_quick")))] == ok
    assert samples[("lcp_sandbox_tool_call_duration_seconds_count", ())] == ok
    assert samples[("lcp_sandbox_refusals_total", (("reason", "rate"),))] == codes.count(429)
    assert samples[("lcp_sandbox_sessions", ())] == 1
    assert samples[("lcp_sandbox_workers", (("state", "idle"),))] >= 1
    assert sum(v for (name, _), v in samples.items() if name == "lcp_sandbox_worker_starts_total") >= 1


def test_a_kept_alive_plain_http_client_is_answered_without_a_delayed_ack_stall(tmp_path):
    """Nagle on the server's socket held each SSE body behind its headers until the
    client's delayed ACK: 40 ms a call.  Warm calls here take a few ms."""
    with serving(tmp_path) as srv, httpx2.Client(timeout=30) as c:
        h = open_session(c, srv)
        times = []
        for i in range(15):
            t = time.perf_counter()
            assert call(c, srv, h, "tool_quick", rid=i).status_code == 200
            times.append(time.perf_counter() - t)
        assert sorted(times)[len(times) // 2] < 0.025, times


# ---------------------------------------------------------------- traces
def test_each_tool_call_is_a_span_under_the_sdks_request_span(tmp_path):
    """In-process server (the tracer provider is this process's): an SDK that records
    spans sees one per tools/call, a child of the MCP SDK's own span of the request."""
    import socket

    import uvicorn
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from lcp_sandbox import Supervisor
    from lcp_sandbox.fronts.mcp_server import McpFront, ServeOptions
    from lcp_sandbox.fronts.mcp_transports import MCP_PATH, http_app, transport_security

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    sup = Supervisor()
    front = McpFront(ServeOptions(folders=[str(LIBS)], workspace_root=str(tmp_path / "s")), sup)
    app = http_app(front, transport_security("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    srv = Server(f"http://127.0.0.1:{port}{MCP_PATH}", tmp_path / "s", None)   # type: ignore[arg-type]
    try:
        assert poll(lambda: server.started)
        with httpx2.Client(timeout=30) as c:
            h = open_session(c, srv)
            assert call(c, srv, h, "tool_quick").status_code == 200
    finally:
        server.should_exit = True
        thread.join(30)
        sup.close()
    spans = exporter.get_finished_spans()
    ours = [s for s in spans if s.name == "lcp_sandbox tool_quick"]
    assert len(ours) == 1
    attrs = dict(ours[0].attributes or {})
    assert attrs["lcp.library"] == "load" and attrs["lcp.tool"] == "tool_quick"
    assert attrs["lcp.status"] == 200 and attrs["lcp.tenant"].startswith("mcp-")
    assert attrs["lcp.worker_start"]                       # how its worker started
    parent = ours[0].parent
    assert parent is not None and any(s.context.span_id == parent.span_id for s in spans
                                      if s.name != ours[0].name)


# ---------------------------------------------------------------- what a session takes, it gives back
ROOT_HOST = pytest.mark.skipif(os.geteuid() != 0, reason="a uid per session needs a root host")
# A uid range of this test process's own (CI runs two suites at once; see test_tenant_uids).
UID_FIRST = 1_801_000_000 + os.getpid() % 997 * 1000


def _live_tenants(root: Path) -> set:
    """The tenants of the server of ``root`` that hold a uid, as the machine's uid record
    (the test run's: conftest.py) says."""
    from lcp_sandbox.backends.local.confine.uid_record import UidRecord
    with UidRecord(str(root)).locked() as rec:
        return {t for owner, t in rec.given if owner == f"root {os.path.realpath(root)}"}


def _host_state(root: Path) -> tuple:
    """What the host holds for the sessions under ``root``: folders (workspaces, disk
    images), mounts (/proc/self/mountinfo), loop devices (losetup), uids (the store)."""
    folders = sorted(p.name for p in root.iterdir() if p.name != ".lcp-sandbox-uids.jsonl")
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        mounts = sorted(line.split()[4] for line in f if line.split()[4].startswith(str(root)))
    loops = [line for line in subprocess.run(["losetup", "-a"], capture_output=True,
                                             text=True).stdout.splitlines() if str(root) in line]
    return folders, mounts, len(loops), sorted(_live_tenants(root))


def _uid_of(srv: Server, workspace: Path) -> int:
    """The uid the worker of the session of ``workspace`` runs as."""
    worker = next(p for p in srv.workers() if _works_in(p, workspace))
    return worker.uids().real


@ROOT_HOST
def test_with_a_uid_range_of_4_a_fifth_session_gets_a_uid_once_four_have_ended(tmp_path):
    """--uid-range FIRST 4: four sessions hold the four uids, a fifth's call is refused
    (503 naming uid_range); once the four have ended (DELETE), the fifth and a sixth get
    uids, of the range, and the four sessions' workspaces are gone."""
    with serving(tmp_path, "--uid-range", str(UID_FIRST), "4") as srv, \
            httpx2.Client(timeout=60) as c:
        four = [open_session(c, srv) for _ in range(4)]
        places = [first_call(c, srv, h) for h in four]
        uids = {_uid_of(srv, w) for w in places}
        assert uids == set(range(UID_FIRST, UID_FIRST + 4))
        workers = [p.pid for p in srv.workers() if _works_in(p, srv.root)]
        fifth = open_session(c, srv)
        before = set(os.listdir(srv.root))
        refused = result_of(call(c, srv, fifth, "tool_quick"))["result"]["structuredContent"]
        fifth_place = next(srv.root / n for n in os.listdir(srv.root) if n not in before)
        assert refused["status_code"] == 503 and "no uid left in uid_range" in refused["error"]
        for h in four:
            assert c.delete(srv.url, headers=h).status_code == 200
        assert all(wait_gone(pid) for pid in workers)
        assert poll(lambda: _live_tenants(srv.root) == set())          # the four gave theirs
        assert not any(w.exists() for w in places)
        assert result_of(call(c, srv, fifth, "tool_quick"))["result"]["isError"] is False
        assert _uid_of(srv, fifth_place) in uids
        assert _uid_of(srv, first_call(c, srv, open_session(c, srv))) in uids


@ROOT_HOST
def test_after_a_session_flood_uids_disks_and_workspaces_are_back_where_they_were(tmp_path):
    """Sessions with a disk each (disk_mb) and a uid range of 4, one kept through a flood
    of 24 sessions (6 at a time) that each call a tool and end: afterwards the host holds
    what it held before the flood (the kept session's workspace, disk image, mount, loop
    device and uid, nothing else), and new sessions are served."""
    (tmp_path / "config.json").write_text(json.dumps({"load": {"sandbox": {"disk_mb": 8}}}))
    with serving(tmp_path, "--uid-range", str(UID_FIRST + 100), "4", "--config",
                 str(tmp_path / "config.json")) as srv, httpx2.Client(timeout=60) as c:
        kept = open_session(c, srv)
        name = first_call(c, srv, kept).name
        before = _host_state(srv.root)
        # (the workspace is named by a keyed hash of the session id, never the id itself)
        assert kept["mcp-session-id"] not in name
        assert before == ([f".lcp-sandbox-disk-{name}.img", name], [str(srv.root / name)], 1,
                          [f"mcp-{name}"])
        tally: dict = {}

        async def flood() -> None:
            for _ in range(4):
                await asyncio.gather(*(_client(srv.url, "tool_quick", tally) for _ in range(6)))
        asyncio.run(asyncio.wait_for(flood(), 240))
        assert tally == {"call 200": 24}, tally
        assert poll(lambda: _host_state(srv.root) == before, 60), _host_state(srv.root)
        for _ in range(2):
            h = open_session(c, srv)
            assert result_of(call(c, srv, h, "tool_quick"))["result"]["isError"] is False
            c.delete(srv.url, headers=h)
        assert result_of(call(c, srv, kept, "tool_quick", rid=3))["result"][
            "structuredContent"]["output"] == {"calls": 2}          # the kept session's state


def test_sessions_are_capped_per_client_address(tmp_path):
    """--max-sessions-per-client 2, no token, behind a proxy on 127.0.0.1
    (--forwarded-allow-ips): a client address holding two sessions gets 429 with
    Retry-After for a third (nothing made), another address is served, and the first gets
    a session again once it has ended one.  (test_mcp_clients.py: who a client is.)"""
    first, second = {"X-Forwarded-For": "192.0.2.1"}, {"X-Forwarded-For": "192.0.2.2"}
    with serving(tmp_path, "--max-sessions-per-client", "2",
                 "--forwarded-allow-ips", "127.0.0.1") as srv, httpx2.Client(timeout=30) as c:
        held = [open_session(c, srv, first) for _ in range(2)]
        for h in held:
            assert call(c, srv, h, "tool_quick").status_code == 200
        made = sorted(p.name for p in srv.root.iterdir())
        r = c.post(srv.url, headers={**ACCEPT, **first}, json=INIT)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert "mcp-session-id" not in r.headers
        error = r.json()["error"]
        assert error["code"] == -32030 and "--max-sessions-per-client" in error["message"]
        assert sorted(p.name for p in srv.root.iterdir()) == made           # nothing made
        assert call(c, srv, open_session(c, srv, second), "tool_quick").status_code == 200
        c.delete(srv.url, headers=held[0])
        assert poll(lambda: c.post(srv.url, headers={**ACCEPT, **first},
                                   json=INIT).status_code == 200)


def test_with_a_token_the_token_is_the_client(tmp_path):
    """--max-sessions-per-client 1 with a bearer token: every holder of the token is one
    client, whatever its address."""
    auth = {"Authorization": "Bearer t0ken-for-the-cap"}
    with serving(tmp_path, "--max-sessions-per-client", "1", token="t0ken-for-the-cap") as srv, \
            httpx2.Client(timeout=30) as c, \
            httpx2.Client(timeout=30, transport=httpx2.HTTPTransport(
                local_address="127.0.0.2")) as other:
        open_session(c, srv, auth)
        r = other.post(srv.url, headers={**ACCEPT, **auth}, json=INIT)
        assert r.status_code == 429 and "--max-sessions-per-client" in r.json()["error"]["message"]


@ROOT_HOST
def test_a_killed_server_s_sessions_are_removed_by_the_next_one(tmp_path):
    """A server killed (SIGKILL) with live sessions ends none of them; the next server on
    the same workspace root removes them before it serves: their workspaces, disks (left
    mounted) and uids.  A server stopped with SIGTERM ends its sessions itself."""
    (tmp_path / "config.json").write_text(json.dumps({"load": {"sandbox": {"disk_mb": 8}}}))
    args = ("--uid-range", str(UID_FIRST + 200), "2", "--config", str(tmp_path / "config.json"))
    with serving(tmp_path, *args) as srv, httpx2.Client(timeout=60) as c:
        for _ in range(2):
            h = open_session(c, srv)
            assert result_of(call(c, srv, h, "tool_quick"))["result"]["isError"] is False
        left = _host_state(srv.root)
        assert len(left[0]) == 4 and len(left[1]) == 2 and len(left[3]) == 2, left
        srv.proc.kill()
        srv.proc.wait()
    try:
        with serving(tmp_path, *args) as srv, httpx2.Client(timeout=60) as c:
            assert _host_state(srv.root)[0:2] == ([], []) and _host_state(srv.root)[3] == []
            for _ in range(2):
                h = open_session(c, srv)
                assert result_of(call(c, srv, h, "tool_quick"))["result"]["isError"] is False
        assert _host_state(tmp_path / "sessions") == ([], [], 0, [])
    finally:
        for disk in disks.on_disk(str(tmp_path / "sessions")):     # (when the test failed)
            if disk["mounted"]:
                subprocess.run(["umount", "-l", disk["root"]])


# ---------------------------------------------------------------- the egress proxy's slots
EGRESS_LIBS = FIXTURES / "egress_libs"


class _LongPollServer(http.server.ThreadingHTTPServer):
    """Answers GET requests only once the test lets go (``release``), as a long poll does:
    it holds its end of each connection whatever the client does meanwhile; ``holding``
    counts the requests it got."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _LongPoll)
        self.lock = threading.Lock()
        self.holding = 0
        self.release = threading.Event()


class _LongPoll(http.server.BaseHTTPRequestHandler):
    server: _LongPollServer

    # (the base class's name)
    def do_GET(self) -> None:               # noqa: N802
        with self.server.lock:
            self.server.holding += 1
        self.server.release.wait(300)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def long_poll() -> Iterator[tuple[int, _LongPollServer]]:
    """A server on the host's loopback whose answers wait for the test's end."""
    server = _LongPollServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], server
    server.release.set()
    server.shutdown()
    server.server_close()


def _egress_open(c: httpx2.Client, srv: Server) -> tuple[int, int]:
    """(connections open through the server's egress proxy, tenants holding one), as its
    /metrics says."""
    from prometheus_client.parser import text_string_to_metric_families
    r = c.get(f"{srv.base}/metrics")
    assert r.status_code == 200, r.text
    got = {s.name: int(s.value) for fam in text_string_to_metric_families(r.text)
           for s in fam.samples}
    return got["lcp_sandbox_egress_open_connections"], got["lcp_sandbox_egress_open_tenants"]


def test_after_a_session_flood_the_egress_proxy_s_slots_are_back_where_they_were(
        tmp_path, long_poll):
    """A library allowed one loopback server, whose answers come late (a long poll).  A
    kept session holds 4 tunnels through the flood; 12 sessions at once each open 8 and
    keep them in their worker's module state, then end (DELETE) with all of them open.
    The host's proxy then counts what it counted before the flood (the kept session's 4,
    one tenant): an ended session's connections end with its workers, whatever the
    server beyond them does; new sessions get their tunnels, the kept one keeps its own."""
    port, server = long_poll
    config = {"netprobe": {"sandbox": {"network": {"allow": [f"127.0.0.1:{port}"]}}}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    hold = {"host": "127.0.0.1", "port": port, "path": "/hold"}
    with serving(tmp_path, "--metrics", "--config", str(tmp_path / "config.json"),
                 folder=EGRESS_LIBS) as srv, httpx2.Client(timeout=60) as c:
        kept = open_session(c, srv)
        assert result_of(call(c, srv, kept, "tool_hold", {**hold, "n": 4}))["result"][
            "structuredContent"]["output"] == {"opened": 4, "held": 4}
        before = _egress_open(c, srv)
        assert before == (4, 1)

        async def flood() -> list:
            async with httpx2.AsyncClient(timeout=120) as ac:
                async def session() -> tuple:
                    r = await ac.post(srv.url, headers=ACCEPT, json=INIT)
                    h = {**ACCEPT, "mcp-session-id": r.headers["mcp-session-id"]}
                    await ac.post(srv.url, headers=h, json={
                        "jsonrpc": "2.0", "method": "notifications/initialized"})
                    r = await ac.post(srv.url, headers=h, json={
                        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                        "params": {"name": "tool_hold", "arguments": {**hold, "n": 8}}})
                    return h, result_of(r)["result"]["structuredContent"]["output"]
                return await asyncio.gather(*(session() for _ in range(12)))
        sessions = asyncio.run(asyncio.wait_for(flood(), 240))
        assert [out for _, out in sessions] == [{"opened": 8, "held": 8}] * 12
        assert _egress_open(c, srv) == (4 + 12 * 8, 13)
        # every tunnel's request reached the server, which holds it unanswered
        assert poll(lambda: server.holding == 4 + 12 * 8), server.holding

        async def end() -> list:
            async with httpx2.AsyncClient(timeout=120) as ac:
                return await asyncio.gather(*(ac.delete(srv.url, headers=h)
                                              for h, _ in sessions))
        assert [r.status_code for r in asyncio.run(end())] == [200] * 12
        assert poll(lambda: _egress_open(c, srv) == before, 60), _egress_open(c, srv)
        for _ in range(2):
            h = open_session(c, srv)
            assert result_of(call(c, srv, h, "tool_hold", {**hold, "n": 8}))["result"][
                "structuredContent"]["output"] == {"opened": 8, "held": 8}
            assert _egress_open(c, srv) == (4 + 8, 2)
            assert c.delete(srv.url, headers=h).status_code == 200
            assert poll(lambda: _egress_open(c, srv) == before, 60), _egress_open(c, srv)
        # the kept session's worker, with its module state
        assert result_of(call(c, srv, kept, "tool_hold", {**hold, "n": 1}, rid=3))["result"][
            "structuredContent"]["output"] == {"opened": 1, "held": 5}
        assert _egress_open(c, srv) == (5, 1)
