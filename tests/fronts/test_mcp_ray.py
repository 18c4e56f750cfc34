"""``serve-mcp --ray``: the sessions' workers on the nodes of the session's local Ray cluster
(tests/conftest.py: a head and a node; a third node joins for this module and is killed by
its last test), driven by the MCP SDK's client over Streamable HTTP: sessions spread over the
nodes, a cancelled call stopped on its node, a server killed and started again, a node lost,
two signed-in users.

Workers are found as the host sees them (psutil): the processes standing in a session's
workspace, and the node each runs on by the raylet it descends from.  The servers and
helpers are the other MCP tests' (test_mcp_load, test_mcp_server, test_mcp_signin).
"""
from __future__ import annotations

import importlib.util
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import _RAY_ROOTS, FIXTURES, poll, spinning, wait_gone

pytest.importorskip("mcp")

import anyio  # noqa: E402
import httpx2  # noqa: E402
import mcp_types as types  # noqa: E402
from test_mcp_load import SERVE, _live_tenants, serving  # noqa: E402
from test_mcp_server import TOKEN, http_session  # noqa: E402

pytestmark = [pytest.mark.ray,
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="the ray extra is not installed")]

FRONT_LIBS = FIXTURES / "mcp_front_libs"
ALLOW = types.ElicitResult(action="accept", content={"decision": "allow"})


@pytest.fixture(scope="module")
def node3(ray_cluster):
    """A third node of the session's cluster, for this module (its last test kills it)."""
    before = {p.pid for p in psutil.Process().children()}
    node = ray_cluster.add_node(num_cpus=1)
    ray_cluster.wait_for_nodes()
    _RAY_ROOTS.update({p.pid for p in psutil.Process().children()} - before)
    yield node
    if node in ray_cluster.worker_nodes:
        ray_cluster.remove_node(node)


SPIN = '''
import time


def tool_spin(seconds: float = 20.0) -> dict:
    """Spins the CPU; it ends by itself after ``seconds`` (20 at most).

    Args:
        seconds (float): how long to spin
    """
    end = time.monotonic() + min(float(seconds), 20.0)
    n = 0
    while time.monotonic() < end:
        n += 1
    return {"success": True, "output": n}
'''


@pytest.fixture(scope="module")
def front_libs(open_tmp_module) -> Path:
    """The MCP front's libraries and a busy one (tool_spin), where every uid may read them."""
    folder = open_tmp_module / "libs"
    shutil.copytree(FRONT_LIBS, folder)
    (folder / "spin").mkdir()
    (folder / "spin" / "spin.py").write_text(SPIN)
    return folder


@pytest.fixture(scope="module")
def srv(ray_cluster, node3, front_libs, tmp_path_factory):
    with serving(tmp_path_factory.mktemp("ray_front"), "--ray", ray_cluster.address, "--metrics",
                 "--timeout", "60", token=TOKEN, folder=front_libs) as server:
        yield server


def raylets(cluster) -> dict:
    """The raylet pid of each node of the cluster: node id -> pid."""
    return {n.node_id: n.all_processes["raylet"][0].process.pid for n in cluster.list_all_nodes()}


def node_of(proc: psutil.Process, cluster) -> str:
    """The node a process runs on: the raylet it descends from."""
    by_pid = {pid: nid for nid, pid in raylets(cluster).items()}
    return next(by_pid[p.pid] for p in proc.parents() if p.pid in by_pid)


def workers_in(folder: Path) -> list:
    """The processes standing in ``folder`` (a session's workspace): its workers."""
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.cwd() == str(folder):
                out.append(proc)
        except psutil.Error:
            pass
    return out


async def first_calls(session, root: Path) -> tuple:
    """A session's first call (tool_count): (its workspace, its worker) as the host sees them."""
    before = set(root.iterdir()) if root.exists() else set()
    r = await session.call_tool("tool_count", {})
    assert not r.is_error and r.structured_content["output"]["counter"] == 1, r
    [workspace] = [p for p in root.iterdir() if p not in before and p.is_dir()]
    [worker] = workers_in(workspace)
    return workspace, worker


async def counter(session) -> int:
    r = await session.call_tool("tool_count", {})
    assert not r.is_error, r
    return r.structured_content["output"]["counter"]


