"""Faults of every family: the host survives, results never cross, nothing is left behind."""
import asyncio
import logging
import os
import random
import threading
import time

import psutil
import pytest
from conftest import FIXTURES, SPAWN, fork_only, gone, poll, wait_gone

from lcp_sandbox import CrashPolicy, SandboxedBinding, Supervisor


@pytest.fixture
def b(make_binding):
    """A binding with a short timeout; other's state is set so each test can check it survived."""
    binding = make_binding(timeout_s=1.0)
    assert binding.execute_tool("tool_other_set", {"value": "keep me"})["success"]
    assert binding.execute_tool("tool_set_state", {"value": "before"})["success"]
    return binding


def after_fault(b, state_kept: bool) -> None:
    """The same library and another library answer; other's state survived."""
    r = b.execute_tool("tool_get_state", {})
    assert r["success"]
    assert r["output"]["value"] == ("before" if state_kept else "initial")
    assert b.execute_tool("tool_other_get", {})["output"]["value"] == "keep me"


def stat(b, library):
    return next(s for s in b.stats() if s["library"] == library)


@pytest.mark.parametrize("tool,params,signal_name", [
    ("tool_segfault", {}, "SIGSEGV"),
    ("tool_abort", {}, "SIGABRT"),
    ("tool_os_exit", {"code": 3}, "exited with code 3"),
])
def test_worker_death(b, tool, params, signal_name):
    pid = b.execute_tool("tool_get_state", {})["output"]["pid"]
    r = b.execute_tool(tool, params)
    assert r["status_code"] == 500 and r["success"] is False
    assert signal_name in r["error"] and "[faults]" in r["error"] and tool in r["error"]
    assert "fresh worker" in r["error"]
    after_fault(b, state_kept=False)
    s = stat(b, "faults")
    assert s["restarts"] == 1 and s["pid"] != pid and signal_name in s["last_exit"]


def test_killed_by_a_person_while_idle(b):
    pid = b.execute_tool("tool_get_state", {})["output"]["pid"]
    psutil.Process(pid).kill()
    assert wait_gone(pid, 5)                     # (a person kills it; its parent reaps it)
    # the death is noticed; the next call runs on a fresh worker with init re-run
    after_fault(b, state_kept=False)
    assert stat(b, "faults")["last_exit"] == "was killed by SIGKILL"


def test_init_rerun_with_same_config_after_crash(make_binding):
    b = make_binding(host_tool_configs={"stateful": {"mode": "x"}})
    first = b.execute_tool("tool_whoami", {})["output"]
    # kill stateful's worker from outside
    psutil.Process(first["pid"]).kill()
    assert wait_gone(first["pid"], 5)
    second = b.execute_tool("tool_whoami", {})["output"]
    assert second["pid"] != first["pid"] and second["init_calls"] == 1
    assert b.execute_tool("tool_config", {})["output"]["plain"] == {"mode": "x"}


def test_killed_right_after_its_last_call(make_binding):
    # Back-to-back calls skip the liveness check (the warm path): a worker killed in that
    # moment, before the zygote's word of its death arrives, is found dead only when the call
    # is sent.  It never got the call, so the call runs on a fresh worker, as it would have
    # had the death been seen first.  (The test holds the zygote's word back.)
    b = make_binding(host_tool_configs={"stateful": {"mode": "x"}})
    first = b.execute_tool("tool_whoami", {})["output"]
    zygote = b.supervisor._zygote
    heard, held = zygote._on_exit, []
    zygote._on_exit = lambda pid, status: held.append((pid, status))
    try:
        psutil.Process(first["pid"]).kill()
        assert poll(lambda: any(pid == first["pid"] for pid, _ in held), 5)    # reaped
        slot = next(s for s in b.supervisor._slots.values() if s.library.name == "stateful")
        assert slot.proc.exit_status is None   # the supervisor has not heard of it
        slot.last_used = time.monotonic()      # as if its last call had just ended
        r = b.execute_tool("tool_whoami", {})
    finally:
        zygote._on_exit = heard
        for pid, status in held:
            heard(pid, status)
    assert r["status_code"] == 200, r
    assert r["output"]["pid"] != first["pid"] and r["output"]["init_calls"] == 1
    s = stat(b, "stateful")
    assert s["restarts"] == 1 and s["last_exit"] == "was killed by SIGKILL"


