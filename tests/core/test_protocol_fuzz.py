"""Property-based: random and mutated frames against the host's decoder and state machine.

The state-machine tests replace the zygote by a fake one whose "workers" are
threads of the test process speaking the protocol on the real socket: they
send READY, then whatever hypothesis chose in answer to a call, then hang up.
Whatever they send, ``execute_tool`` returns an LCP result, no code of the
worker's choosing runs in the host, and the next call gets its own result.
"""
import os
import pickle
import socket
import threading
import uuid
from collections import deque
from concurrent.futures import Future
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcp_sandbox import CrashPolicy, SandboxedBinding, Supervisor
from lcp_sandbox import protocol as P
from lcp_sandbox.backends.local import supervisor as supervisor_module
from lcp_sandbox.protocol.framing import Connection

MARKER = Path(os.environ.get("TMPDIR", "/tmp")) / f"lcp-fuzz-marker-{uuid.uuid4().hex}"


class Bomb:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


def frame(kind: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + bytes([kind]) + payload


def good_result(value) -> bytes:
    return P.Encoder(repr).encode(P.RESULT, [{"output": value, "status_code": 200, "success": True}, P.OK, ""])


# ------------------------------------------------------------------ the decoder alone
plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4)
    | st.tuples(inner, inner) | st.frozensets(st.integers(), max_size=4),
    max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(kind=st.sampled_from([P.READY, P.RESULT, P.REQUEST, P.REPLY, 0, 77]), payload=st.binary(max_size=300))
def test_decoder_raises_only_protocol_violations_on_random_bytes(kind, payload):
    try:
        P.parse_from_worker(kind, payload, P.Decoder())
    except P.BadMessage:
        pass
    assert not MARKER.exists()


@settings(max_examples=300, deadline=None)
@given(value=plain, flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
       cut=st.integers(0, 10_000))
def test_decoder_on_mutated_valid_results(value, flips, cut):
    body = bytearray(P.Encoder(repr).encode(P.RESULT, [value, P.OK, ""])[5:])
    assert P.parse_from_worker(P.RESULT, bytes(body), P.Decoder()).value == value    # round trip
    for pos, byte in flips:
        if body:
            body[pos % len(body)] = byte
    try:
        P.parse_from_worker(P.RESULT, bytes(body[:cut]), P.Decoder())
    except P.BadMessage:
        pass


def _round_trip(value):
    body = P.Encoder(repr).encode(P.RESULT, [value, P.OK, ""])[5:]
    return P.parse_from_worker(P.RESULT, body, P.Decoder()).value


def test_the_standard_librarys_value_types_travel_as_themselves():
    """The encoder finds these by their type's module name (the modules are imported only
    where a value of theirs is): each comes back equal and of its own type."""
    import datetime
    import decimal
    from pathlib import PurePosixPath, PureWindowsPath

    class TmpPosixPath(type(Path())):           # a PosixPath of a subclass: sent as a PosixPath
        pass
    now = datetime.datetime(2026, 12, 6, 12, 30, 5, 123456, tzinfo=datetime.timezone.utc)
    values = [now, now.date(), now.time(), datetime.timedelta(days=-2, seconds=5, microseconds=7),
              decimal.Decimal("-1.50E+3"), uuid.UUID(int=0x1234), Path("/tmp/a b/\udcff")]
    back = _round_trip(values)
    assert back == values and [type(v) for v in back] == [type(v) for v in values]
    assert type(_round_trip(TmpPosixPath("/x"))) is type(Path()) and _round_trip(TmpPosixPath("/x")) == Path("/x")
    assert _round_trip(PurePosixPath("/y")) == Path("/y")
    # Not sent as a path: a Windows path; nor as itself: a type of those modules with no code
    assert _round_trip(PureWindowsPath("c:/y")) == repr(PureWindowsPath("c:/y"))
    assert _round_trip(datetime.timezone.utc) == repr(datetime.timezone.utc)


def test_a_class_whose_module_name_is_odd_is_converted_not_a_failure():
    """A tool's class may make its __module__ anything (unhashable, or raising): the
    encoder hands such an object to its converter, as any other object."""
    class Listed:
        __module__ = ["datetime"]               # type: ignore[assignment]

    class Meta(type):
        @property
        def __module__(cls):
            raise RuntimeError("no module")

    class Raising(metaclass=Meta):
        pass
    assert _round_trip(Listed()).startswith("<")
    assert _round_trip(Raising()).startswith("<")


def test_decoder_never_unpickles():
    bomb = pickle.dumps((Bomb(), 0, ""), protocol=5)
    for kind in (P.RESULT, P.REQUEST, P.REPLY, P.READY):
        with pytest.raises(P.BadMessage):
            P.parse_from_worker(kind, bomb, P.Decoder())
    assert not MARKER.exists()


