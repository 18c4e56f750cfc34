"""What only the Ray backend has: placement over nodes, per-node stats, a workspace
missing on its node, a node lost and a library's environment built on its node (each on a
third node added to the session's cluster for the purpose, so the shared head and node stay
up), and an interrupt relayed to the node running the call."""
import importlib.util
import os
import re
import subprocess
import sys
import threading
import time

import psutil
import pytest
from conftest import _RAY_ROOTS, FIXTURES, spinning, wait_gone

from lcp_sandbox import SandboxedBinding, Supervisor

pytestmark = [pytest.mark.ray,
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="the ray extra is not installed")]


def live_nodes() -> set:
    import ray
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


@pytest.fixture
def ray_sup(ray_cluster):
    """A RaySupervisor of the test's own (its slot counts start at zero)."""
    from lcp_sandbox import RaySupervisor
    sup = RaySupervisor()
    sup.start()
    yield sup
    sup.close()


def bindings(sup, libs, tmp_path, n: int, prefix: str) -> list:
    return [SandboxedBinding(tools_folders=[libs], workspace=str(tmp_path), supervisor=sup, tenant=f"{prefix}{i}")
            for i in range(n)]


def test_importing_lcp_sandbox_does_not_import_ray():
    code = ("import sys, lcp_sandbox; lcp_sandbox.SandboxedBinding, lcp_sandbox.Supervisor, lcp_sandbox.RaySupervisor; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_ray_supervisor_is_a_backend(ray_sup):
    from lcp_sandbox.backends.base import Backend
    assert isinstance(ray_sup, Backend)


def test_eight_tenants_are_placed_over_both_nodes_and_stay(ray_sup, libs, tmp_path):
    bs = bindings(ray_sup, libs, tmp_path, 8, "spread")
    assert [b.execute_tool("tool_increment", {})["output"] for b in bs] == [1] * 8
    rows = {b.tenant: b.stats()[0] for b in bs}
    nodes = live_nodes()
    assert len(nodes) == 2 and {r["node"] for r in rows.values()} == nodes
    assert sorted(sum(r["node"] == n for r in rows.values()) for n in nodes) == [4, 4]   # least loaded first
    pool = ray_sup.pool_stats()
    assert set(pool["nodes"]) == nodes and all(v["slots"] == 4 for v in pool["nodes"].values())
    assert pool["live_workers"] == 8 and pool["tenants"]["spread0"] == {"live_workers": 1, "waiting": 0, "calls": 1}
    # a slot stays on its node, with its worker and its state
    assert [b.execute_tool("tool_increment", {})["output"] for b in bs] == [2] * 8
    again = {b.tenant: b.stats()[0] for b in bs}
    assert all((again[t]["node"], again[t]["pid"]) == (r["node"], r["pid"]) for t, r in rows.items())
    for b in bs:
        b.close()
    assert ray_sup.pool_stats()["live_workers"] == 0


def test_a_workspace_missing_on_its_node_is_refused(ray_sup, libs, tmp_path):
    ws = tmp_path / "shared"
    (b,) = bindings(ray_sup, libs, tmp_path, 1, "ws")
    assert b.execute_tool("tool_whoami", {}, workspace=str(ws))["output"]["cwd"] == str(ws)   # made by the binding
    node = b.stats()[0]["node"]
    ws.rmdir()                      # gone from the node's view (the binding, having seen it, does not look again)
    r = b.execute_tool("tool_whoami", {}, workspace=str(ws))
    assert r["status_code"] == 500 and r["success"] is False
    assert f"[stateful] tool 'tool_whoami' not run: its workspace {str(ws)!r} does not exist on node {node}" in r["error"]
    assert "shares" in r["error"] and not ws.exists()
    assert b.stats()[0]["calls"] == 1
    b.close()


def test_sandbox_events_reach_the_caller_as_the_node_built_them(ray_sup, libs, tmp_path):
    """The same faults (a crash loop into quarantine, an exit, a timeout) give the same
    result dicts through a local Supervisor and through Ray."""
    local = Supervisor()
    out = {}
    try:
        for kind, sup in (("local", local), ("ray", ray_sup)):
            b = SandboxedBinding(tools_folders=[FIXTURES / "crashlibs", libs], workspace=str(tmp_path), supervisor=sup,
                                 tenant="events", timeout_s=5)
            out[kind] = [b.execute_tool("tool_never", {}) for _ in range(6)]
            out[kind] += [b.execute_tool("tool_os_exit", {"code": 3}),
                          b.execute_tool("tool_busy", {"seconds": 30}, timeout_s=0.3)]
            b.close()
    finally:
        local.close()

    def same(r):                                    # the quarantine's remaining seconds may differ
        return {k: re.sub(r"retried in \d+ s", "retried in N s", v) if isinstance(v, str) else v for k, v in r.items()}
    assert [r["status_code"] for r in out["ray"]] == [500] * 5 + [503, 500, 504]
    assert [same(r) for r in out["ray"]] == [same(r) for r in out["local"]]
    assert "quarantined" in out["ray"][5]["error"] and "exited with code 3" in out["ray"][6]["error"]


def _busy(b) -> bool:
    return any(r["state"] == "busy" for r in b.stats())


def wait_until(cond, what: str, tries: int = 2000) -> None:
    """Poll ``cond`` (each try is a Ray round trip); no timing is asserted."""
    for _ in range(tries):
        if cond():
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"never happened: {what}")