@pytest.mark.parametrize("tool,params,text", [
    ("tool_sys_exit", {"code": 4}, "crashed: 4"),
    ("tool_keyboard_interrupt", {}, "crashed: pressed"),
    ("tool_recurse", {"depth": 100000}, "maximum recursion depth"),
    ("tool_fail", {"message": "planned"}, "crashed: planned"),
])
def test_tool_errors_keep_the_worker(b, tool, params, text):
    pid = b.execute_tool("tool_get_state", {})["output"]["pid"]
    r = b.execute_tool(tool, params)
    assert r["status_code"] == 500 and text in r["error"] and "traceback" in r
    after_fault(b, state_kept=True)
    assert b.execute_tool("tool_get_state", {})["output"]["pid"] == pid


def test_busy_loop_soft_timeout_keeps_state(b):
    pid = b.execute_tool("tool_get_state", {})["output"]["pid"]
    t0 = time.monotonic()
    r = b.execute_tool("tool_busy", {"seconds": 30}, timeout_s=0.5)
    assert time.monotonic() - t0 < 10
    assert r["status_code"] == 504
    assert "timed out after 0.5 s" in r["error"] and "kept" in r["error"] and "[faults]" in r["error"]
    after_fault(b, state_kept=True)
    assert b.execute_tool("tool_get_state", {})["output"]["pid"] == pid


@fork_only("the soft timeout as a signal from the zygote, which wakes a tool blocked in C "
           "(a spawned worker's interrupt is seen between bytecodes: test_spawn.py)")
def test_python_sleep_is_interrupted_softly(b):
    r = b.execute_tool("tool_sleep", {"seconds": 30}, timeout_s=0.3)
    assert r["status_code"] == 504 and "kept" in r["error"]
    after_fault(b, state_kept=True)


@pytest.mark.parametrize("tool", ["tool_c_sleep", "tool_stubborn"])
def test_hard_timeout_replaces_the_worker(b, tool):
    pid = b.execute_tool("tool_get_state", {})["output"]["pid"]
    t0 = time.monotonic()
    r = b.execute_tool(tool, {"seconds": 30}, timeout_s=0.3)
    assert time.monotonic() - t0 < 15
    assert r["status_code"] == 504
    assert "did not stop" in r["error"] and "replaced" in r["error"] and "state was lost" in r["error"]
    assert gone(pid)
    after_fault(b, state_kept=False)


def test_timeout_from_host_config_and_disabled(make_binding):
    b = make_binding(timeout_s=0.3, host_tool_configs={"faults": {"sandbox": {"timeout_s": 5}}})
    assert b.execute_tool("tool_busy", {"seconds": 0.6})["success"]          # library's 5 s wins
    assert b.execute_tool("tool_busy", {"seconds": 0.6}, timeout_s=0.2)["status_code"] == 504
    assert b.execute_tool("tool_busy", {"seconds": 0.4}, timeout_s=0)["success"]   # 0 disables


def test_time_waiting_for_the_host_does_not_count(make_binding):
    def slow_handler(*a):
        time.sleep(1.0)          # a person thinking; longer than the tool's timeout
        return ("allow", "")

    b = make_binding(timeout_s=0.5, confirm_handler=slow_handler)
    r = b.execute_tool("tool_confirm", {"shape": "tuple"})
    assert r["success"] and r["output"] == ["allow", ""]


def test_memory_error_from_kernel_limit_507_worker_kept(make_binding):
    b = make_binding(host_tool_configs={"faults": {"sandbox": {"memory_mb": 300}}})
    b.execute_tool("tool_set_state", {"value": "before"})
    b.execute_tool("tool_other_set", {"value": "keep me"})
    pid = b.execute_tool("tool_get_state", {})["output"]["pid"]
    r = b.execute_tool("tool_memory_hog", {"mb": 2048, "catch": True})
    assert r["success"] and "caught MemoryError" in r["output"]
    r = b.execute_tool("tool_memory_hog", {"mb": 2048})
    assert r["status_code"] == 507 and "300" in r["error"] and "kept" in r["error"]
    assert r["error"].startswith("[faults] tool 'tool_memory_hog' ran out of memory: an allocation failed")
    assert "()" not in r["error"] and ": ;" not in r["error"]          # no empty detail slot
    assert b.execute_tool("tool_get_state", {})["output"] == {"value": "before", "pid": pid}
    assert b.execute_tool("tool_other_get", {})["output"]["value"] == "keep me"
    assert psutil.Process().memory_info().rss < 1024 * 1048576      # the host never held it