def test_colliding_keys_are_capped():
    prime = (1 << 61) - 1                     # ints k * prime all hash alike
    keys = [k * prime for k in range(P.MAX_HASHED + 1)]
    body = P.Encoder(repr).encode(P.RESULT, [{"output": set(keys), "status_code": 200, "success": True},
                                             P.OK, ""])[5:]
    with pytest.raises(P.BadMessage, match="non-string keys"):
        P.parse_from_worker(P.RESULT, body, P.Decoder())
    ok = P.Encoder(repr).encode(P.RESULT, [{1: "a", (2, 3): "b"}, P.OK, ""])[5:]
    assert P.parse_from_worker(P.RESULT, ok, P.Decoder()).value == {1: "a", (2, 3): "b"}


def test_a_result_carries_an_outcome_there_is_and_nothing_else():
    """The outcomes are an IntEnum; on the wire plain ints, each checked."""
    def body(outcome) -> bytes:
        value = ["ValueError", ["x"]] if outcome == P.RAISED else None
        return msgpack.packb([value, outcome, ""])
    for outcome in P.Outcome:
        got = P.parse_from_worker(P.RESULT, body(int(outcome)), P.Decoder()).outcome
        assert got == outcome and type(got) is int
    for bad in (-1, len(P.Outcome), 1 << 40, True, 0.0, "0", None):
        with pytest.raises(P.BadMessage, match="malformed RESULT"):
            P.parse_from_worker(P.RESULT, body(bad), P.Decoder())


# ------------------------------------------------------------------ the state machine
SCRIPTS: deque = deque()          # what the next fake worker answers to each call


class FakeZygote:
    """Stands in for the zygote: each 'worker' is a thread speaking on the real socket."""

    def __init__(self, on_exit=None) -> None:
        self.alive = True
        self.pid = os.getpid()
        self._on_exit = on_exit
        self._cond = threading.Condition()
        self._exits: dict = {}
        self._socks: dict = {}
        self._next = 1 << 30

    owed = False                   # no worker forked ahead: every start forks, nothing to replace

    def take(self) -> None:
        return None

    def fork(self, sock_fd: int, log_fd: int, pidns: bool = False) -> Future:
        sock = socket.socket(fileno=os.dup(sock_fd))
        log = os.dup(log_fd)
        self._next += 1
        pid = self._next
        self._socks[pid] = sock
        threading.Thread(target=self._serve, args=(pid, sock, log), daemon=True).start()
        fut: Future = Future()
        fut.set_result(pid)
        return fut

    def _serve(self, pid: int, sock: socket.socket, log: int) -> None:
        conn = Connection(sock)                                   # (a worker's end, blocking)
        try:
            conn.recv_frame()                                     # INIT
            if SCRIPTS and SCRIPTS[0] == "no ready":
                SCRIPTS.popleft()
            else:
                sock.sendall(P.Encoder(repr).encode(P.READY, [{"env": "fake"}]))
            while True:
                conn.recv_frame()                                 # a CALL
                script = SCRIPTS.popleft()
                if isinstance(script, tuple) and script[0] == "good":
                    sock.sendall(good_result(script[1]))
                    continue
                if isinstance(script, tuple) and script[0] == "bytewise":
                    for i in range(len(script[1])):               # one write per byte
                        sock.sendall(script[1][i:i + 1])
                    continue
                sock.sendall(script)
                break                                             # then hang up
        except (OSError, EOFError, IndexError):
            pass
        finally:
            os.close(log)
            self._exit(pid)

    def _exit(self, pid: int) -> None:
        sock = self._socks.pop(pid, None)
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
        with self._cond:
            self._exits[pid] = -9
            self._cond.notify_all()
        if self._on_exit:
            self._on_exit(pid, -9)

    def kill(self, pid: int) -> None:
        self._exit(pid)

    def signal(self, pid: int, sig: int) -> None:
        pass

    def wait_exit(self, pid: int, timeout: float):
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits, timeout)
            return self._exits.pop(pid, None)

    def close(self, timeout: float = 5.0) -> None:
        for pid in list(self._socks):
            self._exit(pid)
        self.alive = False


