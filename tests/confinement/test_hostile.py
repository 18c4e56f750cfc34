"""A hostile worker attacks the host: every attack must fail.

Each test runs a tool of tests/fixtures/hostile_libs/hostile in a real (by default
confined) worker and asserts: no code ran in the host (the marker file the
attack would write is absent), the call returned with the right code, and the
next call of that library (a fresh worker) and of another library is correct.
"""
import os
import time
import uuid
from pathlib import Path

import psutil
import pytest
from conftest import FIXTURES
from support.confined_kinds import KINDS, Confined

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox import protocol as P

HOSTILE = FIXTURES / "hostile_libs"


@pytest.fixture(scope="module", params=KINDS)
def confined(request, open_tmp_module):
    """Confined workers of one start kind (confined_kinds.py: fresh, from a base, from
    the library's template) for the whole module."""
    c = Confined(request.param, open_tmp_module / request.param)
    yield c
    c.close()


@pytest.fixture
def hostile(confined):
    made = []

    def make(tenant: str = "mallory", **kw):
        b = confined.binding(HOSTILE, tenant + uuid.uuid4().hex[:6], timeout_s=20, **kw)
        made.append(b)
        return b

    yield make
    for b in made:
        confined.check(b)


def marker_path(tmp_path) -> str:
    # Outside every confinement root: only the host (or an unconfined process) could write it.
    d = Path(os.environ.get("TMPDIR", "/tmp")) / f"lcp-hostile-{uuid.uuid4().hex}"
    return str(d)


def worker_pid(b: SandboxedBinding, library: str = "hostile") -> int:
    """The pid the host knows a library's worker by (a fresh confined worker calls itself 2
    in a PID namespace of its own)."""
    return next(s["pid"] for s in b.stats() if s["library"] == library)


def assert_recovered(b: SandboxedBinding, old_pid) -> None:
    r = b.execute_tool("tool_ok", {"x": 7})
    assert r["status_code"] == 200 and r["output"]["x"] == 7
    assert worker_pid(b) != old_pid                            # a fresh worker
    c = b.execute_tool("tool_count", {})
    assert c["status_code"] == 200 and c["output"]["calls"] >= 1


def violation(r: dict, tool: str) -> None:
    assert r["status_code"] == 500 and r["success"] is False
    assert "protocol violation" in r["error"] and "[hostile]" in r["error"] and tool in r["error"]
    assert "killed" in r["error"]


def frame_hex(payload: bytes) -> str:
    return payload.hex()


# ----------------------------------------------------------------- 1. code in the host
def test_pickle_bomb_as_result_runs_nothing_in_the_host(hostile, tmp_path):
    b = hostile()
    marker = marker_path(tmp_path)
    assert b.execute_tool("tool_ok", {})["success"]
    pid = worker_pid(b)
    r = b.execute_tool("tool_pickle_bomb", {"marker": marker, "kind": P.RESULT})
    violation(r, "tool_pickle_bomb")
    assert not os.path.exists(marker)
    assert_recovered(b, pid)


@pytest.mark.parametrize("kind", [P.REQUEST, P.REPLY, P.READY])
def test_pickle_bomb_as_any_other_frame_runs_nothing(hostile, tmp_path, kind):
    b = hostile()
    marker = marker_path(tmp_path)
    r = b.execute_tool("tool_pickle_bomb", {"marker": marker, "kind": kind})
    violation(r, "tool_pickle_bomb")
    assert not os.path.exists(marker)
    assert_recovered(b, None)


def test_object_with_a_reducer_arrives_as_text(hostile, tmp_path):
    b = hostile()
    marker = marker_path(tmp_path)
    r = b.execute_tool("tool_evil_result", {"marker": marker})
    assert r["status_code"] == 200 and isinstance(r["output"], str) and "Evil object" in r["output"]
    assert not os.path.exists(marker)


