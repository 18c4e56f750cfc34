"""The core promises over each backend: the same assertions for the local Supervisor and
for RaySupervisor on the session's two-node Ray cluster (tests/conftest.py ray_cluster).

State per (tenant, library), the workspace per call (two threads in two workspaces at
once), the handler relay in every call shape, host-object proxies with a callback into
the tool, timeouts, crashes, memory limits, and close() leaving nothing behind."""
import importlib.util
import itertools
import os
import queue
import threading

import psutil
import pytest
from conftest import FIXTURES, gone

from lcp_sandbox import SandboxedBinding, Supervisor

HAS_RAY = importlib.util.find_spec("ray") is not None
RAY = pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.skipif(not HAS_RAY, reason="the ray extra is not installed")])
BACKENDS = ["local", RAY]
_tenants = itertools.count()


def make_backend(kind: str, request):
    if kind == "local":
        return Supervisor()
    request.getfixturevalue("ray_cluster")
    from lcp_sandbox import RaySupervisor
    sup = RaySupervisor()
    sup.start()
    return sup


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    """One backend per kind for the module (each test has tenants of its own)."""
    sup = make_backend(request.param, request)
    yield sup
    sup.close()


@pytest.fixture
def make(backend, libs, tmp_path):
    """make(**kw) -> a binding on the module's backend, with a tenant of its own."""
    made = []

    def build(**kw):
        kw.setdefault("tools_folders", [libs])
        kw.setdefault("workspace", str(tmp_path))
        kw.setdefault("tenant", f"t{next(_tenants)}")
        b = SandboxedBinding(supervisor=backend, **kw)
        made.append(b)
        return b

    yield build
    for b in made:
        b.close()


def stat(b, library):
    return next(s for s in b.stats() if s["library"] == library)


# ---------------------------------------------------------------- state and workspaces
def test_state_is_per_tenant_and_library(make):
    a, b = make(), make()
    assert a.execute_tool("tool_increment", {"step": 2})["output"] == 2
    assert a.execute_tool("tool_increment", {"step": 3})["output"] == 5
    assert b.execute_tool("tool_increment", {})["output"] == 1           # another tenant: its own worker
    who = a.execute_tool("tool_whoami", {})["output"]
    assert who["pid"] != os.getpid() and who["init_calls"] == 1
    assert a.execute_tool("tool_other_get", {})["output"]["pid"] != who["pid"]
    row = stat(a, "stateful")
    assert row["pid"] == who["pid"] and row["calls"] == 3 and row["restarts"] == 0 and row["state"] == "idle"
    assert {"library", "tenant", "pid", "state", "calls", "restarts", "last_exit", "rss", "peak_rss",
            "protections", "workspace_root"} <= set(row)
    assert all(s["tenant"] == a.tenant for s in a.stats())


def test_cwd_is_the_call_workspace(make, tmp_path):
    w1, w2 = tmp_path / "w1", tmp_path / "w2"
    w1.mkdir(), w2.mkdir()
    b = make(workspace=str(w1))
    assert b.execute_tool("tool_whoami", {})["output"]["cwd"] == str(w1)
    assert b.execute_tool("tool_whoami", {}, workspace=str(w2))["output"]["cwd"] == str(w2)
    assert b.execute_tool("tool_whoami", {})["output"]["cwd"] == str(w1)


def test_two_threads_two_workspaces_at_once(make, tmp_path):
    """Thread A's tool waits for a file that thread B's tool (another tenant) creates:
    both calls are in flight together, each in its own workspace."""
    w1, w2 = tmp_path / "w1", tmp_path / "w2"
    w1.mkdir(), w2.mkdir()
    flag = tmp_path / "flag"
    b1, b2 = make(), make()
    results = {}
    t = threading.Thread(target=lambda: results.update(
        a=b1.execute_tool("tool_wait_for", {"path": str(flag), "seconds": 60}, workspace=str(w1))))
    t.start()
    results["b"] = b2.execute_tool("tool_touch", {"path": str(flag)}, workspace=str(w2))
    t.join(90)
    assert results["a"] == {"output": str(w1), "status_code": 200, "success": True}
    assert results["b"]["output"] == str(w2)


