"""Many tenants on one supervisor: separation, confinement, pool fairness, scale."""
import logging
import os
import socket
import threading
import time

import pytest
from conftest import FIXTURES
from support.confined_kinds import KINDS, NAMESPACES_REFUSED, Confined

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.testing import protections_off

LIBS = FIXTURES / "tenant_libs"


@pytest.fixture
def roots(open_tmp):
    a, b = open_tmp / "tenant_a", open_tmp / "tenant_b"
    a.mkdir(), b.mkdir()
    (b / "secret.txt").write_text("b's secret")
    return a, b


@pytest.fixture(params=KINDS)
def kind(request, open_tmp):
    """Confined workers of one start kind (confined_kinds.py), tenants under open_tmp."""
    c = Confined(request.param, open_tmp)
    yield c
    c.close()


@pytest.fixture
def confined(roots, kind):
    """Two tenants, confined, each with a workspace root, on one supervisor."""
    a, b = roots
    ta, tb = kind.binding(LIBS, "a", root=a), kind.binding(LIBS, "b", root=b)
    yield kind.sup, ta, tb
    kind.check(ta), kind.check(tb)


def test_state_is_per_tenant(confined):
    sup, ta, tb = confined
    assert ta.execute_tool("tool_remember", {"key": "k", "value": "a's"})["output"] == {"k": "a's"}
    assert tb.execute_tool("tool_recall", {})["output"]["state"] == {}
    assert ta.execute_tool("tool_recall", {})["output"]["state"] == {"k": "a's"}
    pids = {(s["tenant"], s["library"]): s["pid"] for s in sup.stats()}
    assert pids[("a", "probe")] != pids[("b", "probe")]


def test_workspaces_are_per_tenant(confined, roots):
    sup, ta, tb = confined
    a, b = roots
    assert ta.execute_tool("tool_write_file", {"path": "note.txt", "text": "hi"})["output"] == str(a / "note.txt")
    assert tb.execute_tool("tool_read_file", {"path": "note.txt"})["success"] is False
    assert ta.execute_tool("tool_read_file", {"path": "note.txt"})["output"] == "hi"


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink", "symlink_dir"])
def test_cross_tenant_reads_are_refused(confined, roots, how):
    sup, ta, tb = confined
    a, b = roots
    if how == "absolute":
        path = str(b / "secret.txt")
    elif how == "dotdot":
        path = "../tenant_b/secret.txt"
    elif how == "symlink":
        (a / "link.txt").symlink_to(b / "secret.txt")
        path = "link.txt"
    else:
        (a / "other").symlink_to(b, target_is_directory=True)
        path = "other/secret.txt"
    r = ta.execute_tool("tool_read_file", {"path": path})
    assert r["success"] is False and refused(r["error"]), r
    assert tb.execute_tool("tool_read_file", {"path": "secret.txt"})["output"] == "b's secret"


def refused(error: str) -> bool:
    """Refused by Landlock, or not there at all (a fresh worker's own root)."""
    return "PermissionError" in error or "FileNotFoundError" in error


def test_cross_tenant_writes_are_refused(confined, roots):
    sup, ta, tb = confined
    a, b = roots
    r = ta.execute_tool("tool_write_file", {"path": str(b / "planted.txt"), "text": "x"})
    assert r["success"] is False and refused(r["error"]), r
    assert not (b / "planted.txt").exists()
    r = ta.execute_tool("tool_write_file", {"path": str(a.parent / "outside.txt"), "text": "x"})
    assert r["success"] is False and not (a.parent / "outside.txt").exists()


def test_workspace_outside_the_tenant_root_403(confined, roots):
    sup, ta, tb = confined
    a, b = roots
    r = ta.execute_tool("tool_read_file", {"path": "secret.txt"}, workspace=str(b))
    assert r["status_code"] == 403 and "outside the root" in r["error"] and "'a'" in r["error"]
    sub = a / "project"
    sub.mkdir()
    assert ta.execute_tool("tool_write_file", {"path": "x.txt", "text": "1"}, workspace=str(sub))["success"]


def test_host_secrets_are_invisible(roots, monkeypatch, kind):
    a, b = roots
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret")
    t = kind.binding(LIBS, "a", root=a,
                     host_tool_configs={"probe": {"sandbox": {"env": {"PROBE_MODE": "on"}}}})
    assert t.execute_tool("tool_getenv", {"name": "OPENAI_API_KEY"})["output"] == {"environ": None, "proc": False}
    assert t.execute_tool("tool_getenv", {"name": "PROBE_MODE"})["output"]["environ"] == "on"
    assert t.execute_tool("tool_getenv", {"name": "PATH"})["output"]["environ"] == os.environ["PATH"]
    kind.check(t)
    # unconfined (drop-in parity) tools see the host's environment, as in-process
    u = SandboxedBinding(tools_folders=[LIBS], supervisor=kind.sup, tenant="u", workspace=str(a), confine=False)
    assert u.execute_tool("tool_getenv", {"name": "OPENAI_API_KEY"})["output"]["environ"] == "sk-host-secret"
    u.close()