def test_node_lost_503_then_replaced_others_undisturbed(ray_cluster, libs, tmp_path):
    """A third node joins; six tenants spread two per node; the third node dies while a
    call runs on each of its slots: those calls get 503 naming the node, the next call
    of each starts a fresh worker on a live node (init again, restarts counted), and the
    calls and state of the other nodes' slots are untouched."""
    from lcp_sandbox import RaySupervisor
    before = {p.pid for p in psutil.Process().children()}
    node3 = ray_cluster.add_node(num_cpus=1)
    ray_cluster.wait_for_nodes()
    _RAY_ROOTS.update({p.pid for p in psutil.Process().children()} - before)
    sup = RaySupervisor()
    try:
        sup.start()
        bs = bindings(sup, libs, tmp_path, 6, "loss")
        assert [b.execute_tool("tool_increment", {})["output"] for b in bs] == [1] * 6
        where = {b.tenant: b.stats()[0]["node"] for b in bs}
        lost_id = node3.node_id
        doomed = [b for b in bs if where[b.tenant] == lost_id]
        kept = [b for b in bs if where[b.tenant] != lost_id]
        assert len(doomed) == 2 and len(kept) == 4

        flag = tmp_path / "flag"
        results: dict = {}

        def wait_call(b):
            results[b.tenant] = b.execute_tool("tool_wait_for", {"path": str(flag), "seconds": 60})
        threads = [threading.Thread(target=wait_call, args=(b,)) for b in doomed + kept[:1]]
        [t.start() for t in threads]
        for b in doomed + kept[:1]:
            wait_until(lambda b=b: _busy(b), f"{b.tenant}'s call running")
        ray_cluster.remove_node(node3)
        for b in doomed:
            threads[doomed.index(b)].join(90)
            r = results[b.tenant]
            assert r["status_code"] == 503, r
            assert f"Ray node {lost_id}" in r["error"] and "was lost" in r["error"] and "tool_wait_for" in r["error"]
        flag.write_text("x")                   # the call on a live node was not disturbed
        threads[-1].join(90)
        assert results[kept[0].tenant] == {"output": str(tmp_path), "status_code": 200, "success": True}
        assert [b.execute_tool("tool_increment", {})["output"] for b in kept] == [2] * 4
        for b in doomed:                       # placed again, on a live node, a fresh worker
            who = b.execute_tool("tool_whoami", {})
            assert who["success"] and who["output"]["init_calls"] == 1, who
            assert b.execute_tool("tool_increment", {})["output"] == 1
            row = b.stats()[0]
            assert row["node"] in live_nodes() and row["node"] != lost_id and row["restarts"] == 1
    finally:
        sup.close()


