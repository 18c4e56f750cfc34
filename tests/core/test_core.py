"""The core contract over real worker processes: LCP-exact tools in long-lived workers."""
import os
import sys
import threading
from pathlib import Path

import psutil
import pytest
from conftest import REPO, gone

from lcp_sandbox import SandboxedBinding


def test_module_state_survives_between_calls(make_binding):
    b = make_binding()
    assert b.execute_tool("tool_increment", {"step": 2})["output"] == 2
    assert b.execute_tool("tool_increment", {"step": 3})["output"] == 5
    assert b.execute_tool("tool_increment", {})["output"] == 6       # default step filled in
    who = b.execute_tool("tool_whoami", {})["output"]
    assert who["pid"] != os.getpid()
    assert who["init_calls"] == 1


def test_worker_per_library(make_binding):
    b = make_binding()
    a = b.execute_tool("tool_whoami", {})["output"]["pid"]
    o = b.execute_tool("tool_other_get", {})["output"]["pid"]
    assert a != o and os.getpid() not in (a, o)
    libs = {s["library"]: s for s in b.stats()}
    assert libs["stateful"]["pid"] == a and libs["other"]["pid"] == o
    assert libs["stateful"]["calls"] == 1


def test_cwd_is_the_call_workspace(make_binding, tmp_path):
    w1, w2 = tmp_path / "w1", tmp_path / "w2"
    w1.mkdir(), w2.mkdir()
    b = make_binding(workspace=str(w1))
    assert b.execute_tool("tool_whoami", {})["output"]["cwd"] == str(w1)
    assert b.execute_tool("tool_whoami", {}, workspace=str(w2))["output"]["cwd"] == str(w2)
    assert b.execute_tool("tool_whoami", {})["output"]["cwd"] == str(w1)


def test_cwd_defaults_to_callers_cwd(make_binding, tmp_path, monkeypatch):
    b = make_binding(workspace=None)
    monkeypatch.chdir(tmp_path)
    assert b.execute_tool("tool_whoami", {})["output"]["cwd"] == str(tmp_path)


def test_two_threads_two_workspaces_at_once(make_binding, tmp_path):
    """Thread A's tool (library stateful) waits for a file that thread B's tool
    (library other... here: the same library in another tenant) creates: both
    calls must be in flight together, each in its own workspace."""
    w1, w2 = tmp_path / "w1", tmp_path / "w2"
    w1.mkdir(), w2.mkdir()
    flag = tmp_path / "flag"
    b1 = make_binding(tenant="t1")
    b2 = make_binding(tenant="t2", supervisor=b1.supervisor)
    results = {}

    def waiter():
        results["a"] = b1.execute_tool("tool_wait_for", {"path": str(flag)}, workspace=str(w1))

    t = threading.Thread(target=waiter)
    t.start()
    results["b"] = b2.execute_tool("tool_touch", {"path": str(flag)}, workspace=str(w2))
    t.join(30)
    assert results["a"] == {"output": str(w1), "status_code": 200, "success": True}
    assert results["b"]["output"] == str(w2)