def test_the_allowlist_is_the_same_for_names_as_bytes():
    """The INIT's environment is filtered as bytes (worker_init.py): the same names pass."""
    from lcp_sandbox.core.policy import ENV_ALLOWLIST, allowed_environment
    names = [*ENV_ALLOWLIST, "LC_ALL", "LC_", "LC", "XLC_ALL", "OPENAI_API_KEY", "PATHX", "path",
             "", "LANG\udcff"]
    as_bytes = allowed_environment({os.fsencode(n): b"v" for n in names})
    assert {os.fsdecode(k) for k in as_bytes} == set(allowed_environment(dict.fromkeys(names)))
    assert "LC_ALL" in allowed_environment(dict.fromkeys(names)) and len(as_bytes) > 3


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(10)

    def serve():
        for _ in range(4):
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.sendall(b"hello from the host\n")
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    srv.close()


def test_network_off_and_on(roots, listener, kind):
    a, b = roots
    off = kind.binding(LIBS, "a", root=a, host_tool_configs={"probe": {"sandbox": {"network": False}}})
    on = kind.binding(LIBS, "b", root=b)
    r = off.execute_tool("tool_connect", {"host": "127.0.0.1", "port": listener})
    # no socket but NETLINK_ROUTE: no loopback either (confined_kinds: siblings share a namespace)
    assert r["success"] is False and r["error"].startswith("PermissionError"), r
    r = on.execute_tool("tool_connect", {"host": "127.0.0.1", "port": listener})
    assert r["output"] == "hello from the host\n"
    prot = {s["tenant"]: s["protections"] for s in kind.sup.stats()}
    # (a default container refuses namespaces: there the system call filter keeps it off)
    assert prot["a"]["network"].startswith("on (the system call filter" if NAMESPACES_REFUSED
                                           else "on (own network namespace")
    assert prot["b"]["network"] == "host network"
    assert prot["a"]["filesystem"].startswith("on (own root" if kind.own_namespaces else "on (ABI")
    kind.check(off), kind.check(on)
    if NAMESPACES_REFUSED:             # (an unconfined worker needs the namespace: 503)
        return
    with Supervisor() as plain:        # unconfined, own namespace: its loopback is its own
        u = SandboxedBinding(tools_folders=[LIBS], supervisor=plain, workspace=str(a),
                             host_tool_configs={"probe": {"sandbox": {"network": False}}})
        r = u.execute_tool("tool_connect", {"host": "127.0.0.1", "port": listener})
        assert r["success"] is False and ("refused" in r["error"] or "unreachable" in r["error"])


def test_missing_mechanism_is_refused_and_nothing_runs(roots, kind):
    """Fail closed: a confined worker without its file rules runs no call (503 naming what
    is missing and what would provide it); another tenant's secret stays unread."""
    a, b = roots
    with protections_off(kind.sup, "landlock", "root"):     # (a fresh worker's own root too)
        t = kind.binding(LIBS, "a", root=a)
        for _ in range(3):              # and again: refused each time, never quarantined
            r = t.execute_tool("tool_read_file", {"path": str(b / "secret.txt")})
            assert r["status_code"] == 503 and "b's secret" not in str(r), r
            assert "filesystem: unavailable" in r["error"] and "Landlock (Linux 5.13+" in r["error"]
            assert "confine=\"best-effort\"" in r["error"]
            r = t.execute_tool("tool_write_file", {"path": str(b / "from_a.txt"), "text": "x"})
            assert r["status_code"] == 503, r
    assert not (b / "from_a.txt").exists()
    assert all(s["pid"] is None for s in t.stats())


def test_missing_mechanism_warns_once_and_stats_tell_with_best_effort(roots, caplog, kind):
    a, b = roots
    with protections_off(kind.sup, "landlock", "root"), \
            caplog.at_level(logging.WARNING, logger="lcp_sandbox"):
        t = kind.binding(LIBS, "a", root=a, confine="best-effort")
        assert t.execute_tool("tool_read_file", {"path": str(b / "secret.txt")})["output"] == "b's secret"
        assert t.execute_tool("tool_lib_a_pid", {})["success"]
        warnings = [r.getMessage() for r in caplog.records if "confinement requested" in r.getMessage()]
        # one per missing protection, once (the second library's worker adds none); a fresh
        # worker has a PID namespace of its own, a forked one relies on Landlock's scope, or
        # on a uid of its tenant's own (a root host with a tenants_root)
        apart = kind.own_namespaces or kind.sup.run_as == "per-tenant"
        missing = ["filesystem"] + ([] if apart else ["processes"])
        assert sorted(w.split()[0] for w in warnings) == missing, warnings
        assert all("not in force" in w and "best-effort" in w for w in warnings)
        assert all(s["protections"]["filesystem"].startswith("unavailable") for s in t.stats())
        processes = {s["protections"]["processes"].split(" (")[0] for s in t.stats()}
        assert processes == {"on" if apart else "unavailable"}, t.stats()
        assert all(s["protections"]["env"].startswith("clean") for s in t.stats())
        kind.check(t)