# ---------------------------------------------------------------- the handler relay
@pytest.mark.parametrize("shape,expected", [
    ("tuple", (("rm -rf build", "shell"), {})),
    ("argv", (("rm -rf build", "shell", ["rm", "-rf", "build"]), {})),
    ("dict", (({"action": "delete", "path": "build"},), {})),
    ("single", (("delete build?",), {})),
    ("keywords", ((), {"source": "rm -rf build", "script_label": "shell", "argv": ["rm"]})),
    ("module", (("rm -rf build", "shell"), {})),
])
def test_confirm_handler_every_shape(make, shape, expected):
    """The handler blocks on a queue another thread answers (as a GUI would), on the calling thread."""
    requests, answers = queue.Queue(), queue.Queue()
    threads = []

    def handler(*args, **kwargs):
        threads.append(threading.get_ident())
        requests.put((args, kwargs))
        return answers.get(timeout=60)

    def operator():
        requests.get(timeout=60)
        answers.put(("reject", "not today"))

    b = make(confirm_handler=handler)
    op = threading.Thread(target=operator)
    op.start()
    r = b.execute_tool("tool_confirm", {"shape": shape})
    op.join(60)
    assert r["output"] == ["reject", "not today"]
    assert threads == [threading.get_ident()]
    b.set_confirm_handler(lambda *a, **k: (repr((a, k)), ""))
    assert b.execute_tool("tool_confirm", {"shape": shape})["output"][0] == repr(expected)


def test_user_interaction_handler(make):
    seen = []
    b = make(user_interaction_handler=lambda request: seen.append(request) or "blue")
    assert b.execute_tool("tool_ask", {"prompt": "Favourite colour?"})["output"] == "blue"
    assert seen == [{"type": "text", "title": "Question", "prompt": "Favourite colour?", "options": [],
                     "default": None}]
    assert make().execute_tool("tool_ask", {"prompt": "?"})["error"] == "no user interaction handler"


def test_handlers_through_host_tool_configs(make):
    def handler(*a):
        return ("allow", f"config handler saw {a[0]}")

    b = make(host_tool_configs={"stateful": {"confirm_handler": handler, "mode": "x"}})
    assert b.execute_tool("tool_confirm", {"shape": "tuple"})["output"] == ["allow", "config handler saw rm -rf build"]
    assert b.execute_tool("tool_config", {})["output"]["plain"] == {"mode": "x"}


def test_raising_handler_gives_the_tool_an_exception(make):
    def handler(*a):
        raise PermissionError("operator is away")

    b = make(confirm_handler=handler)
    r = b.execute_tool("tool_confirm", {"shape": "tuple"})
    assert r["status_code"] == 500 and "operator is away" in r["error"] and "PermissionError" in r["traceback"]
    assert b.execute_tool("tool_increment", {})["success"]


# ---------------------------------------------------------------- host objects
def test_host_object_proxies_and_a_callback_into_the_tool(make, tmp_path):
    from test_host_objects import FakeClient, Progress
    b = make(tools_folders=[FIXTURES / "lollms_libs"])
    client = FakeClient()
    r = b.execute_tool("tool_callback_into_tool", {}, lollms_client_instance=client)
    assert r["output"] == {"full": "echo:stream me", "chunks": ["a", "b", "c"]}
    r = b.execute_tool("tool_client_values", {}, lollms_client_instance=client)
    out = r["output"]
    assert r["success"] and out["model_after_switch"] == "fast" and out["thing_child_size"] == 50
    assert out["counter"] == 42 and client.counter == 42 and client.llm.model_name == "fast"
    assert client.threads == {threading.get_ident()}          # served on the calling thread
    ctx = Progress()
    assert b.execute_tool("tool_stream_threads", {"per_thread": 3, "threads": 2}, tool_context=ctx)["success"]
    assert len(ctx.lines) == 6


# ---------------------------------------------------------------- faults
@pytest.fixture
def faults(make):
    b = make(timeout_s=5.0)
    assert b.execute_tool("tool_set_state", {"value": "before"})["success"]
    assert b.execute_tool("tool_other_set", {"value": "keep me"})["success"]
    return b


def state_after(b, kept: bool) -> None:
    assert b.execute_tool("tool_get_state", {})["output"]["value"] == ("before" if kept else "initial")
    assert b.execute_tool("tool_other_get", {})["output"]["value"] == "keep me"


def test_soft_timeout_keeps_the_worker(faults):
    pid = faults.execute_tool("tool_get_state", {})["output"]["pid"]
    r = faults.execute_tool("tool_busy", {"seconds": 30}, timeout_s=0.5)
    assert r["status_code"] == 504 and "timed out after 0.5 s" in r["error"] and "kept" in r["error"]
    state_after(faults, kept=True)
    assert faults.execute_tool("tool_get_state", {})["output"]["pid"] == pid