def test_memory_watchdog_kills_the_tree_507(make_binding):
    b = make_binding(host_tool_configs={"faults": {"sandbox": {"memory_mb": 250}}})
    b.execute_tool("tool_other_set", {"value": "keep me"})
    r = b.execute_tool("tool_spawn_hogs", {"count": 3, "mb": 120, "seconds": 20})
    assert r["status_code"] == 507
    assert "memory limit of 250 MB" in r["error"] and "observed" in r["error"]
    assert "replaced" in r["error"]
    assert b.execute_tool("tool_get_state", {})["output"]["value"] == "initial"
    assert b.execute_tool("tool_other_get", {})["output"]["value"] == "keep me"
    s = stat(b, "faults")
    assert s["peak_rss"] > 250 * 1048576


@pytest.mark.parametrize("new_session", [False, pytest.param(True, marks=pytest.mark.skipif(
    SPAWN, reason="fork-only (zygote path): the zygote, a subreaper, kills orphans that left "
                  "their dead worker's session; a spawned worker's end kills its group"))])
def test_children_die_with_their_worker(b, new_session):
    child = b.execute_tool("tool_leave_child", {"new_session": new_session})["output"]
    assert psutil.pid_exists(child)
    b.execute_tool("tool_segfault", {})
    try:
        proc = psutil.Process(child)
    except psutil.NoSuchProcess:
        proc = None                              # already gone
    if proc is not None:
        gone, alive = psutil.wait_procs([proc], timeout=5)
        assert alive == []
    after_fault(b, state_kept=False)


def test_non_daemon_thread_left_running(make_binding, new_processes):
    b = make_binding()
    assert b.execute_tool("tool_leave_thread", {})["success"]
    assert b.execute_tool("tool_token", {"token": "t"})["output"]["token"] == "t"
    b.close()
    assert new_processes() == set()


def test_huge_result_refused_worker_kept(b):
    pid = b.execute_tool("tool_get_state", {})["output"]["pid"]
    r = b.execute_tool("tool_big_result", {"mb": 300}, timeout_s=60)
    assert r["status_code"] == 500 and "over the 64 MB cap" in r["error"] and "kept" in r["error"]
    assert r["error"].startswith("[faults] tool 'tool_big_result': its result is ")    # library and tool
    assert b.execute_tool("tool_get_state", {})["output"]["pid"] == pid
    after_fault(b, state_kept=True)


def test_print_flood_is_bounded_in_the_host_log(make_binding, caplog):
    b = make_binding(timeout_s=60)
    with caplog.at_level(logging.INFO, logger="lcp_sandbox.tool.faults"):
        r = b.execute_tool("tool_print_flood", {"mb": 10})
        assert r == {"output": "printed", "status_code": 200, "success": True}
        assert b.execute_tool("tool_token", {"token": "after"})["output"]["token"] == "after"
        b.close()           # drains the output pipes
    records = [rec for rec in caplog.records if rec.name == "lcp_sandbox.tool.faults"]
    logged = sum(len(rec.getMessage()) for rec in records if rec.levelno == logging.INFO)
    assert 0 < logged < 3 * 1048576                      # bounded, far below 10 MB
    assert any("dropped" in rec.getMessage() for rec in records)


def test_resource_limits_in_the_worker(make_binding):
    b = make_binding(host_tool_configs={"faults": {"sandbox": {
        "max_open_files": 64, "max_file_size_mb": 1, "cpu_s": 100}}})
    lim = b.execute_tool("tool_limits", {})["output"]
    assert lim["core"] == 0 and lim["nofile"] == 64 and lim["fsize"] == 1048576 and lim["cpu"] == 100
    opened = b.execute_tool("tool_open_files", {})["output"]
    assert opened["opened"] < 64 and opened["error"] == "OSError"
    r = b.execute_tool("tool_write_file", {"mb": 4})
    assert r["success"] is False and "File too large" in r["error"]
    assert b.execute_tool("tool_token", {"token": "x"})["success"]


def test_a_tool_cannot_lift_its_own_limits(make_binding):
    b = make_binding(memory_mb=400, host_tool_configs={"faults": {"sandbox": {
        "max_open_files": 64, "max_file_size_mb": 1, "cpu_s": 100}}})
    assert b.execute_tool("tool_raise_limits", {})["output"] == {
        "RLIMIT_NOFILE": True, "RLIMIT_FSIZE": True, "RLIMIT_DATA": True, "RLIMIT_CPU": False}
    # (RLIMIT_CPU keeps one second of slack between SIGXCPU and SIGKILL: the soft limit moves by 1 s at most)
    assert b.execute_tool("tool_limits", {})["output"]["cpu"] <= 101