def test_same_worker_serves_calls_in_order_across_threads(make_binding):
    b = make_binding()
    b.execute_tool("tool_increment", {"step": 0})
    outs = []
    lock = threading.Lock()

    def run():
        for _ in range(50):
            r = b.execute_tool("tool_increment", {"step": 1})
            with lock:
                outs.append(r["output"])

    threads = [threading.Thread(target=run) for _ in range(4)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert sorted(outs) == list(range(1, 201))      # no lost or duplicated increments


def test_discovery_does_not_run_module_code(make_binding, libs):
    marker = libs / "sideeffect" / "sideeffect.imported"
    b = make_binding()
    b.discover_tools(force_refresh=True)
    assert "tool_marker" in {t["name"] for t in b.discovered_tools}
    assert not marker.exists()
    assert b.execute_tool("tool_marker", {})["output"] == "hello"
    assert marker.exists()


def test_init_config_delivery(make_binding):
    b = make_binding(host_tool_configs={"stateful": {"autonomy_level": "strict", "n": 3}})
    out = b.execute_tool("tool_config", {})["output"]
    assert out["plain"] == {"autonomy_level": "strict", "n": 3}
    assert out["handlers"] == {}
    b2 = make_binding(host_tool_configs={"stateful": {"n": 1}}, confirm_handler=lambda *a: ("allow", ""),
                      tenant="other")
    assert b2.execute_tool("tool_config", {})["output"]["handlers"] == {"confirm_handler": True}


# (The confirm handler relay in every call shape: tests/engine/test_backends.py, over both backends.)


def test_handler_set_later_reaches_running_worker(make_binding):
    b = make_binding()
    assert b.execute_tool("tool_confirm", {"shape": "module"})["output"] == "no handler"
    b.set_confirm_handler(lambda *a: ("allow", "later"))
    assert b.execute_tool("tool_confirm", {"shape": "module"})["output"] == ["allow", "later"]
    b.set_confirm_handler(None)
    assert b.execute_tool("tool_confirm", {"shape": "module"})["output"] == "no handler"


def test_raising_handler_gives_the_tool_an_exception(make_binding):
    def handler(*a):
        raise PermissionError("operator is away")

    b = make_binding(confirm_handler=handler)
    r = b.execute_tool("tool_confirm", {"shape": "tuple"})
    assert r["status_code"] == 500 and r["success"] is False
    assert "operator is away" in r["error"]
    assert "PermissionError" in r["traceback"]
    assert b.execute_tool("tool_increment", {})["success"]        # worker kept


def test_user_interaction_handler_injected(make_binding):
    seen = []

    def ui(request):
        seen.append(request)
        return "blue"

    b = make_binding(user_interaction_handler=ui)
    r = b.execute_tool("tool_ask", {"prompt": "Favourite colour?"})
    assert r["output"] == "blue"
    assert seen == [{"type": "text", "title": "Question", "prompt": "Favourite colour?",
                     "options": [], "default": None}]
    b2 = make_binding(tenant="no-ui")
    assert b2.execute_tool("tool_ask", {"prompt": "?"})["error"] == "no user interaction handler"


def test_parameter_filtering_and_kwargs(make_binding):
    b = make_binding()
    assert b.execute_tool("tool_strict", {"a": "x", "zzz": 1})["output"] == ["x", 2]
    assert b.execute_tool("tool_echo", {"value": 1, "zzz": 2, "tool_context": None})["output"] == \
        {"value": 1, "kwargs": ["zzz"]}


def test_host_objects_injected_only_where_declared(make_binding):
    class Client:
        pass

    b = make_binding()
    r = b.execute_tool("tool_context_use", {}, tool_context={"user": "ana"},
                       lollms_client_instance=Client(), discussion_instance=None)
    assert r["output"] == {"tool_context": {"user": "ana"}, "client": "Proxy", "discussion": None}
    r = b.execute_tool("tool_strict", {"a": "x"}, tool_context={"user": "ana"})
    assert r["output"] == ["x", 2]


def test_passthrough_and_context_files(make_binding, tmp_path):
    b = make_binding()
    r = b.execute_tool("tool_files", {"names": ["a.txt", "missing.txt"]})
    assert r == {"output": "ok", "status_code": 200, "success": True, "prompt_injection": "look",
                 "image_filename": "x.png", "context_files": [str(tmp_path / "a.txt")]}


def test_unknown_tool_404(make_binding):
    assert make_binding().execute_tool("tool_nope", {}) == {"error": "Tool 'tool_nope' not found.",
                                                            "status_code": 404}


def test_tool_exception_500_with_traceback_and_worker_kept(make_binding):
    b = make_binding()
    pid = b.execute_tool("tool_whoami", {})["output"]["pid"]
    r = b.execute_tool("tool_raise", {"message": "bad"})
    assert r["status_code"] == 500 and r["error"] == "Tool 'tool_raise' crashed: bad"
    assert "ValueError: bad" in r["traceback"]
    assert b.execute_tool("tool_whoami", {})["output"]["pid"] == pid


def test_object_the_protocol_cannot_carry_arrives_as_its_repr(make_binding):
    b = make_binding()
    b.execute_tool("tool_increment", {"step": 5})
    r = b.execute_tool("tool_unpicklable", {})
    assert r["status_code"] == 200 and r["output"].startswith("<unlocked _thread.lock object")
    assert b.execute_tool("tool_increment", {})["output"] == 6


def test_unsendable_result_500_names_library_and_tool_worker_kept(make_binding):
    b = make_binding()
    b.execute_tool("tool_increment", {"step": 5})
    r = b.execute_tool("tool_too_deep", {})
    assert r["status_code"] == 500 and r["success"] is False
    assert "could not be sent to the host" in r["error"] and "nested deeper" in r["error"]
    assert "[stateful]" in r["error"] and "tool_too_deep" in r["error"]
    assert b.execute_tool("tool_increment", {})["output"] == 6


def test_functions_never_cross_to_the_host(make_binding):
    r = make_binding().execute_tool("tool_lambda_output", {})
    assert r["success"] and r["output"]["fn"].startswith("<function tool_lambda_output.<locals>.<lambda>")


def test_segfault_500_then_fresh_worker(make_binding):
    b = make_binding()
    b.register_tool_from_code("crash", "def tool_crash():\n    import ctypes\n    ctypes.string_at(0)\n")
    b.execute_tool("tool_increment", {"step": 4})
    r = b.execute_tool("tool_crash", {})
    assert r["status_code"] == 500 and "SIGSEGV" in r["error"] and "[crash]" in r["error"]
    assert "tool_crash" in r["error"]
    assert b.execute_tool("tool_crash", {})["status_code"] == 500      # a fresh worker, crashes again
    assert b.execute_tool("tool_increment", {})["output"] == 5         # other library untouched


def test_dynamic_tools_run_in_a_worker_not_the_host(make_binding):
    b = make_binding()
    code = ("import os\n"
            "def tool_fib(n: int) -> dict:\n"
            "    '''Fibonacci.'''\n"
            "    a, b = 0, 1\n"
            "    for _ in range(int(n)): a, b = b, a + b\n"
            "    return {'success': True, 'output': [a, os.getpid()]}\n"
            "HOST_PID_AT_IMPORT = os.getpid()\n")
    assert b.register_tool_from_code("fib", code)
    spec = next(t for t in b.discovered_tools if t["name"] == "tool_fib")
    assert spec["input_schema"]["required"] == ["n"]
    value, pid = b.execute_tool("tool_fib", {"n": 10})["output"]
    assert value == 55 and pid != os.getpid()
    assert "lcp_dynamic_fib" not in sys.modules
    assert b.unregister_tools_by_prefix("fib") == 1
    assert b.execute_tool("tool_fib", {"n": 1})["status_code"] == 404
    assert not any(s["library"] == "fib" for s in b.stats())
    assert gone(pid)


def test_register_bad_code_returns_false(make_binding):
    b = make_binding()
    assert b.register_tool_from_code("bad", "def tool_x(:\n") is False
    assert b.register_tool_from_code("none", "x = 1\n") is False


@pytest.mark.parametrize("top", ["raise RuntimeError('no')", "import no_such_module_anywhere",
                                 "import sys\nsys.exit(3)"])
def test_register_code_failing_at_import_is_refused_like_upstream(make_binding, top):
    from lollms_client.tools_bindings.lcp import LCPBinding
    code = f"{top}\n\ndef tool_never() -> dict:\n    return {{'success': True, 'output': 1}}\n"
    b = make_binding()
    upstream = LCPBinding(tools_folders=[])
    if "sys.exit" not in top:                      # upstream lets SystemExit escape to its caller
        assert upstream.register_tool_from_code("bad", code) is False
    assert b.register_tool_from_code("bad", code) is False
    assert "tool_never" not in {t["name"] for t in b.discover_tools()}
    assert b.execute_tool("tool_never", {})["status_code"] == 404
    assert not any(s["library"] == "bad" and s["pid"] for s in b.stats())      # its worker was stopped


def test_register_refused_code_keeps_the_previous_registration(make_binding):
    b = make_binding()
    assert b.register_tool_from_code("v", "def tool_v() -> dict:\n    return {'success': True, 'output': 1}\n")
    assert b.register_tool_from_code("v", "raise ValueError('broken')\ndef tool_v():\n    pass\n") is False
    assert b.execute_tool("tool_v", {})["output"] == 1


def test_close_leaves_no_process(libs, tmp_path, new_processes):
    fds_before = len(os.listdir("/proc/self/fd"))
    b = SandboxedBinding(tools_folders=[libs], workspace=str(tmp_path))
    b.execute_tool("tool_increment", {})
    b.execute_tool("tool_other_get", {})
    assert len(new_processes()) >= 3          # zygote + 2 workers
    b.close()
    assert new_processes() == set()
    assert len(os.listdir("/proc/self/fd")) == fds_before       # no socket, pipe or epoll left open
    r = b.execute_tool("tool_increment", {})
    assert r["status_code"] == 503 and "closed" in r["error"]


def test_context_manager_closes(libs, tmp_path, new_processes):
    with SandboxedBinding(tools_folders=[libs], workspace=str(tmp_path)) as b:
        b.execute_tool("tool_increment", {})
        assert new_processes()
    assert new_processes() == set()


def test_workers_exit_when_host_is_killed(libs, tmp_path):
    """A host process SIGKILLed mid-life leaves no zygote, worker or tool child behind."""
    import subprocess
    script = (f"import sys, os; sys.path.insert(0, {str(REPO)!r})\n"
              "from lcp_sandbox import SandboxedBinding\n"
              f"b = SandboxedBinding(tools_folders=[{str(libs)!r}], workspace={str(tmp_path)!r})\n"
              "print(b.execute_tool('tool_whoami', {})['output']['pid'], flush=True)\n"
              "print(b.execute_tool('tool_other_get', {})['output']['pid'], flush=True)\n"
              "print(b.execute_tool('tool_leave_child', {'new_session': True})['output'], flush=True)\n"
              "sys.stdin.read()\n")
    host = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pids = [int(host.stdout.readline()) for _ in range(3)]     # 2 workers + a tool's escaped child
    family = [psutil.Process(host.pid)] + psutil.Process(host.pid).children(recursive=True)
    assert all(psutil.pid_exists(p) for p in pids)
    host.kill()
    host.wait()
    gone, alive = psutil.wait_procs(family, timeout=10)
    assert alive == []


def test_proxies_forward_comparisons_and_paths(make_binding):
    """Path(tool_context.workspace_path) and enum comparisons work as in-process."""
    import enum

    class Mode(enum.Enum):
        STREAM = 1
        QUIET = 2

    class Context:
        event_mode = Mode.STREAM
        workspace_path = Path("/srv/ws")
        other_path = Path("/srv/zz")

    code = ("from pathlib import Path\n"
            "def tool_ctx_probe(tool_context=None):\n"
            "    '''Probes a proxied context.'''\n"
            "    m = tool_context.event_mode\n"
            "    return {'success': True, 'output': [str(Path(tool_context.workspace_path)),\n"
            "            m == tool_context.event_mode, m != tool_context.event_mode, hash(m) == hash(m),\n"
            "            tool_context.workspace_path < tool_context.other_path,\n"
            "            tool_context.workspace_path >= tool_context.other_path]}\n")
    b = make_binding()
    b.register_tool_from_code("ctx", code)
    r = b.execute_tool("tool_ctx_probe", {}, tool_context=Context())
    assert r["output"] == ["/srv/ws", True, False, True, True, False]


def test_load_tool_file_and_discover_local_tools(make_binding, libs):
    """The private LCPBinding methods lollms calls (chat(tools=[file]), personalities)."""
    b = make_binding(tools_folders=[libs / "other"])
    assert "tool_marker" not in {t["name"] for t in b.discovered_tools}
    assert b._load_tool_file(libs / "sideeffect" / "sideeffect.py") == 1
    assert b.execute_tool("tool_marker", {})["output"] == "hello"
    b._discover_local_tools()
    assert "tool_marker" in {t["name"] for t in b.discovered_tools}
    assert b._load_tool_file(libs / "missing.py") == 0