ROOT_HOST = pytest.mark.skipif(os.geteuid() != 0, reason="a uid per tenant and disks need a root host")
# A uid range of this test process's own (CI runs two suites at once; see test_tenant_uids).
UID_FIRST = 1_802_000_000 + os.getpid() % 997 * 1000


def _in(root) -> list:
    """Processes (the host's view) standing in a folder under ``root``: a tenant's workers."""
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.cwd().startswith(str(root)):
                out.append(proc)
        except psutil.Error:
            pass
    return out


def _mounts_under(root) -> list:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(root))]


@ROOT_HOST
def test_remove_tenant_leaves_nothing_on_the_node_and_forgets_the_placement(ray_cluster, libs, open_tmp):
    """A confined tenant with a uid and a disk, two libraries (both on one node: a tenant
    lives on one node); remove_tenant on the RaySupervisor gives back its workers, its disk
    (unmounted), its root and its uid on that node, and forgets its placements: its next
    call is placed afresh, under a uid again.  Another tenant is untouched."""
    from lcp_sandbox import RaySupervisor
    configs = {"stateful": {"sandbox": {"disk_mb": 8}}}
    sup = RaySupervisor(confine=True, tenants_root=str(open_tmp), uid_range=(UID_FIRST, 4))
    try:
        sup.start()
        made = {t: SandboxedBinding(tools_folders=[libs], workspace=str(open_tmp / t), workspace_root=str(open_tmp / t),
                                    supervisor=sup, tenant=t, confine=True, host_tool_configs=configs)
                for t in ("gone", "kept")}
        for b in made.values():
            assert b.execute_tool("tool_increment", {})["output"] == 1
            assert b.execute_tool("tool_other_set", {"value": "x"})["success"]
        rows = made["gone"].stats()
        assert len(rows) == 2 and len({r["node"] for r in rows}) == 1       # one node holds the tenant
        workers = _in(open_tmp / "gone")
        assert len(workers) == 2 and len({p.uids().real for p in workers}) == 1
        uid = workers[0].uids().real
        assert UID_FIRST <= uid < UID_FIRST + 4 and "gone" in sup.held_tenants()
        assert _mounts_under(open_tmp / "gone") == [str(open_tmp / "gone")]
        made["gone"].close()
        assert sup.remove_tenant("gone", str(open_tmp / "gone")) == uid
        assert all(wait_gone(p.pid) for p in workers)
        assert not (open_tmp / "gone").exists() and _mounts_under(open_tmp / "gone") == []
        assert "gone" not in sup.held_tenants() and "kept" in sup.held_tenants()
        assert not any(k[0] == "gone" for k in sup._nodes.placed)         # noqa: SLF001 (the driver forgot it)
        assert "gone" not in sup.pool_stats()["tenants"]
        assert made["kept"].execute_tool("tool_increment", {})["output"] == 2
        again = SandboxedBinding(tools_folders=[libs], workspace=str(open_tmp / "gone"), supervisor=sup,
                                 workspace_root=str(open_tmp / "gone"), tenant="gone", confine=True)
        assert again.execute_tool("tool_increment", {})["output"] == 1           # placed afresh
        assert {p.uids().real for p in _in(open_tmp / "gone")} <= set(range(UID_FIRST, UID_FIRST + 4))
        again.close()
        made["kept"].close()
        for t in ("gone", "kept"):
            sup.remove_tenant(t, str(open_tmp / t))
        assert sup.held_tenants() == [] and _in(open_tmp) == [] and _mounts_under(open_tmp) == []
    finally:
        sup.close()


