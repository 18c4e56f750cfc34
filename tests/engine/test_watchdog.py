"""The watchdog's cost follows what is due, not how many workers are idle; what it
did before still happens: idle retirement at the deadline, the memory limit (507),
and stats() from samples rather than a /proc walk per worker."""
import threading
import time

import pytest
from conftest import FIXTURES, LIBS, poll

import lcp_sandbox.backends.local.slot as slot_module
from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local import watchdog

TENANT_LIBS = FIXTURES / "tenant_libs"
LIB_TOOLS = ("tool_lib_a_pid", "tool_lib_b_pid", "tool_lib_c_pid")


def start_idle(sup, tenants, tmp_path, **kw):
    """``tenants`` x 3 live workers, each called once; returns the bindings."""
    bindings = [SandboxedBinding(tools_folders=[str(TENANT_LIBS)], supervisor=sup, tenant=f"t{i}",
                                 workspace=str(tmp_path), **kw) for i in range(tenants)]
    for b in bindings:
        for tool in LIB_TOOLS:
            assert b.execute_tool(tool, {})["status_code"] == 200
    return bindings


def sampled(sup):
    """Every slot's after-call memory sample was taken and kept (nothing of it is still due,
    and the sample is newer than the last call: the watchdog marks a sample taken before it
    measures, so the mark alone comes a moment before the sample)."""
    return not any(sup._watchdog.sample_owed(s) or (s.proc is not None and s.mem_at < s.last_used)
                   for s in sup._slots.values())


def test_watchdog_sleeps_while_workers_idle_and_ticks_for_a_limited_call(tmp_path):
    with Supervisor(idle_timeout_s=600) as sup:
        start_idle(sup, 10, tmp_path)
        assert sup.pool_stats()["live_workers"] == 30
        assert poll(lambda: sampled(sup))
        dog = sup._watchdog
        before = dog.wakeups
        threading.Event().wait(0.5)                  # 10 sweeps of the old 50 ms watchdog
        assert dog.wakeups == before                 # 30 idle workers, nothing due: it slept

        limited = SandboxedBinding(tools_folders=[str(TENANT_LIBS)], supervisor=sup, tenant="t0",
                                   workspace=str(tmp_path),
                                   host_tool_configs={"lib_a": {"sandbox": {"memory_mb": 500}}})
        before = dog.wakeups
        assert limited.execute_tool("tool_lib_a_work", {"seconds": 0.5})["status_code"] == 200
        assert dog.wakeups > before                  # it sampled the call while it ran
        s = next(s for s in limited.stats() if s["library"] == "lib_a")
        assert s["peak_uss"] > 0 and s["uss"] > 0


def test_idle_deadline_moves_with_calls_and_comes_back_after_a_restart(tmp_path):
    events = []
    with Supervisor(idle_timeout_s=0.3, on_event=events.append) as sup:
        b = SandboxedBinding(tools_folders=[str(TENANT_LIBS)], supervisor=sup, workspace=str(tmp_path))
        # busy past its idle deadline: not retired during the call, the deadline moves to its end
        r = b.execute_tool("tool_lib_a_work", {"seconds": 1.0})
        assert r["status_code"] == 200
        lib_a = lambda: next(s for s in b.stats() if s["library"] == "lib_a")   # noqa: E731
        assert poll(lambda: lib_a()["state"] == "stopped")
        assert lib_a()["last_exit"] == "stopped after 0.3 s idle" and lib_a()["calls"] == 1
        # a new worker for the slot gets a new deadline
        assert b.execute_tool("tool_lib_a_pid", {})["status_code"] == 200
        assert lib_a()["state"] == "idle" and lib_a()["restarts"] == 1
        assert poll(lambda: lib_a()["state"] == "stopped")
        assert [e["event"] for e in events if e["library"] == "lib_a"] == ["start", "idle", "start", "idle"]


def test_memory_hungry_tool_is_killed_507_among_idle_workers(tmp_path):
    with Supervisor(idle_timeout_s=600) as sup:
        start_idle(sup, 5, tmp_path)
        b = SandboxedBinding(tools_folders=[str(LIBS)], supervisor=sup, workspace=str(tmp_path),
                             host_tool_configs={"faults": {"sandbox": {"memory_mb": 250}}})
        r = b.execute_tool("tool_spawn_hogs", {"count": 3, "mb": 120, "seconds": 20})
        assert r["status_code"] == 507
        assert "memory limit of 250 MB" in r["error"] and "observed" in r["error"]
        s = next(s for s in b.stats() if s["library"] == "faults")
        assert s["peak_uss"] > 250 * 1048576
        assert sup.pool_stats()["live_workers"] == 15          # the idle ones untouched


def test_stats_reads_proc_only_for_workers_called_since_their_sample(tmp_path, monkeypatch):
    reads = []
    real = slot_module.tree_memory
    monkeypatch.setattr(slot_module, "tree_memory", lambda pid: reads.append(pid) or real(pid))
    with Supervisor(idle_timeout_s=600) as sup:
        bindings = start_idle(sup, 8, tmp_path)
        assert poll(lambda: sampled(sup))
        rows = sup.stats()
        assert len(rows) == 24 and reads == []                 # all from the samples
        assert all(r["uss"] > 0 and r["rss"] >= r["uss"] and r["memory_age_s"] >= 0 for r in rows)
        pid = bindings[3].execute_tool("tool_lib_b_pid", {})["output"]
        rows = sup.stats()
        assert set(reads) <= {pid}                             # at most the one called since
        again = len(reads)
        sup.stats()
        assert len(reads) == again                             # and that once


@pytest.mark.parametrize("idle_timeout_s", [None, 600])
def test_template_eviction_is_scheduled_not_polled(tmp_path, idle_timeout_s):
    """No idle timeout: templates are never due; with one, only at their deadline."""
    with Supervisor(idle_timeout_s=idle_timeout_s) as sup:
        start_idle(sup, 3, tmp_path)
        assert poll(lambda: sampled(sup))
        assert all(t["state"] == "ok" for t in sup.pool_stats()["templates"])
        dog = sup._watchdog
        due = [at for at, _, what, _ in list(dog._heap) if what == watchdog._TICK]
        assert due == [] if idle_timeout_s is None else all(at > time.monotonic() + 500 for at in due)


def test_children_left_by_a_call_are_watched_against_the_limit(tmp_path):
    """A call returns at once; the processes it left take memory later, each under its own
    RLIMIT_DATA but together over memory_mb: the idle worker's tree is killed (507 recorded)."""
    from conftest import wait_gone
    with Supervisor(idle_timeout_s=600) as sup:
        b = SandboxedBinding(tools_folders=[str(FIXTURES / "watchdog_libs")], supervisor=sup,
                             workspace=str(tmp_path), host_tool_configs={"late_hogs": {"sandbox": {"memory_mb": 250}}})
        r = b.execute_tool("tool_late_hogs", {"count": 3, "mb": 120, "after_s": 1.5})
        assert r["status_code"] == 200
        stat = lambda: b.stats()[0]                                          # noqa: E731
        assert poll(lambda: stat()["pid"] is None)                          # killed while idle
        assert all(wait_gone(pid) for pid in r["output"]["children"])
        assert b.execute_tool("tool_late_hogs", {"count": 0})["status_code"] == 200      # a fresh worker
        s = stat()
        assert "memory limit of 250 MB" in s["last_exit"] and s["restarts"] == 1