def test_cpu_cap_kills_the_worker(make_binding):
    b = make_binding(timeout_s=30, host_tool_configs={"faults": {"sandbox": {"cpu_s": 1}}})
    r = b.execute_tool("tool_busy", {"seconds": 10})
    assert r["status_code"] == 500 and ("SIGXCPU" in r["error"] or "SIGKILL" in r["error"])
    assert b.execute_tool("tool_token", {"token": "x"})["success"]


def test_crash_loop_quarantine(libs, tmp_path):
    sup = Supervisor(crash_policy=CrashPolicy(fresh_deaths=3, backoff_s=0.5))
    b = SandboxedBinding(tools_folders=[FIXTURES / "crashlibs", libs], workspace=str(tmp_path), supervisor=sup)
    try:
        for _ in range(3):
            r = b.execute_tool("tool_never", {})
            assert r["status_code"] == 500 and "SIGSEGV" in r["error"]
        starts = stat(b, "import_segfault")["restarts"]
        r = b.execute_tool("tool_never", {})
        assert r["status_code"] == 503 and "quarantined" in r["error"] and "retried in" in r["error"]
        assert stat(b, "import_segfault")["restarts"] == starts            # no fork happened
        assert stat(b, "import_segfault")["state"] == "quarantined"
        assert b.execute_tool("tool_increment", {})["success"]             # others served
        deadline = time.monotonic() + 10
        while stat(b, "import_segfault")["state"] == "quarantined" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.execute_tool("tool_never", {})["status_code"] == 500      # retried after backoff
        r = b.execute_tool("tool_never", {})
        assert r["status_code"] == 503                                     # and quarantined again
    finally:
        b.close()
        sup.close()


def test_library_failing_to_load(make_binding):
    b = make_binding(tools_folders=[FIXTURES / "crashlibs"])
    r = b.execute_tool("tool_never_exit", {})
    assert r["status_code"] == 500 and "sys.exit(3)" in r["error"] and "import_exit" in r["error"]
    r = b.execute_tool("tool_never_raise", {})
    assert r["status_code"] == 500 and "database unreachable" in r["error"]
    assert "loaded again on the next call" in r["error"]
    r2 = b.execute_tool("tool_never_raise", {})
    assert r2["status_code"] == 500 and "database unreachable" in r2["error"]   # retried
    assert stat(b, "import_raise")["state"] != "quarantined"


def test_raising_host_handler(make_binding):
    def handler(*a):
        raise ConnectionError("ui went away")

    b = make_binding(confirm_handler=handler)
    b.execute_tool("tool_other_set", {"value": "keep me"})
    r = b.execute_tool("tool_confirm", {"shape": "argv"})
    assert r["status_code"] == 500 and "ui went away" in r["error"]
    assert "ConnectionError" in r["traceback"]
    assert b.execute_tool("tool_increment", {})["success"]
    assert b.execute_tool("tool_other_get", {})["output"]["value"] == "keep me"


def test_other_libraries_proceed_while_one_is_replaced(make_binding):
    b = make_binding()
    b.execute_tool("tool_token", {"token": "warm"})
    b.execute_tool("tool_other_get", {})
    done = {}

    def stuck():
        b.execute_tool("tool_stubborn", {"seconds": 30}, timeout_s=0.3)
        done["stuck"] = time.monotonic()

    t = threading.Thread(target=stuck)
    t.start()
    for i in range(20):
        assert b.execute_tool("tool_other_set", {"value": str(i)})["output"] == str(i)
    done["other"] = time.monotonic()
    t.join(30)
    assert done["other"] < done["stuck"]


def test_asyncio_callers_each_get_their_own_result(make_binding):
    b = make_binding()

    async def main():
        calls = [b.aexecute_tool("tool_token", {"token": f"t{i}"}) for i in range(60)]
        calls += [b.aexecute_tool("tool_other_set", {"value": f"v{i}"}) for i in range(20)]
        return await asyncio.gather(*calls)

    results = asyncio.run(main())
    assert [r["output"]["token"] for r in results[:60]] == [f"t{i}" for i in range(60)]
    assert [r["output"] for r in results[60:]] == [f"v{i}" for i in range(20)]