def test_sessions_spread_over_the_nodes_elicit_through_them_and_leave_nothing(srv, ray_cluster):
    """Three sessions land on the three nodes (a worker each, found by the host); each one's
    confirmation reaches its client as an elicitation; /metrics labels calls by node and
    /healthz answers; a session's end leaves no worker, workspace or uid on any node."""
    asked = []

    async def allow(context, params):
        asked.append(params.message)
        return ALLOW

    async def body():
        from contextlib import AsyncExitStack
        async with AsyncExitStack() as stack:
            sessions = [await stack.enter_async_context(http_session(srv, elicitation_callback=allow))
                        for _ in range(3)]
            placed = [await first_calls(s, srv.root) for s in sessions]
            for s in sessions:
                r = await s.call_tool("tool_guarded", {"action": "deploy"})
                assert not r.is_error and r.structured_content["output"]["decision"] == "allow", r
                assert await counter(s) == 2                       # module state kept on its node
            assert _live_tenants(srv.root) == {f"mcp-{w.name}" for w, _ in placed}
            assert {node_of(p, ray_cluster) for _, p in placed} == set(raylets(ray_cluster))
            return placed
    placed = anyio.run(body)
    assert len(asked) == 3 and all("deploy" in m for m in asked)
    assert all(wait_gone(p.pid) for _, p in placed)
    assert poll(lambda: not any(w.exists() for w, _ in placed) and _live_tenants(srv.root) == set())
    with httpx2.Client(timeout=30) as c:
        assert c.get(f"{srv.base}/healthz").text == "ok\n"
        text = c.get(f"{srv.base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    from prometheus_client.parser import text_string_to_metric_families
    calls = [s for fam in text_string_to_metric_families(text) for s in fam.samples
             if s.name == "lcp_sandbox_tool_calls_total" and s.labels["tool"] == "tool_count"]
    assert {s.labels["node"] for s in calls} == set(raylets(ray_cluster))
    assert sum(s.value for s in calls) == 6


def test_a_cancelled_call_stops_on_its_remote_node(srv, ray_cluster):
    """A session's busy call, cancelled by the client (notifications/cancelled): the worker
    spinning on its node (found by the host: the process in the session's workspace that
    burns CPU) stops long before the tool would end by itself; the session goes on, on the
    same worker."""
    async def body():
        async with http_session(srv) as s:
            workspace, counting = await first_calls(s, srv.root)
            async with anyio.create_task_group() as tg:
                tg.start_soon(s.call_tool, "tool_spin", {"seconds": 20})
                found = []

                def spinner() -> bool:
                    found[:] = [p for p in workers_in(workspace) if p.pid != counting.pid and spinning(p.pid, 0.1)]
                    return bool(found)
                assert await anyio.to_thread.run_sync(poll, spinner), "no worker spins"
                start = time.monotonic()
                tg.cancel_scope.cancel()                  # the client sends notifications/cancelled
            stopped = await anyio.to_thread.run_sync(poll, lambda: not spinning(found[0].pid), 10)
            assert stopped and time.monotonic() - start < 10, "the cancelled call ran on"
            assert node_of(found[0], ray_cluster) in raylets(ray_cluster)
            assert await counter(s) == 2                  # the session goes on
            r = await s.call_tool("tool_spin", {"seconds": 0.01})
            assert not r.is_error and found[0].is_running() and spinning(found[0].pid) is False
            return workspace
    workspace = anyio.run(body)
    assert poll(lambda: not workspace.exists())


def test_a_server_killed_and_started_again_sweeps_what_it_left_on_every_node(ray_cluster, node3, front_libs, tmp_path):
    """A server with three sessions (over the nodes) is killed (SIGKILL: it ends nothing);
    the next one on the same --workspace-root removes what it left at its start, on every
    node: no worker (found by the host before the kill: the processes in the workspaces),
    no uid in the record, no workspace; it serves a fresh session, and SIGTERM ends it
    leaving nothing."""
    args = ("--ray", ray_cluster.address, "--timeout", "60")
    with serving(tmp_path, *args, token=TOKEN, folder=front_libs) as first:
        held: dict = {}

        async def three():
            from contextlib import AsyncExitStack
            async with AsyncExitStack() as stack:
                sessions = [await stack.enter_async_context(http_session(first)) for _ in range(3)]
                held["placed"] = placed = [await first_calls(s, first.root) for s in sessions]
                held["nodes"] = {node_of(p, ray_cluster) for _, p in placed}
                held["tenants"] = _live_tenants(first.root)
                first.proc.send_signal(signal.SIGKILL)       # with the sessions open
                await anyio.to_thread.run_sync(first.proc.wait, 60)
        try:
            anyio.run(three)
        except Exception:                                    # noqa: BLE001 (the sessions' ends find no server)
            pass
        placed = held["placed"]
        assert len(held["nodes"]) == 3 and held["tenants"] == {f"mcp-{w.name}" for w, _ in placed}
    assert first.proc.returncode == -signal.SIGKILL
    left = [p for _, p in placed if p.is_running()]
    assert all(w.exists() for w, _ in placed) and _live_tenants(first.root) == held["tenants"]
    with serving(tmp_path, *args, token=TOKEN, folder=front_libs) as again:
        assert all(wait_gone(p.pid) for p in left)
        assert poll(lambda: _live_tenants(again.root) == set() and not any(w.exists() for w, _ in placed))

        async def fresh():
            async with http_session(again) as s:
                return await first_calls(s, again.root)
        workspace, worker = anyio.run(fresh)
        assert worker.pid not in {p.pid for _, p in placed}
        assert poll(lambda: not workspace.exists() and _live_tenants(again.root) == set())
        again.proc.terminate()
        assert again.proc.wait(60) == 0
    assert wait_gone(worker.pid) and [p for p in again.root.iterdir() if p.is_dir()] == []


def test_without_ray_or_with_a_flag_ray_cannot_honour_the_server_exits_2(tmp_path):
    blocked = ("import sys, runpy; sys.modules['ray'] = None; sys.argv[0] = 'lcp-sandbox'; "
               "runpy.run_module('lcp_sandbox.fronts.cli', run_name='__main__')")
    common = ["serve-mcp", str(FRONT_LIBS), "--transport", "http", "--port", "0", "--ray", "auto",
              "--workspace-root", str(tmp_path / "s")]
    p = subprocess.run([sys.executable, "-c", blocked, *common], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--ray needs the 'ray' package" in p.stderr and "lcp-sandbox[ray]" in p.stderr
    for flag, said in ((["--max-workers", "4"], "--max-workers cannot be honoured with --ray"),):
        p = subprocess.run([*SERVE, *common[1:], *flag], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and said in p.stderr, p.stderr
    assert not (tmp_path / "s").exists()


def test_a_node_killed_under_a_running_call_and_an_idle_one(srv, ray_cluster, node3):
    """Six sessions, two per node.  The third node dies while one of its sessions' calls runs
    (the call answers an error naming the node and the retry) and while the other is idle;
    the next call of each starts fresh on a live node; the sessions on other nodes keep
    their state, one of them through a call that ran across the loss."""
    doomed = node3.node_id

    async def body():
        from contextlib import AsyncExitStack
        async with AsyncExitStack() as stack:
            sessions = [await stack.enter_async_context(http_session(srv)) for _ in range(6)]
            placed = [await first_calls(s, srv.root) for s in sessions]
            where = [node_of(p, ray_cluster) for _, p in placed]
            on3 = [s for s, n in zip(sessions, where, strict=True) if n == doomed]
            kept = [s for s, n in zip(sessions, where, strict=True) if n != doomed]
            assert len(on3) == 2 and len(kept) == 4, where
            running, idle = on3
            started, out = anyio.Event(), {}

            async def progress(*_):
                started.set()

            async def wait(session, key, seconds):
                out[key] = await session.call_tool("tool_wait", {"seconds": seconds},
                                                   progress_callback=progress if key == "lost" else None)
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait, running, "lost", 60)
                tg.start_soon(wait, kept[0], "across", 3)
                await started.wait()
                await anyio.to_thread.run_sync(ray_cluster.remove_node, node3)
            lost = out["lost"]
            assert lost.is_error and lost.structured_content["status_code"] == 503, lost
            error = lost.structured_content["error"]
            assert f"Ray node {doomed}" in error and "retry" in error, error
            assert out["across"].structured_content["output"] == "waited"
            assert [await counter(s) for s in (running, idle)] == [1, 1]      # fresh, on a live node
            assert [await counter(s) for s in kept] == [2, 2, 2, 2]
            for (workspace, _), s in zip(placed, sessions, strict=True):
                if s in on3:
                    [worker] = workers_in(workspace)
                    assert node_of(worker, ray_cluster) in raylets(ray_cluster)
            return [w for w, _ in placed]
    workspaces = anyio.run(body)
    assert poll(lambda: not any(w.exists() for w in workspaces) and _live_tenants(srv.root) == set())


def test_two_signed_in_users_at_once_each_one_tenant_freed_when_idle_and_at_sigterm(ray_cluster, tmp_path):
    """alice (two sessions at once: one tenant, on one node) and bob (his own tenant) sign in
    with tokens; alice's tenant, idle past --tenant-idle-timeout, is removed from its node;
    bob's, live when the server gets SIGTERM, is removed by the server's end."""
    pytest.importorskip("jwt")
    from support.issuer import Issuer
    from test_mcp_signin import serving as signed_in
    from test_mcp_signin import session_of
    issuer = Issuer().start()
    try:
        with signed_in(tmp_path, issuer, "--ray", ray_cluster.address, "--tenant-idle-timeout", "2") as srv:
            async def both():
                alice, bob = issuer.token(sub="alice"), issuer.token(sub="bob")
                async with session_of(srv, alice) as a1, session_of(srv, alice) as a2, session_of(srv, bob) as b:
                    return [await counter(a1), await counter(a2), await counter(b), await counter(a1)]
            seen = anyio.run(both)
            assert seen == [1, 2, 1, 3]                   # alice's two sessions share one tenant's state
            tenants = _live_tenants(srv.root)
            assert len(tenants) == 2
            assert poll(lambda: len(_live_tenants(srv.root)) == 0, 30)           # both idle: removed
            assert any("idle, removed" in line for line in srv.log)

            held: dict = {}

            async def bob_again():
                try:
                    async with session_of(srv, issuer.token(sub="bob")) as b:
                        assert await counter(b) == 1      # a fresh tenant after the removal
                        held["workspaces"] = [p for p in srv.root.iterdir() if p.is_dir()]
                        held["workers"] = [w for p in held["workspaces"] for w in workers_in(p)]
                        srv.proc.terminate()              # SIGTERM with bob's session open
                        await anyio.to_thread.run_sync(srv.proc.wait, 60)
                except Exception:                         # noqa: BLE001 (the session's end finds no server)
                    pass
            anyio.run(bob_again)
            assert len(held["workers"]) == 1 and srv.proc.returncode == 0
        assert wait_gone(held["workers"][0].pid)            # the server's end freed bob's tenant
        bob_workspaces = held["workspaces"]
        assert not any(p.exists() for p in bob_workspaces) and _live_tenants(srv.root) == set()
    finally:
        issuer.stop()


def test_a_cancel_leaves_the_interrupt_s_round_trip_off_the_event_loop():
    """Over Ray an interrupt is a round trip to the call's node (up to 10 s to a node that
    does not answer): the front's cancel sends it from a thread, its event loop never waits."""
    from types import SimpleNamespace

    from lcp_sandbox.fronts.mcp_calls import ToolCall
    asked, release = threading.Event(), threading.Event()

    def interrupt(thread: int) -> bool:
        asked.set()
        release.wait(5)                           # a node slow to answer
        return True
    session = SimpleNamespace(binding=SimpleNamespace(interrupt=interrupt), closed=False, workspace="")
    ctx = SimpleNamespace(params={}, session=SimpleNamespace(client_capabilities=None, can_send_request=False))

    async def body():
        call = ToolCall(session, ctx)
        call.thread = threading.get_ident()       # a call running on some thread
        start = time.monotonic()
        call.cancel()
        return time.monotonic() - start
    took = anyio.run(body)
    try:
        assert took < 1 and asked.wait(10)        # sent, not waited for
    finally:
        release.set()
