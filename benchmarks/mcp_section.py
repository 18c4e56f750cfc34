"""MCP: a warm tools/call through ``serve-mcp`` beside a bare MCP SDK server, same run.

    servers  serve-mcp over the run's bench libraries (Streamable HTTP, 127.0.0.1);
             serve-mcp with users signed in (--auth-issuer: a local issuer, the tests' own,
             tests/support/issuer.py; every call carries an RS256 access token);
             a bare SDK server (mcp.server.mcpserver.MCPServer) exposing a function of the
             same name, tool_noop, returning the same {"ok": True}
             the floor of any server that runs tools out of its own process: the same bare
             server whose tool_noop first makes one round trip over a pipe to a process of
             its own (it echoes ~40 bytes); no engine, no checks
    warm     rounds x paths in random order, each a batch of calls on one session:
               sdk    the SDK's own client (ClientSession over streamable_http_client)
               plain  a plain kept-alive HTTP client (httpx2, as requests sessions, curl
                      and most HTTP stacks keep connections alive)
             on the four servers (token_*: the signed-in server, against ours_*; hop_*: the
             floor, against bare_*)
    sessions initialize + notifications/initialized + a first tools/call + DELETE, one
             session after another, until the last one is torn down (its workspace gone):
             sessions a second through serve-mcp; a 429 (the client's cap of live sessions,
             ended ones still torn down) asked again 20 ms later, counted
    metrics  one Metrics.call() (what the engine counts for every call) in a tight loop,
             against the run's warm engine call (the WARM section's sandbox p50)

Public surface only: the command line, HTTP, the SDK's client, backends.metrics.Metrics.
"""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from .harness import interleaved, paired_ratio, ratio, summarize

BARE = '''
import sys
from mcp.server.mcpserver import MCPServer
app = MCPServer("bare")

@app.tool()
def tool_noop() -> dict:
    return {"ok": True}

app.run("streamable-http", port=int(sys.argv[1]))
'''
# The floor: the bare server's tool asks a process of its own (HOP_CHILD) over a pipe first.
HOP_CHILD = "import os\nwhile b := os.read(0, 65536):\n    os.write(1, b)\n"
BARE_HOP = '''
import os, subprocess, sys, threading
from mcp.server.mcpserver import MCPServer
app = MCPServer("bare-hop")
child = subprocess.Popen([sys.executable, "-c", sys.argv[2]], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, bufsize=0)
lock = threading.Lock()

@app.tool()
def tool_noop() -> dict:
    with lock:
        os.write(child.stdin.fileno(), b'{"tool": "tool_noop", "params": {}, "cwd": "/"}')
        os.read(child.stdout.fileno(), 65536)
    return {"ok": True}

app.run("streamable-http", port=int(sys.argv[1]))
'''
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "bench", "version": "1"}}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(argv: list, ready: Callable[[str], bool], timeout: float = 60.0) -> tuple:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list = []
    up = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if ready(line):
                up.set()
        up.set()
    threading.Thread(target=pump, daemon=True).start()
    if not up.wait(timeout) or proc.poll() is not None:
        proc.kill()
        raise RuntimeError("server did not start: " + "".join(lines[-20:]))
    return proc, lines


def _plain_session(c: Any, url: str, auth: Optional[dict] = None,
                   refused: Optional[list] = None) -> dict:
    """A new session's headers (initialize, then notifications/initialized).  With
    ``refused``, a 429 (the client's cap) is asked again 20 ms later, and counted there."""
    while (r := c.post(url, headers={**ACCEPT, **(auth or {})}, json=INIT)).status_code == 429 \
            and refused is not None:
        refused.append(r)
        time.sleep(0.02)           # (its Retry-After says 5 s: asked sooner, to find the pace)
    h = {**ACCEPT, **(auth or {}), "mcp-session-id": r.headers["mcp-session-id"]}
    c.post(url, headers=h, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return h


def _plain_batch(c: Any, url: str, h: dict, n: int) -> list:
    out, clock = [], time.perf_counter_ns
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "tool_noop", "arguments": {}}}
    for _ in range(n):
        t0 = clock()
        r = c.post(url, headers=h, json=body)
        r.read()
        out.append(clock() - t0)
        if r.status_code != 200 or '"isError":false' not in r.text:
            raise RuntimeError(f"tools/call answered {r.status_code}: {r.text[:200]}")
    return out