@pytest.fixture(scope="module")
def fake_binding(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setattr(supervisor_module, "ZygoteClient", FakeZygote)
    if os.environ.get("LCP_SANDBOX_START_METHOD") == "spawn":
        # The forced spawn run: the host reads the fuzzed frames as it reads a spawned
        # worker's, with the portable connection (the fake stands in for the zygote).
        mp.setattr(P, "Connection", P.PortableConnection)
    libs = tmp_path_factory.mktemp("fuzzlibs")
    (libs / "fuzz.py").write_text("def tool_fuzz() -> dict:\n    '''Fuzzed.'''\n    return {}\n")
    sup = Supervisor(crash_policy=CrashPolicy(fresh_deaths=10**9, deaths=10**9),   # no quarantine
                     start_method="zygote")
    b = SandboxedBinding(tools_folders=[libs], supervisor=sup, workspace=str(libs), timeout_s=5,
                         host_tool_configs={"fuzz": {"sandbox": {"grace_s": 0.2}}})
    yield b
    b.close()
    sup.close()
    mp.undo()


def valid_frames():
    values = plain
    return st.one_of(
        st.builds(lambda v: P.Encoder(repr).encode(P.RESULT, [v, P.OK, ""]), values),
        st.builds(lambda o, r, n, a: P.Encoder(repr).encode(P.REQUEST, [o, r, n, a, {}]),
                  st.integers(-2, 9), st.one_of(st.integers(-1, 5), st.sampled_from(["confirm", "ui", "x"])),
                  st.one_of(st.none(), st.sampled_from(["__class__", "name", "_x", "eq"])),
                  st.lists(values, max_size=2)),
        st.builds(lambda v: P.Encoder(repr).encode(P.REPLY, [True, v]), values),
        st.builds(lambda v: P.Encoder(repr).encode(P.READY, [v]), values),
        st.builds(lambda k: frame(k, pickle.dumps((Bomb(), 0, ""))), st.integers(0, 12)),
    )


def mutate(data: bytes, flips: list, cut: int) -> bytes:
    body = bytearray(data)
    for pos, byte in flips:
        if body:
            body[pos % len(body)] = byte
    return bytes(body[:cut])


scripts = st.one_of(
    st.binary(max_size=64),
    st.lists(valid_frames(), min_size=1, max_size=3).map(b"".join),
    st.builds(mutate, st.lists(valid_frames(), min_size=1, max_size=2).map(b"".join),
              st.lists(st.tuples(st.integers(0, 500), st.integers(0, 255)), max_size=3),
              st.integers(0, 600)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(script=scripts, token=st.integers(0, 10**9))
def test_any_frames_give_an_lcp_result_and_no_desync(fake_binding, script, token):
    SCRIPTS.clear()
    SCRIPTS.extend([script, ("good", token)])
    r = fake_binding.execute_tool("tool_fuzz", {})
    assert isinstance(r, dict) and isinstance(r.get("status_code"), int)
    assert r["status_code"] in (200, 500, 504)
    assert not MARKER.exists()
    if r["status_code"] != 200:
        assert r["success"] is False and "[fuzz]" in r["error"]
    SCRIPTS.clear()
    SCRIPTS.append(("good", token))
    again = fake_binding.execute_tool("tool_fuzz", {})
    assert again == {"output": token, "status_code": 200, "success": True}


def test_result_before_ready_is_a_violation(fake_binding):
    SCRIPTS.clear()
    fake_binding.execute_tool("tool_fuzz", {})               # whatever state: start from a dead worker
    SCRIPTS.clear()
    SCRIPTS.extend(["no ready", good_result("early"), ("good", 1)])
    r = fake_binding.execute_tool("tool_fuzz", {})
    assert r["status_code"] == 500 and "protocol violation" in r["error"] and "kind 10" in r["error"]
    SCRIPTS.clear()
    SCRIPTS.append(("good", 2))
    assert fake_binding.execute_tool("tool_fuzz", {})["output"] == 2


def test_a_frame_split_over_many_writes_is_read_whole(fake_binding):
    SCRIPTS.clear()
    SCRIPTS.append(("good", 3))
    assert fake_binding.execute_tool("tool_fuzz", {})["output"] == 3
    SCRIPTS.append(("bytewise", good_result("x" * 70_000)))      # over the 64 KiB large-frame path too
    assert fake_binding.execute_tool("tool_fuzz", {})["output"] == "x" * 70_000
    SCRIPTS.append(("bytewise", good_result(4)))
    assert fake_binding.execute_tool("tool_fuzz", {})["output"] == 4


def test_a_worker_gone_mid_frame_is_a_death_not_a_desync(fake_binding):
    SCRIPTS.clear()
    SCRIPTS.extend([good_result("cut")[:9], ("good", 5)])
    r = fake_binding.execute_tool("tool_fuzz", {})
    assert r["status_code"] == 500 and "fresh worker" in r["error"]
    SCRIPTS.clear()
    SCRIPTS.append(("good", 6))
    assert fake_binding.execute_tool("tool_fuzz", {})["output"] == 6