def test_soak_with_injected_faults(make_binding):
    """8 threads, 2,400 calls, about 5% faults: every success matches its own request."""
    b = make_binding(timeout_s=5)
    rng = random.Random(1234)
    plan = []
    for i in range(2400):
        x = rng.random()
        kind = "segfault" if x < 0.01 else "raise" if x < 0.05 else "echo"
        plan.append((i, kind, rng.choice(["tool_token", "tool_other_set"])))
    chunks = [plan[i::8] for i in range(8)]
    errors = []

    def run(chunk):
        for i, kind, tool in chunk:
            if kind == "segfault":
                r = b.execute_tool("tool_segfault", {})
                ok = r["status_code"] == 500 and "SIGSEGV" in r["error"]
            elif kind == "raise":
                r = b.execute_tool("tool_fail", {"message": f"m{i}"})
                ok = r["status_code"] == 500 and r["error"].endswith(f"m{i}")
            elif tool == "tool_token":
                r = b.execute_tool("tool_token", {"token": f"tok{i}"})
                ok = r.get("success") and r["output"]["token"] == f"tok{i}"
            else:
                r = b.execute_tool("tool_other_set", {"value": f"val{i}"})
                ok = r.get("success") and r["output"] == f"val{i}"
            if not ok:
                errors.append((i, kind, r))

    threads = [threading.Thread(target=run, args=(c,)) for c in chunks]
    [t.start() for t in threads]
    [t.join(300) for t in threads]
    assert errors == []
    assert stat(b, "faults")["restarts"] == sum(1 for p in plan if p[1] == "segfault")


@fork_only("the zygote and its parent-death signal")
def test_zygote_killed_workers_follow_and_service_resumes(make_binding):
    """Workers die with the zygote (parent-death signal); the next call starts a new zygote."""
    b = make_binding()
    pid = b.execute_tool("tool_token", {"token": "a"})["output"]["pid"]
    other = b.execute_tool("tool_other_get", {})["output"]["pid"]
    zygote = psutil.Process(pid).parent()
    assert zygote.pid == psutil.Process(other).parent().pid != os.getpid()
    zygote.kill()
    gone, alive = psutil.wait_procs([zygote, psutil.Process(pid), psutil.Process(other)], timeout=10)
    assert alive == []
    r = b.execute_tool("tool_token", {"token": "b"})
    assert r["success"] and r["output"]["token"] == "b" and r["output"]["pid"] != pid
    assert psutil.Process(r["output"]["pid"]).parent().pid != zygote.pid
    assert b.execute_tool("tool_other_get", {})["success"]


@fork_only("the zygote")
@pytest.mark.skipif(os.geteuid() != 0, reason="a confined cold start (it forks at once) needs root")
def test_a_call_whose_worker_the_zygote_died_before_forking_is_sent_again(open_tmp):
    """A confined cold start asks the zygote for a fork and sends the call at once; the
    zygote dies before it forks: no worker ever read the call, so it goes to a worker of a
    new zygote and is answered (before, the engine's own ZygoteGone came out of execute_tool)."""
    with Supervisor(confine=True) as sup:
        b = SandboxedBinding(tools_folders=[FIXTURES / "libs"], workspace=str(open_tmp),
                             supervisor=sup)
        assert b.execute_tool("tool_token", {"token": "a"})["success"]
        zygote = psutil.Process(sup.stats()[0]["pid"]).parent()
        zygote.suspend()
        got: list = []
        caller = threading.Thread(
            target=lambda: got.append(b.execute_tool("tool_other_get", {})))
        try:
            caller.start()
            # (busy is set once its worker was made: the fork is asked by then, unanswered)
            assert poll(lambda: any(r["library"] == "other" and r["state"] == "busy"
                                    for r in sup.stats()), timeout=30)
        finally:
            zygote.kill()
        caller.join(60)
        assert got, "execute_tool raised instead of answering"
        assert got[0]["success"], got[0]
        row = next(r for r in sup.stats() if r["library"] == "other")
        assert psutil.Process(row["pid"]).parent().pid != zygote.pid
        b.close()


def test_closing_the_supervisor_during_a_call_says_so(libs, tmp_path):
    import threading

    from lcp_sandbox import Supervisor
    sup = Supervisor()
    b = SandboxedBinding(tools_folders=[libs], workspace=str(tmp_path), supervisor=sup, timeout_s=60)
    b.execute_tool("tool_token", {"token": "warm"})
    results = []
    t = threading.Thread(target=lambda: results.append(b.execute_tool("tool_sleep", {"seconds": 30})))
    t.start()
    while not any(s["state"] == "busy" for s in sup.stats()):
        threading.Event().wait(0.01)                       # until the call is running in its worker
    sup.close()
    t.join(30)
    r = results[0]
    assert r["status_code"] == 503 and "[faults] tool 'tool_sleep' was stopped" in r["error"]
    assert "supervisor was closed" in r["error"] and "unknown reason" not in r["error"]
    b.close()