def _sdk_batch(url: str, n: int, auth: Optional[dict] = None) -> list:
    """``n`` timed calls by the SDK's own client, on a session opened for the batch (its
    opening and a few untimed warm-up calls are left out: the worker is warm)."""
    import anyio
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def batch() -> list:
        out, clock = [], time.perf_counter_ns
        async with create_mcp_http_client(headers=auth) as http, \
                streamable_http_client(url, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                for _ in range(5):
                    await session.call_tool("tool_noop", {})
                for _ in range(n):
                    t0 = clock()
                    r = await session.call_tool("tool_noop", {})
                    out.append(clock() - t0)
                    if r.is_error:
                        raise RuntimeError(f"tools/call failed: {r}")
        return out
    return list(anyio.run(batch))


def run(ctx: Any, prog: Any) -> None:
    try:
        import httpx2
    except ImportError:
        ctx.skipped["mcp"] = "the mcp extra is not installed (pip install 'lcp-sandbox[mcp]')"
        return
    cfg = ctx.cfg
    tmp = Path(tempfile.mkdtemp(prefix="bench-mcp-", dir=ctx.tmp))
    procs: list = []
    clients: list = []
    closers: list = []
    try:
        ours = _serve_ours(ctx, tmp)
        procs.append(ours[0])
        bare = _serve_bare()
        procs.append(bare[0])
        hop = _serve_bare(BARE_HOP, HOP_CHILD)
        procs.append(hop[0])
        urls = {"ours": ours[1], "bare": bare[1], "hop": hop[1]}
        auths: dict[str, Optional[dict]] = {"ours": None, "bare": None, "hop": None}
        signed = _serve_signed_in(ctx, tmp, closers)
        if signed is not None:
            procs.append(signed[0])
            urls["token"], auths["token"] = signed[1], signed[2]
        plain = httpx2.Client(timeout=30)
        clients.append(plain)
        heads = {k: _plain_session(plain, u, auths[k]) for k, u in urls.items()}
        paths: dict[str, Callable[[int], list]] = {}
        for k, u in urls.items():
            paths[f"{k}_plain"] = (lambda n, u=u, h=heads[k]: _plain_batch(plain, u, h, n))
            paths[f"{k}_sdk"] = (lambda n, u=u, a=auths[k]: _sdk_batch(u, n, a))
        for fn in paths.values():
            fn(20)                                            # warm-up
        rounds = max(1, cfg.mcp_rounds)
        samples, per_round = interleaved(
            {k: (lambda fn=fn: fn(cfg.mcp_calls)) for k, fn in paths.items()}, rounds, ctx.rng,
            lambda r: prog.step("mcp", f"warm round {r + 1}/{rounds}"))
        warm = {k: summarize(xs, 1e6) for k, xs in samples.items()}       # milliseconds
        for client in ("plain", "sdk"):
            row = warm[f"ours_{client}"]
            row["x_bare_p50"] = ratio(row.get("p50"), warm[f"bare_{client}"].get("p50"))
            row["x_bare_p50_paired"] = paired_ratio(per_round[f"ours_{client}"],
                                                    per_round[f"bare_{client}"])
            floor = warm[f"hop_{client}"]
            floor["x_bare_p50"] = ratio(floor.get("p50"), warm[f"bare_{client}"].get("p50"))
            floor["x_bare_p50_paired"] = paired_ratio(per_round[f"hop_{client}"],
                                                      per_round[f"bare_{client}"])
            if f"token_{client}" in warm:
                tok = warm[f"token_{client}"]
                tok["x_ours_p50"] = ratio(tok.get("p50"), row.get("p50"))
                tok["x_ours_p50_paired"] = paired_ratio(per_round[f"token_{client}"],
                                                        per_round[f"ours_{client}"])
        sessions = _sessions_per_s(plain, urls["ours"], cfg.mcp_sessions, tmp / "ws")
        prog.step("mcp", "sessions")
        ctx.result["mcp"] = {"warm_ms": warm, "sessions_per_s": sessions,
                             "metrics": _metrics_cost(ctx)}
    finally:
        for c in clients:
            try:
                c.close()
            except Exception:                                # noqa: BLE001
                pass
        for p in procs:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for close in closers:
            close()


def _serve_ours(ctx: Any, tmp: Path, folder: str = "ws", *extra: str,
                timeout: float = 60.0) -> tuple:
    """serve-mcp over the run's libraries on 127.0.0.1, its sessions in ``tmp``'s folder
    ``folder``, with ``extra`` flags: (proc, its /mcp URL)."""
    proc, lines = _start([sys.executable, "-m", "lcp_sandbox.fronts.cli", "serve-mcp",
                          str(ctx.libs), "--transport", "http", "--port", "0",
                          "--workspace-root", str(tmp / folder), *extra],
                         lambda line: "serving http" in line, timeout)
    url = next(m.group(1) for line in lines if (m := re.search(r"serving (http://\S+)", line)))
    return proc, url


def _serve_signed_in(ctx: Any, tmp: Path, closers: list) -> Optional[tuple]:
    """serve-mcp checking tokens of a local issuer (the tests' own, on 127.0.0.1): (proc,
    url, the Authorization header of a token), or None (noted in ctx.skipped) without
    PyJWT or the checkout's tests folder."""
    try:
        from tests.support.issuer import AUDIENCE, Issuer
    except ImportError as exc:
        ctx.skipped["mcp_token"] = f"no local issuer: {exc}"
        return None
    issuer = Issuer().start()
    closers.append(issuer.stop)
    proc, url = _serve_ours(ctx, tmp, "ws-token", "--auth-issuer", issuer.url,
                            "--auth-audience", AUDIENCE)
    return proc, url, {"Authorization": f"Bearer {issuer.token('bench')}"}


def _serve_bare(source: str = BARE, *args: str) -> tuple:
    port = _free_port()
    proc, _ = _start([sys.executable, "-c", source, str(port), *args],
                     lambda line: "Uvicorn running" in line or "startup complete" in line)
    return proc, f"http://127.0.0.1:{port}/mcp"


def _sessions_per_s(c: Any, url: str, n: int, root: Path) -> dict:
    """``n`` sessions one after another (initialize, a first call, DELETE), until the server
    has torn the last one down (their workspaces under ``root`` gone: workers stopped, uids
    swept).  A 429 (this client holds its cap of live sessions, ended ones still being
    torn down) is asked again 20 ms later, counted: the pace is the server's own."""
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "tool_noop", "arguments": {}}}
    refused: list = []
    # (the warm section's sessions are live: their workspaces stay)
    before = set(root.iterdir())
    t0 = time.perf_counter()
    for _ in range(n):
        h = _plain_session(c, url, refused=refused)
        r = c.post(url, headers=h, json=body)
        if r.status_code != 200:
            raise RuntimeError(f"first tools/call answered {r.status_code}")
        c.delete(url, headers=h)
    opened = time.perf_counter() - t0
    deadline = time.monotonic() + 120
    while set(root.iterdir()) - before and time.monotonic() < deadline:
        time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    return {"sessions": n, "seconds": elapsed, "per_s": n / elapsed, "opened_s": opened,
            "refused_429": len(refused)}


def _metrics_cost(ctx: Any, n: int = 200_000) -> dict:
    from lcp_sandbox.backends.metrics import Metrics
    m = Metrics()
    call, clock = m.call, time.perf_counter_ns
    t0 = clock()
    for _ in range(n):
        call("bench_noop", "tool_noop", 200, 0.00003)
    per_call_us = (clock() - t0) / n / 1e3
    warm = ctx.result.get("warm", {}).get(ctx.headline, {}).get("sandbox", {}).get("p50")
    return {"per_call_us": per_call_us, "warm_p50_us": warm,
            "share_of_warm_call": (per_call_us / warm) if warm else None}
