"""The warm call path: spin-then-block waits (backends/local/spin.py) and what they must never do.

Spinning is bounded by a cap, learned from the slot's calls, off when as many
calls as usable CPUs are in flight, off when idle (the worker sleeps in a
blocking read once its window passed), never past a call's deadline, and
never longer because of anything a worker sends.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from concurrent.futures import Future

import pytest

from lcp_sandbox import protocol as P
from lcp_sandbox.backends.local import spin as S
from lcp_sandbox.backends.local.process import WorkerProcess
from lcp_sandbox.binding.objects import HostObjects
from lcp_sandbox.core.limits import Limits

SPIN_KEYS = {"host_window_us", "worker_window_us", "host_hits", "host_misses", "worker_hits",
             "worker_misses", "off_busy"}


def _state_and_runtime(pid: int) -> tuple[str, int]:
    """The process's scheduler state letter and its CPU time so far (ns, /proc schedstat)."""
    with open(f"/proc/{pid}/stat") as f:
        state = f.read().rpartition(")")[2].split()[0]
    with open(f"/proc/{pid}/schedstat") as f:
        return state, int(f.read().split()[0])


def _sleeping(pid: int, within_s: float = 10.0) -> bool:
    """Whether the process is seen asleep (S) within ``within_s`` (it may be preempted meanwhile)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if _state_and_runtime(pid)[0] == "S":
            return True
    return False


def _slot(b, library: str = "stateful") -> dict:
    return next(s for s in b.stats() if s["library"] == library)


# ---------------------------------------------------------------- the policy


def test_windows_are_capped_whatever_the_worker_answers():
    # A hostile worker picks its answer times: none of them makes either window pass the cap.
    policy = S.SpinPolicy()
    t = 100.0
    for service in (0.0, 1e-9, 5e-6, S.SPIN_CAP_S, 10.0, 0.0, 3e-4, 1e-6) * 20:
        host, worker_us = policy.plan(t, 1 if S.USABLE_CPUS > 1 else 0)
        assert 0.0 <= host <= S.SPIN_CAP_S and 0 <= worker_us <= S.SPIN_CAP_S * 1e6
        policy.answered(t, t + service, caught=host > 0 and service <= host)
        t += service + 1e-6


def test_spinning_turns_off_where_it_does_not_pay():
    # Calls that take longer than the cap (and long gaps between calls): no window at all.
    policy = S.SpinPolicy()
    t = 0.0
    for _ in range(30):
        policy.plan(t, 1)
        policy.answered(t, t + 0.01, caught=None)
        t += 1.0
    assert policy.plan(t, 1) == (0.0, 0)
    # ... and back on once the slot's calls are short and back to back again.
    for _ in range(30):
        policy.answered(t, t + 5e-6, caught=None)
        t += 10e-6
        host, worker_us = policy.plan(t, 1)
    assert 0 < host <= S.SPIN_CAP_S and 0 < worker_us <= S.SPIN_CAP_S * 1e6


@pytest.mark.skipif(S.USABLE_CPUS < 2, reason="one CPU: nothing ever spins")
def test_polls_that_keep_missing_pause_for_longer_and_longer():
    policy = S.SpinPolicy()
    t = 0.0
    windows = []
    for _ in range(40):                      # quick answers, yet never caught by the poll
        host, _ = policy.plan(t, 1)
        windows.append(host)
        policy.answered(t, t + 5e-6, caught=False if host else None)
        t += 10e-6
    polled = [i for i, w in enumerate(windows) if w]
    assert polled[:2] == [0, 1] and len(polled) < 10      # 2 misses, then pauses of 1, 2, 4, 8 ... calls
    gaps = [b - a for a, b in zip(polled, polled[1:])]
    assert gaps == sorted(gaps) and gaps[-1] > 4
    host, _ = policy.plan(t, 1)
    while not host:                          # a caught answer ends the pause
        policy.answered(t, t + 5e-6, caught=None)
        t += 10e-6
        host, _ = policy.plan(t, 1)
    policy.answered(t, t + 5e-6, caught=True)
    assert all(policy.plan(t + i, 1)[0] for i in range(1, 4))


def test_no_spinning_when_calls_in_flight_reach_the_cpus():
    policy = S.SpinPolicy()
    assert policy.plan(1.0, S.USABLE_CPUS) == (0.0, 0)
    assert policy.plan(2.0, S.USABLE_CPUS + 3) == (0.0, 0)
    assert policy.stats()["off_busy"] == 2 and policy.stats()["host_window_us"] == 0


def test_usable_cpus_follow_a_cgroup_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("50000 100000\n")            # cgroup v2: half a CPU
    assert S.usable_cpus(str(tmp_path)) == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")              # no quota
    assert S.usable_cpus(str(tmp_path)) == affinity
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()                                      # cgroup v1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert S.usable_cpus(str(tmp_path)) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert S.usable_cpus(str(tmp_path)) == affinity
    assert S.usable_cpus(str(tmp_path / "none")) == affinity


def test_in_flight_counts_each_call_once():
    flight = S.InFlight()
    assert flight.enter(1) == 1 and flight.enter(2) == 2
    flight.leave(1)
    assert flight.enter(3) == 2
    flight.leave(2)
    flight.leave(3)
    assert flight.enter(4) == 1


# ---------------------------------------------------------------- the connection


def test_spin_returns_on_the_first_bytes_and_on_hangup_and_gives_up_when_silent():
    a, b = P.pair()
    conn = P.Connection(a)
    try:
        assert conn.spin(time.monotonic() + 0.001) is False          # nothing came: it gave up
        b.send(b"\x00")                                              # one byte of a header...
        assert conn.spin(time.monotonic() + 60) is True              # ... ends the spin at once
        b.send(b"\x00\x00\x02" + bytes([P.RESULT]) + b"\x93")        # the rest of a 2-byte frame, cut short
        with pytest.raises(TimeoutError):                            # the read is bounded by its deadline
            conn.recv_frame(time.monotonic() + 0.05, {P.RESULT: 16})
        b.close()
        assert conn.spin(time.monotonic() + 60) is True              # hangup ends a spin too
    finally:
        conn.close()


class _FakeConn:
    """Stands in for a worker's connection: answers at once, records the spin's end."""

    def __init__(self) -> None:
        self.decoder = P.Decoder()
        self.broken = None
        self.until: list = []
        self.sent: list = []
        self.body = P.Encoder(repr).encode(P.RESULT, [{"output": 1, "status_code": 200, "success": True}, 0, ""])

    def send(self, kind, msg=(), deadline=None):
        self.sent.append((kind, tuple(msg)))

    def spin(self, until):
        self.until.append(until)
        return True

    def recv_frame(self, deadline=None, caps=None):
        return P.RESULT, self.body[5:]

    def pending(self):
        return False


def _fake_worker() -> tuple[WorkerProcess, _FakeConn]:
    forked: Future = Future()
    forked.set_result(os.getpid())
    conn = _FakeConn()
    proc = WorkerProcess(forked, None, conn)   # type: ignore[arg-type]
    proc.ready = True
    return proc, conn


def test_the_host_spin_ends_by_the_call_deadline_and_the_cap():
    proc, conn = _fake_worker()
    call = P.Call("tool_x", 0, {}, "/", None, 0)
    for timeout in (None, 60.0, 1e-6):
        # A policy of its own each time: what an earlier call taught it (a slow answer on a
        # busy machine lengthens its estimate past the cap: no poll) is not what is tested.
        policy = S.SpinPolicy()
        before = time.monotonic()
        proc.exchange(call, HostObjects(lambda ref: None), Limits(), timeout, policy)
        after = time.monotonic()
        assert conn.until, "the host polls before it blocks"
        until = conn.until.pop()
        assert until <= after + S.SPIN_CAP_S
        if timeout:
            assert until <= after + timeout
        assert until >= before


def test_the_worker_gets_no_budget_when_the_cpus_are_taken():
    proc, conn = _fake_worker()
    policy = S.SpinPolicy()
    call = P.Call("tool_x", 0, {}, "/", None, 0)
    proc.exchange(call, HostObjects(lambda ref: None), Limits(), 60.0, policy)
    assert conn.sent[-1][1][-1] > 0, "a free machine: the worker polls for the next call"
    tokens = [object() for _ in range(S.USABLE_CPUS)]
    for t in tokens:
        S.calls_in_flight.enter(id(t))
    try:
        proc.exchange(call, HostObjects(lambda ref: None), Limits(), 60.0, policy)
    finally:
        for t in tokens:
            S.calls_in_flight.leave(id(t))
    assert conn.sent[-1][1][-1] == 0 and conn.until == [conn.until[0]]   # neither side spun
    assert policy.stats()["off_busy"] == 1


# ---------------------------------------------------------------- a real worker


def test_stats_report_the_spin_of_each_slot(make_binding):
    b = make_binding()
    for _ in range(20):
        assert b.execute_tool("tool_whoami", {})["status_code"] == 200
    spin = _slot(b)["spin"]
    assert set(spin) == SPIN_KEYS
    # the first call went to a worker not ready yet (no poll); every later one is counted
    assert spin["host_hits"] + spin["host_misses"] + spin["off_busy"] <= 19
    assert 0 <= spin["host_window_us"] <= S.SPIN_CAP_S * 1e6
    assert 0 <= spin["worker_window_us"] <= S.SPIN_CAP_S * 1e6


def test_an_idle_worker_sleeps_after_its_window(make_binding):
    b = make_binding()
    for _ in range(50):                       # back to back: both sides learn to poll
        b.execute_tool("tool_whoami", {})
    pid = _slot(b)["pid"]
    assert _sleeping(pid), "the worker still runs after its spin window"
    _, ran = _state_and_runtime(pid)
    threading.Event().wait(0.2)               # an interval to measure over, not a synchronization
    state, ran_after = _state_and_runtime(pid)
    assert state == "S" and ran_after == ran, "an idle worker used CPU"


def test_a_recreated_workspace_is_the_next_calls_cwd(make_binding, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    b = make_binding(workspace=str(ws))
    assert b.execute_tool("tool_whoami", {})["output"]["cwd"] == str(ws)
    shutil.rmtree(ws)
    ws.mkdir()                                # same path, another directory
    r = b.execute_tool("tool_touch", {"path": "marker"})
    assert r["status_code"] == 200 and r["output"] == str(ws)
    assert (ws / "marker").exists(), "the worker still stood in the removed directory"
    ws.rename(tmp_path / "old")               # moved away, with a new one in its place
    ws.mkdir()
    r = b.execute_tool("tool_touch", {"path": "marker2"})
    assert r["status_code"] == 200 and (ws / "marker2").exists() and not (tmp_path / "old" / "marker2").exists()


def test_a_slow_answer_ends_the_host_spin_at_its_window(make_binding, tmp_path):
    # The slot learned that its calls answer at once (set here: on a loaded machine it might
    # not have); then one takes long: the host's poll gives up within its window and the host
    # sleeps (or, with the CPUs taken, never polled); the call ends with its own result.
    b = make_binding()
    b.execute_tool("tool_whoami", {})
    slot = next(s for s in b.supervisor._slots.values() if s.library.name == "stateful")
    slot.spin.service = 1e-6
    before = _slot(b)["spin"]
    marker = tmp_path / "marker"
    threading.Timer(0.05, marker.touch).start()       # what the tool waits for, made a little later
    r = b.execute_tool("tool_wait_for", {"path": str(marker), "seconds": 30})
    assert r["status_code"] == 200
    after = _slot(b)["spin"]
    assert after["host_hits"] == before["host_hits"]
    assert (after["host_misses"] - before["host_misses"]) + (after["off_busy"] - before["off_busy"]) == 1
    assert after["host_window_us"] <= S.SPIN_CAP_S * 1e6