def test_interrupt_reaches_the_node_running_the_call(ray_sup, libs, tmp_path):
    """A busy tool on its node, interrupted from another host thread: that node's supervisor
    interrupts it as on one machine (499, the worker and its state kept), long before the
    tool would end by itself; the worker, found by its pid, stops burning CPU."""
    b = SandboxedBinding(tools_folders=[libs], workspace=str(tmp_path), supervisor=ray_sup, tenant="cancel",
                         timeout_s=60)
    assert b.execute_tool("tool_set_state", {"value": "kept"})["success"]
    [row] = [r for r in b.stats() if r["library"] == "faults"]
    pid = row["pid"]
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("r", b.execute_tool("tool_busy", {"seconds": 20})))
    t.start()
    wait_until(lambda: spinning(pid, 0.1), "the busy call spinning on its worker", 200)
    start = time.monotonic()
    assert b.interrupt(threading.get_ident()) is False          # this thread waits for no call
    assert b.interrupt(t.ident) is True
    t.join(15)
    assert not t.is_alive() and time.monotonic() - start < 10   # the tool would spin 20 s
    r = box["r"]
    assert r["status_code"] == 499 and r["success"] is False, r
    assert "cancelled by the host" in r["error"] and "kept" in r["error"]
    assert not spinning(pid)
    assert b.execute_tool("tool_get_state", {})["output"]["value"] == "kept"
    [row] = [r for r in b.stats() if r["library"] == "faults"]
    assert row["pid"] == pid and psutil.Process(pid).is_running()   # the same worker, kept
    assert b.interrupt(t.ident) is False                        # its call is over
    b.close()


HOLDING = '''
import alpha

_HELD = open(alpha.__file__)          # the host sees it among the worker's open files


def tool_alpha() -> dict:
    """The alpha this library sees."""
    return {"success": True, "output": alpha.V}
'''


def test_a_library_s_environment_is_built_on_the_node_that_runs_it(ray_cluster, tmp_path, open_tmp, monkeypatch):
    """A third node knows a store and an index (offline wheels) that neither the driver nor
    the other nodes know; a library declaring a requirement runs there: its environment is
    built in that node's store, and its worker (a process of that node, found by the host)
    holds a file of it open."""
    from support.envs_support import library, offline_uv, script_block, wheelhouse

    from lcp_sandbox import RaySupervisor
    from lcp_sandbox.backends.envs import Store
    store = tmp_path / "node3-store"
    before = {p.pid for p in psutil.Process().children()}
    with monkeypatch.context() as m, offline_uv(wheelhouse(open_tmp / "wheels"), tmp_path / "uv-cache"):
        m.setenv("LCP_SANDBOX_ENVS_DIR", str(store))          # the node's environment, not the driver's
        node3 = ray_cluster.add_node(num_cpus=1)
    assert "LCP_SANDBOX_ENVS_DIR" not in os.environ and "UV_FIND_LINKS" not in os.environ
    ray_cluster.wait_for_nodes()
    _RAY_ROOTS.update({p.pid for p in psutil.Process().children()} - before)
    tools = tmp_path / "tools"
    library(tools, "with_env", HOLDING, script_block("alpha==1.0"))
    (tools / "plain.py").write_text("def tool_plain() -> dict:\n    return {'success': True, 'output': 1}\n")
    sup = RaySupervisor()
    try:
        sup.start()
        bs = [SandboxedBinding(tools_folders=[tools], workspace=str(tmp_path), supervisor=sup, tenant=f"env{i}")
              for i in range(3)]
        assert [b.execute_tool("tool_plain", {})["output"] for b in bs] == [1] * 3
        [b] = [b for b in bs if b.stats()[0]["node"] == node3.node_id]  # one tenant per node
        r = b.execute_tool("tool_alpha", {})                            # on the tenant's node
        assert r == {"output": "1.0", "status_code": 200, "success": True}, r
        [key] = [e["key"] for e in Store(str(store)).entries() if e["complete"]]
        assert Store(str(store)).ready(key) is not None
        [row] = [row for row in b.stats() if row["library"] == "with_env"]
        assert row["node"] == node3.node_id
        worker = psutil.Process(row["pid"])
        raylet = node3.all_processes["raylet"][0].process.pid
        assert raylet in {p.pid for p in worker.parents()}                   # a process of node 3
        assert any(f.path.startswith(str(store / key)) for f in worker.open_files())
        for other in bs:
            other.close()
    finally:
        sup.close()
        ray_cluster.remove_node(node3)
