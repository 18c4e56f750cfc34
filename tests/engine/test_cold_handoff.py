"""How a cold start hands its INIT over: the worker forked ahead was primed with the
host's environment (never one a confined INIT takes), INIT is held by the connection
and sent with the call (one send), the replacement is asked for once the call is
answered, and the environment travels as bytes, as the worker sets it.  No timings."""
import os
import pickle
import time
from concurrent.futures import Future

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox import protocol as P
from lcp_sandbox.backends.local import zygote_client
from lcp_sandbox.backends.local.process import WorkerProcess
from lcp_sandbox.core.policy import host_environment
from lcp_sandbox.worker import confine

TOOL = '''
import os

def tool_env(name: str) -> dict:
    """A variable of the worker's environment."""
    return {"success": True, "output": {"pid": os.getpid(), "value": os.environ.get(name)}}
'''


def test_a_held_frame_goes_out_first_with_the_next_send():
    a, b = P.pair()
    host, worker = P.Connection(a), P.Connection(b)
    try:
        host.hold(P.SHUTDOWN, ("held",))
        host.send(P.CALL, ("first",))
        host.hold(P.SHUTDOWN, ("held again",))
        host.send_frame(P.CALL, b"x" * (1 << 17))         # a big frame: the held one still first
        got = [worker.recv_frame() for _ in range(4)]
    finally:
        host.close()
        worker.close()
    assert [k for k, _ in got] == [P.SHUTDOWN, P.CALL, P.SHUTDOWN, P.CALL]
    assert pickle.loads(got[0][1]) == ("held",) and pickle.loads(got[1][1]) == ("first",)
    assert got[3][1] == b"x" * (1 << 17)


def test_nothing_is_held_until_a_send():
    a, b = P.pair()
    host, worker = P.Connection(a), P.Connection(b)
    try:
        host.hold(P.SHUTDOWN, ("held",))
        assert not worker.readable_now()
    finally:
        host.close()
        worker.close()


def _env_call(sup, tmp_path, tenant):
    b = SandboxedBinding(tool_files=[str(tmp_path / "env_probe.py")], supervisor=sup, tenant=tenant,
                         workspace=str(tmp_path), host_tool_configs={"env_probe": {"sandbox": {"template": False}}})
    try:
        return b.execute_tool("tool_env", {"name": "LCP_HANDOFF_PROBE"})["output"]
    finally:
        b.close()


def _reserved_pid(zyg):
    deadline = time.monotonic() + 30
    while len(zyg._reserved) != zygote_client.RESERVED:
        assert time.monotonic() < deadline, "no worker was forked ahead"
        time.sleep(0.01)
    return zyg._reserved[0][2].result(10)


def test_the_reserved_worker_serves_with_its_held_init_and_is_replaced_after_the_call(tmp_path, monkeypatch):
    """...and INIT's environment wins over the one PRIME set before it was known."""
    (tmp_path / "env_probe.py").write_text(TOOL)
    with Supervisor() as sup:
        sup.start()
        zyg = sup._zygote
        reserved = _reserved_pid(zyg)
        monkeypatch.setenv("LCP_HANDOFF_PROBE", "first")         # not in its PRIME
        assert _env_call(sup, tmp_path, "a") == {"pid": reserved, "value": "first"}
        assert not zyg.owed                                      # the call's end asked for the replacement
        reserved = _reserved_pid(zyg)                            # primed with "first"
        monkeypatch.setenv("LCP_HANDOFF_PROBE", "changed")
        assert _env_call(sup, tmp_path, "b") == {"pid": reserved, "value": "changed"}
        reserved = _reserved_pid(zyg)                            # primed with "changed"
        monkeypatch.delenv("LCP_HANDOFF_PROBE")
        assert _env_call(sup, tmp_path, "c") == {"pid": reserved, "value": None}


class _StandIn:
    """A zygote that records whether a worker forked ahead was asked for."""

    def __init__(self):
        self.taken = 0

    def take(self):
        self.taken += 1
        return None

    def fork(self, sock_fd, log_fd, pidns=False):
        fut = Future()
        fut.set_result(0)
        return fut


class _Pump:
    def add(self, fd, library, bps):
        os.close(fd)


def test_a_confined_worker_never_gets_the_primed_worker_forked_ahead():
    zyg = _StandIn()
    init = P.Init("lib", [], "", {}, 0, [], {}, {"root": "/nonexistent", "read_paths": []}, None, [], {})
    proc = WorkerProcess.start(zyg, init, _Pump(), "lib", 0)
    proc.conn.close()
    assert zyg.taken == 0
    proc = WorkerProcess.start(zyg, init._replace(confine=None), _Pump(), "lib", 0)
    proc.conn.close()
    assert zyg.taken == 1


def test_the_host_environment_goes_as_bytes_and_a_worker_sets_exactly_it(monkeypatch):
    monkeypatch.setenv("LCP_HANDOFF_PROBE", "é 1")
    env = host_environment()
    assert env == dict(os.environb) and env[b"LCP_HANDOFF_PROBE"] == "é 1".encode()
    assert host_environment() is not env                  # a copy: a later change is not in it
    want = {**env, b"LCP_HANDOFF_ADDED": b"x"}
    del want[b"LCP_HANDOFF_PROBE"]
    try:
        confine.set_environment(want)
        assert dict(os.environb) == want and os.getenv("LCP_HANDOFF_PROBE") is None
        assert os.environ["LCP_HANDOFF_ADDED"] == "x"
    finally:
        os.environ.pop("LCP_HANDOFF_ADDED", None)


def test_a_library_env_goes_over_the_host_environment():
    init = P.Init("lib", [], None, {}, 0, None, {b"A": b"host", b"B": b"b"}, None, None, [], {"env": {"A": "lib", "C": 3}})
    assert confine.environment_of(init) == {b"A": b"lib", b"B": b"b", b"C": b"3"}


class _Signals:
    """A zygote that records the signals the host sends."""

    def __init__(self):
        self.sent = []

    def signal(self, pid, sig):
        self.sent.append((pid, sig))


def test_an_interrupt_before_the_host_read_ready_is_signalled_when_it_does():
    """A worker handed INIT with its call may be importing before the host has read its
    READY: interrupt() then holds the signal until READY (the worker's handler is set)."""
    from lcp_sandbox.backends.local.slot import Slot
    from lcp_sandbox.binding.objects import HostObjects
    from lcp_sandbox.core.discovery import Library
    from lcp_sandbox.core.limits import Limits

    host_end, worker_end = P.pair()
    zyg = _Signals()
    forked = Future()
    forked.set_result(4242)
    proc = WorkerProcess(forked, zyg, P.Connection(host_end))
    slot = Slot("t", Library("lib", [], ""), Limits())
    slot.proc = proc
    slot.begin_call()
    try:
        assert slot.interrupt() is True and zyg.sent == []          # not ready: held
        enc = P.Encoder(repr)
        worker_end.sendall(enc.encode(P.READY, [{}]) + enc.encode(P.RESULT, [None, P.TIMED_OUT, ""]))
        result = proc.exchange(P.Call("tool_x", 0, {}, "/", None, 0), HostObjects(lambda ref: None), Limits(), 30)
    finally:
        proc.conn.close()
        worker_end.close()
    assert zyg.sent == [(4242, P.SOFT_TIMEOUT_SIGNAL)]                 # sent on READY, once
    assert result.outcome == P.TIMED_OUT