# ----------------------------------------------------------------- 2. walking host objects
class Lent:
    """What a host might lend: a callback, and (carelessly) a module, a class, a C function."""

    def __init__(self) -> None:
        import sys
        self.mod = os
        self.cls = SandboxedBinding
        self.fn = os.system
        self.frame = sys._getframe()
        self.items = [1, os]
        self.name = "ctx"

    def callback(self, x):
        return f"called {x}"


def test_host_objects_give_no_way_out(tmp_path, open_tmp):
    marker = marker_path(tmp_path)
    evil_cmd = f"echo x > {marker}"
    attempts = [
        [P.OP_GETATTR, "ctx", "__class__", []],
        [P.OP_METHOD, "ctx", "__reduce_ex__", [2]],
        [P.OP_GETATTR, "ctx", "_private", []],
        [P.OP_GETATTR, "ctx", "mod", []],
        [P.OP_GETATTR, "ctx", "cls", []],
        [P.OP_GETATTR, "ctx", "fn", []],
        [P.OP_METHOD, "ctx", "fn", [evil_cmd]],
        [P.OP_GETATTR, "ctx", "frame", []],
        [P.OP_GETATTR, "ctx", "items", []],
        [P.OP_OPERATOR, "ctx", "getattr", ["__class__"]],
        [P.OP_CALL, "confirm", None, ["x"]],
        [P.OP_GETATTR, "confirm", "__globals__", []],
        [P.OP_CALL, ["cfg", "bystander", "secret"], None, []],
        [P.OP_CALL, ["cfg", "hostile", "not_set"], None, []],
        [P.OP_CALL, 999, None, []],
        [P.OP_METHOD, "ctx", "callback", [5]],                 # the legitimate use still works
    ]
    seen = []
    configs = {"bystander": {"secret": lambda: seen.append("bystander's secret ran") or "secret"}}
    # (a workspace its uid may reach without a mount namespace: a default container has none)
    with SandboxedBinding(tools_folders=[HOSTILE], workspace=str(open_tmp), host_tool_configs=configs,
                          confine=True, timeout_s=20) as b:
        r = b.execute_tool("tool_walk", {"attempts": attempts}, tool_context=Lent())
    assert r["status_code"] == 200, r
    out = r["output"]
    assert [kind for kind, _ in out[:15]] == [
        "AttributeError", "AttributeError", "AttributeError", "PermissionError", "PermissionError",
        "PermissionError", "PermissionError", "PermissionError", "PermissionError", "AttributeError",
        "RuntimeError", "AttributeError", "PermissionError", "PermissionError", "RuntimeError"], out
    assert "no handler is configured" in out[10][1]
    assert "not a host object lent to library 'hostile'" in out[12][1]
    assert out[15] == ["ok", "'called 5'"]
    assert not os.path.exists(marker) and seen == []