def test_hard_timeout_replaces_the_worker(faults):
    pid = faults.execute_tool("tool_get_state", {})["output"]["pid"]
    r = faults.execute_tool("tool_c_sleep", {"seconds": 30}, timeout_s=0.3)
    assert r["status_code"] == 504 and "did not stop" in r["error"] and "replaced" in r["error"]
    assert gone(pid)
    state_after(faults, kept=False)


def test_time_waiting_for_the_host_does_not_count(make):
    done = threading.Event()

    def slow(*a):
        done.wait(1.0)           # a person thinking, longer than the tool's timeout
        return ("allow", "")

    b = make(timeout_s=0.5, confirm_handler=slow)
    assert b.execute_tool("tool_confirm", {"shape": "tuple"})["output"] == ["allow", ""]


def test_crash_500_then_a_fresh_worker(faults):
    pid = faults.execute_tool("tool_get_state", {})["output"]["pid"]
    r = faults.execute_tool("tool_segfault", {})
    assert r["status_code"] == 500 and "SIGSEGV" in r["error"] and "[faults]" in r["error"]
    assert "fresh worker" in r["error"]
    state_after(faults, kept=False)
    s = stat(faults, "faults")
    assert s["restarts"] == 1 and s["pid"] != pid and "SIGSEGV" in s["last_exit"]


def test_memory_limits_507(make):
    b = make(host_tool_configs={"faults": {"sandbox": {"memory_mb": 300}}})
    b.execute_tool("tool_set_state", {"value": "before"})
    r = b.execute_tool("tool_memory_hog", {"mb": 2048})
    assert r["status_code"] == 507 and "300" in r["error"] and "kept" in r["error"]
    assert b.execute_tool("tool_get_state", {})["output"]["value"] == "before"
    b2 = make(host_tool_configs={"faults": {"sandbox": {"memory_mb": 250}}})
    r = b2.execute_tool("tool_spawn_hogs", {"count": 3, "mb": 120, "seconds": 20})
    assert r["status_code"] == 507 and "memory limit of 250 MB" in r["error"] and "replaced" in r["error"]
    assert stat(b2, "faults")["peak_rss"] > 250 * 1048576


# ---------------------------------------------------------------- close
def _zygotes() -> set:
    """Live zygotes below this process (the Ray cluster's nodes are local processes too)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and any("lcp_sandbox.worker.zygote" in c for c in p.cmdline()):
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def _below(roots: set) -> set:
    """``roots`` and their live descendants."""
    out = set(roots)
    for pid in roots:
        try:
            out |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            pass
    return out


def _live_agents() -> set:
    from ray._private.state import (
        actors,  # the GCS's actor table (ray.util.state needs the dashboard)
    )
    return {aid for aid, a in actors().items() if a["ActorClassName"] == "NodeAgent" and a["State"] != "DEAD"}


def _cmdline(pid: int) -> list:
    try:
        return psutil.Process(pid).cmdline()[:3]
    except psutil.Error:
        return ["(gone)"]


def _engine_process(pid: int) -> bool:
    """A zygote or one of its workers (their command line is the zygote's boot code)."""
    return "lcp_sandbox" in " ".join(_cmdline(pid))


@pytest.mark.parametrize("kind", BACKENDS)
def test_close_leaves_nothing(kind, request, libs, tmp_path, new_processes):
    before = _zygotes()
    if kind == "ray":
        request.getfixturevalue("ray_cluster")
        others = _live_agents()               # the module's backend's, if it runs
    sup = make_backend(kind, request)
    mine = _live_agents() - others if kind == "ray" else set()
    b = SandboxedBinding(tools_folders=[libs], workspace=str(tmp_path), supervisor=sup, tenant="closing")
    pids = [b.execute_tool("tool_whoami", {})["output"]["pid"], b.execute_tool("tool_other_get", {})["output"]["pid"]]
    b.close()
    sup.close()
    assert all(gone(pid) for pid in pids)
    # Other backends' zygotes (the module's Ray backend runs some in this machine's Ray
    # nodes) fork spares at their own pace: what they started is theirs, not this one's.
    others = _below(before)
    assert _zygotes() - others == set()
    left = new_processes() - others
    if kind == "ray":
        # Ray starts and stops its own worker processes (descendants of this test process,
        # which started the cluster) on its own schedule: only ours must be gone.
        left = {pid for pid in left if _engine_process(pid)}
    assert left == set(), [(pid, _cmdline(pid)) for pid in left]
    assert b.execute_tool("tool_increment", {})["status_code"] == 503
    if kind == "ray":
        assert len(mine) == 2 and _live_agents() & mine == set()     # its agents, one per node: gone