def test_lru_eviction_and_events(tmp_path):
    events = []
    with Supervisor(max_workers=2, on_event=events.append) as sup:
        t = SandboxedBinding(tools_folders=[LIBS], supervisor=sup, workspace=str(tmp_path))
        pa = t.execute_tool("tool_lib_a_pid", {})["output"]
        t.execute_tool("tool_lib_b_pid", {})
        t.execute_tool("tool_lib_a_pid", {})                 # lib_b is now least recently used
        t.execute_tool("tool_lib_c_pid", {})
        state = {s["library"]: s for s in t.stats()}
        assert state["lib_b"]["state"] == "stopped" and "evicted" in state["lib_b"]["last_exit"]
        assert state["lib_a"]["pid"] == pa and state["lib_c"]["state"] == "idle"
        assert sup.pool_stats()["live_workers"] == 2
        assert [e["library"] for e in events if e["event"] == "evict"] == ["lib_b"]
        assert [e["library"] for e in events if e["event"] == "start"] == ["lib_a", "lib_b", "lib_c"]


def test_idle_timeout(tmp_path):
    events = []
    with Supervisor(idle_timeout_s=0.3, on_event=events.append) as sup:
        t = SandboxedBinding(tools_folders=[LIBS], supervisor=sup, workspace=str(tmp_path))
        t.execute_tool("tool_lib_a_pid", {})
        deadline = time.monotonic() + 10
        while t.stats()[0]["state"] != "stopped" and time.monotonic() < deadline:
            time.sleep(0.02)
        s = t.stats()[0]
        assert s["state"] == "stopped" and s["last_exit"] == "stopped after 0.3 s idle"
        assert any(e["event"] == "idle" for e in events)
        assert t.execute_tool("tool_lib_a_pid", {})["success"]        # comes back on demand


def test_no_room_in_time_503(tmp_path):
    with Supervisor(max_workers=1) as sup:
        t = SandboxedBinding(tools_folders=[LIBS], supervisor=sup, workspace=str(tmp_path))
        th = threading.Thread(target=t.execute_tool, args=("tool_lib_a_work", {"seconds": 1.5}))
        th.start()
        while not any(s["state"] == "busy" for s in t.stats()):
            time.sleep(0.01)
        r = t.execute_tool("tool_lib_b_pid", {}, timeout_s=0.3)
        th.join(10)
        assert r["status_code"] == 503 and "no worker became free in time" in r["error"]


def test_fair_queue(tmp_path):
    """Tenant A floods 4 libraries from 8 threads on a 2-worker pool, so A always has
    older calls waiting for room; tenant B's single call still gets one of the first
    two workers to free up (a FIFO queue would serve A's waiting calls first)."""
    work = 0.25
    with Supervisor(max_workers=2) as sup:
        ta = SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant="A", workspace=str(tmp_path))
        tb = SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant="B", workspace=str(tmp_path))
        a_calls, failures = [], []
        stop = threading.Event()

        def flood(tool):
            while not stop.is_set():
                r = ta.execute_tool(tool, {"seconds": work}, timeout_s=60)
                (a_calls.append(r["output"]) if r.get("success") else failures.append(r))

        threads = [threading.Thread(target=flood, args=(tool,)) for tool in
                   ["tool_lib_a_work", "tool_lib_b_work", "tool_lib_c_work", "tool_work"] * 2]
        [t.start() for t in threads]
        while sup.pool_stats()["tenants"].get("A", {}).get("waiting", 0) < 2:
            time.sleep(0.01)
        submitted = time.monotonic()
        b = tb.execute_tool("tool_lib_a_work", {"seconds": 0.01}, timeout_s=60)["output"]
        stop.set()
        [t.join(60) for t in threads]
        assert failures == []
        ends_before_b = [c for c in a_calls if submitted < c["end"] <= b["start"]]
        assert len(ends_before_b) <= 2
        assert b["start"] - submitted < 2 * work + 2.0


def test_two_hundred_workers(new_processes, tmp_path):
    """50 tenants x 4 libraries: 200 live workers, every call answered, nothing left behind."""
    sup = Supervisor()
    bindings = [SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant=f"t{i}", workspace=str(tmp_path))
                for i in range(50)]
    tools = ["tool_lib_a_pid", "tool_lib_b_pid", "tool_lib_c_pid", "tool_recall"]
    results, errors = {}, []

    def drive(chunk):
        for b in chunk:
            for tool in tools:
                r = b.execute_tool(tool, {})
                if not r.get("success"):
                    errors.append(r)
                results[(b.tenant, tool)] = r.get("output")

    threads = [threading.Thread(target=drive, args=(bindings[i::8],)) for i in range(8)]
    [t.start() for t in threads]
    [t.join(300) for t in threads]
    assert errors == []
    stats = sup.stats()
    assert len(stats) == 200 and all(s["state"] == "idle" for s in stats)
    assert len({s["pid"] for s in stats}) == 200
    assert sup.pool_stats()["live_workers"] == 200
    assert len(new_processes()) >= 201
    sup.close()
    assert new_processes() == set()