# ----------------------------------------------------------------- 3. host paths
def test_second_ready_naming_another_tenants_folder_deletes_nothing(hostile, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    import msgpack
    ready = msgpack.packb([{"tmpdir": str(victim), "env": "clean"}])
    b = hostile()
    r = b.execute_tool("tool_raw", {"frames": [[P.READY, frame_hex(ready)]]})
    violation(r, "tool_raw")
    b.close()
    assert (victim / "precious.txt").read_text() == "keep me"


# ----------------------------------------------------------------- 4. sizes
def test_huge_announced_frame_is_refused_before_allocation(hostile):
    b = hostile()
    me = psutil.Process()
    before = me.memory_info().rss
    header = (600 * 1024 * 1024).to_bytes(4, "big") + bytes([P.RESULT])
    r = b.execute_tool("tool_raw", {"frames": [["bytes", header.hex()]]})
    violation(r, "tool_raw")
    assert "over the" in r["error"] and "cap" in r["error"]
    assert me.memory_info().rss - before < 100 * 1024 * 1024
    assert_recovered(b, None)


def test_huge_request_frame_is_refused(hostile):
    b = hostile()
    header = (P.REQUEST_CAP + 1).to_bytes(4, "big") + bytes([P.REQUEST])
    r = b.execute_tool("tool_raw", {"frames": [["bytes", header.hex()]]})
    violation(r, "tool_raw")
    assert_recovered(b, None)


# ----------------------------------------------------------------- 5. time
def test_trickling_worker_cannot_hold_the_call_past_its_deadline(hostile):
    b = hostile(host_tool_configs={"hostile": {"sandbox": {"grace_s": 0.5}}})
    t0 = time.monotonic()
    r = b.execute_tool("tool_trickle", {"total": 300, "delay": 0.1}, timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert r["status_code"] == 504 and "did not stop" in r["error"]
    assert elapsed < 15            # the trickle alone would take 30 s
    assert_recovered(b, None)


class Big:
    big = "x" * (32 * 1024 * 1024)


def test_worker_that_stops_reading_cannot_block_the_hosts_send(hostile):
    b = hostile(host_tool_configs={"hostile": {"sandbox": {"grace_s": 0.5}}})
    t0 = time.monotonic()
    r = b.execute_tool("tool_ask_and_stop_reading", {}, tool_context=Big(), timeout_s=1.0)
    assert time.monotonic() - t0 < 15                  # the worker would hold it for 120 s
    assert r["status_code"] in (500, 504) and r["success"] is False
    assert "[hostile]" in r["error"] and "tool_ask_and_stop_reading" in r["error"]
    assert_recovered(b, None)


class Ctx:
    ANSWER_S = 0.006                # longer than the 5 ms of each answer that count
    COUNTED_S = 0.005

    def __init__(self):
        self.items = {}
        self.answers = 0

    def __setitem__(self, key, value):
        self.items[key] = value

    def __bool__(self):
        self.answers += 1
        if self.answers > 1000:     # (a stretched deadline: end the flood, fail the test)
            raise RuntimeError("the flood outlived its deadline")
        end = time.perf_counter() + self.ANSWER_S
        while time.perf_counter() < end:
            pass
        return True


def test_a_flood_of_quick_requests_cannot_stretch_the_deadline(hostile):
    b = hostile(host_tool_configs={"hostile": {"sandbox": {"grace_s": 0.5}}})
    assert b.execute_tool("tool_ok", {}, timeout_s=60)["success"]      # its worker started
    ctx = Ctx()
    r = b.execute_tool("tool_request_flood", {}, tool_context=ctx, timeout_s=0.5)
    assert r["status_code"] == 504 and "did not stop" in r["error"], r
    # The first 5 ms of every answer count against the deadline, however busy the
    # machine: timeout and grace (1 s) leave room for 200 answers (150-201 measured here on
    # both start paths, idle or beside CPU burners; 250 leaves a quarter's margin). A read
    # of a request already there when the deadline had passed once went on (the spawn
    # path's connection): beside CPU burners, 350 answers. Were a slow answer's time not
    # counted at all, the flood would go on for ever (1000, then Ctx ends it and the
    # result is not the 504 asserted above).
    allowed = 1.25 / Ctx.COUNTED_S
    assert 0 < ctx.answers <= allowed, ctx.answers


def test_a_tool_callable_cannot_be_stored_in_a_host_object(hostile):
    b = hostile()
    ctx = Ctx()
    r = b.execute_tool("tool_store_callable", {}, tool_context=ctx)
    assert r["output"] == ["a callable of the tool cannot be stored in a host object"] * 2
    assert not hasattr(ctx, "hook") and ctx.items == {} and ctx.plain == 42


# ----------------------------------------------------------------- 6. desync
def test_garbage_frame_kills_the_worker_and_the_next_call_gets_its_own_result(hostile):
    b = hostile()
    r = b.execute_tool("tool_raw", {"frames": [[P.RESULT, "c1c1c1c1"]], "output": "first"})
    violation(r, "tool_raw")
    r2 = b.execute_tool("tool_raw", {"frames": [], "output": "second"})
    assert r2 == {"output": "second", "status_code": 200, "success": True}


@pytest.mark.parametrize("frames", [
    [[P.RESULT, "93"]],                                 # RESULT with a truncated array
    [[P.RESULT, "93c0cd0500a0"]],                       # unknown outcome 1280
    [[P.RESULT, "93c0ffa0"]],                           # negative outcome
    [[P.RESULT, "9301"]],                               # wrong arity
    [[P.REQUEST, "9507a7636f6e6669726dc09090"]],        # unknown op 7
    [[P.REQUEST, "9500c0c09090"]],                      # a ref that is None
    [[P.REPLY, "92c3c0"]],                              # a REPLY nobody asked for
    [[99, ""]],                                         # an unknown kind
    [[P.RESULT, "93c70301000000c0a0"]],                 # an unknown extension type... inside garbage
    [["bytes", "000000"]],                              # a header cut short, then the real result
])
def test_malformed_messages_are_violations(hostile, frames):
    b = hostile()
    r = b.execute_tool("tool_raw", {"frames": frames})
    violation(r, "tool_raw")
    assert_recovered(b, None)


def test_well_formed_result_that_is_not_an_lcp_result_is_a_violation(hostile):
    import msgpack
    b = hostile()
    r = b.execute_tool("tool_raw", {"frames": [[P.RESULT, msgpack.packb(["just text", 0, ""]).hex()]],
                                    "hang": True})
    violation(r, "tool_raw")
    assert "not an LCP result" in r["error"]


def test_timeout_outcome_nobody_signalled_is_a_violation(hostile):
    import msgpack
    b = hostile()
    r = b.execute_tool("tool_raw", {"frames": [[P.RESULT, msgpack.packb([None, P.TIMED_OUT, ""]).hex()]],
                                    "hang": True})
    violation(r, "tool_raw")
    assert "timeout nobody signalled" in r["error"]


def test_bytes_after_the_result_are_a_violation(hostile):
    import msgpack
    good = msgpack.packb([{"output": 1, "status_code": 200, "success": True}, 0, ""])
    b = hostile()
    data = len(good).to_bytes(4, "big") + bytes([P.RESULT]) + good + b"\x00"     # in one write
    r = b.execute_tool("tool_raw", {"frames": [["bytes", data.hex()]], "hang": True})
    violation(r, "tool_raw")
    assert "more after its RESULT" in r["error"]


def test_descriptors_a_worker_sends_on_its_channel_never_reach_the_host(hostile):
    """The host reads its channel as bytes: a descriptor sent with a frame (SCM_RIGHTS) is
    dropped by the kernel, never installed in the host, and the frame is read as any other."""
    import msgpack
    good = msgpack.packb([{"output": "forged", "status_code": 200, "success": True}, 0, ""])
    frame = len(good).to_bytes(4, "big") + bytes([P.RESULT]) + good
    name = f"lcp-offered-{uuid.uuid4().hex}"
    b = hostile()
    r = b.execute_tool("tool_offer_descriptors", {"frame": frame.hex(), "name": name})
    assert r == {"output": "forged", "status_code": 200, "success": True}, r
    assert not [f for f in psutil.Process().open_files() if name in f.path]
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    assert not [link for link in held if name in link], "a worker's descriptor is in the host"


def test_worker_speaking_while_idle_is_replaced_before_the_next_call(hostile):
    b = hostile()
    code = ("import os, socket, stat, struct, threading, time\n"
            "def _later():\n"
            "    time.sleep(0.2)\n"
            "    for fd in range(3, 4096):\n"
            "        try:\n"
            "            if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
            "                os.write(fd, struct.pack('!IB', 1, 10) + b'x'); break\n"
            "        except OSError: pass\n"
            "def tool_later() -> dict:\n"
            "    threading.Thread(target=_later).start()\n"
            "    return {'success': True, 'output': os.getpid()}\n")
    assert b.register_tool_from_code("later", code)
    assert b.execute_tool("tool_later", {})["success"]
    pid = worker_pid(b, "later")
    deadline = time.monotonic() + 10
    proc = psutil.Process(pid)
    row = next(s for s in b.stats() if s["library"] == "later")
    if row["protections"]["processes"].startswith("on (own PID namespace"):
        proc = proc.children()[0]              # the worker, beside its namespace's init
    idle = 2 if b.supervisor.start_method == "spawn" else 1    # (a spawned one's control thread)
    while time.monotonic() < deadline and proc.is_running():   # wait for its thread to have written
        try:
            if proc.num_threads() == idle:
                break
        except psutil.Error:
            break
        time.sleep(0.02)
    r = b.execute_tool("tool_later", {})
    assert r["status_code"] == 200 and worker_pid(b, "later") != pid


# ----------------------------------------------------------------- 7. the host's environment
def test_confined_worker_never_receives_the_host_environment(monkeypatch, tmp_path, hostile):
    """Neither in its environment nor anywhere in its memory (a scan of its own pages),
    whichever way it started; an unconfined worker of the same host has it (the scan works)."""
    head, tail = "LCPSECRET-" + uuid.uuid4().hex[:8], uuid.uuid4().hex
    monkeypatch.setenv("LCP_TEST_SECRET", head + tail)
    r = hostile().execute_tool("tool_scan_memory", {"head": head, "tail": tail})
    assert r["status_code"] == 200, r
    assert r["output"] == {"found": 0, "environ": False}
    with SandboxedBinding(tools_folders=[HOSTILE], workspace=str(tmp_path), confine=False,
                          timeout_s=60) as b:
        r = b.execute_tool("tool_scan_memory", {"head": head, "tail": tail})
    assert r["output"]["found"] >= 1 and r["output"]["environ"] is True    # the scan can find it


# ----------------------------------------------------------------- 8. the next zygote
def test_planted_package_in_a_confined_root_never_runs_in_the_next_zygote(monkeypatch, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.chdir(root)                         # the host's CWD is inside the confinement root
    marker = marker_path(tmp_path)
    with Supervisor(confine=True) as sup:
        with SandboxedBinding(tools_folders=[HOSTILE], supervisor=sup, workspace=str(root),
                              timeout_s=20) as b:
            r = b.execute_tool("tool_plant", {"marker": marker})
            assert r["status_code"] == 200 and (root / "lcp_sandbox" / "__init__.py").exists()
    with Supervisor(confine=True) as sup:            # a new zygote, started from the same CWD
        sup.start()
        with SandboxedBinding(tools_folders=[HOSTILE], supervisor=sup, workspace=str(root),
                              timeout_s=20) as b:
            assert b.execute_tool("tool_ok", {})["status_code"] == 200
    assert not os.path.exists(marker)


def test_the_zygote_runs_the_hosts_own_copy_of_the_engine(tmp_path):
    """Not whichever lcp_sandbox its sys.path would find first."""
    import shutil
    import subprocess
    import sys

    import lcp_sandbox
    copy = tmp_path / "copy"
    shutil.copytree(Path(lcp_sandbox.__file__).parent, copy / "lcp_sandbox",
                    ignore=shutil.ignore_patterns("__pycache__"))
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "where.py").write_text("import sys\ndef tool_where() -> dict:\n"
                                   "    return {'success': True, 'output': sys.modules['lcp_sandbox'].__path__[0]}\n")
    script = ("import sys; sys.path.insert(0, sys.argv[1])\n"
              "import lcp_sandbox\n"
              "from lcp_sandbox import SandboxedBinding\n"
              "with SandboxedBinding(tools_folders=[sys.argv[2]], workspace=sys.argv[2]) as b:\n"
              "    print(lcp_sandbox.__path__[0])\n"
              "    print(b.execute_tool('tool_where', {})['output'])\n")
    out = subprocess.run([sys.executable, "-c", script, str(copy), str(libs)], capture_output=True, text=True,
                         timeout=120)
    host_file, worker_file = out.stdout.split()[-2:]
    assert host_file.startswith(str(copy)) and worker_file == host_file, out.stdout + out.stderr
