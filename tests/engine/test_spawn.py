"""The spawn start path (Supervisor(start_method="spawn")): what macOS and Windows run,
forced here on Linux.

Its parts: the portable connection (no MSG_DONTWAIT, SO_RCVTIMEO or poll), output
read by a thread per worker, the soft interrupt as a control record (no signal from
the host), the hard kill, memory, a host killed with SIGKILL, the spares of each
environment, fail-closed confinement, the start method's setting.
"""
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest
from conftest import REPO, wait_gone

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox import protocol as P
from lcp_sandbox.backends.local import platforms, spawn, spawned_child
from lcp_sandbox.core.limits import Limits


@pytest.fixture(scope="module")
def sup():
    s = Supervisor(start_method="spawn")
    yield s
    s.close()


@pytest.fixture
def b(sup, libs, tmp_path):
    binding = SandboxedBinding(tools_folders=[libs], workspace=str(tmp_path), supervisor=sup,
                               tenant=f"t-{tmp_path.name}", timeout_s=5)
    yield binding
    binding.close()


def row(binding, library="faults"):
    return next(s for s in binding.stats() if s["library"] == library)


# ------------------------------------------------------------------ choosing it
def test_the_start_method_comes_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.delenv(platforms.ENV_START_METHOD, raising=False)
    assert platforms.start_method() == "zygote"                      # Linux's default
    monkeypatch.setenv(platforms.ENV_START_METHOD, "spawn")
    assert platforms.start_method() == "spawn"
    assert platforms.start_method("zygote") == "zygote"             # the argument wins
    monkeypatch.setenv(platforms.ENV_START_METHOD, "forkserver")
    with pytest.raises(ValueError, match="LCP_SANDBOX_START_METHOD='forkserver'"):
        Supervisor()
    with pytest.raises(ValueError, match="start_method='fork'"):
        Supervisor(start_method="fork")
    monkeypatch.setattr(platforms, "SYSTEM", "darwin")
    monkeypatch.delenv(platforms.ENV_START_METHOD)
    assert platforms.start_method() == "spawn"                      # elsewhere's default
    with pytest.raises(ValueError, match="needs Linux"):
        platforms.start_method("zygote")


def test_confine_settings_are_checked():
    assert Limits(confine="best-effort").confine == "best-effort"
    with pytest.raises(ValueError, match="best-effort"):
        Limits(confine=1)                         # exactly True, False or "best-effort"
    with pytest.raises(ValueError, match="best-effort"):
        Limits(confine="maybe")
    with pytest.raises(ValueError, match="best-effort"):
        Supervisor(confine="yes", start_method="spawn")


# ------------------------------------------------------------------ the channel
def test_the_portable_connection_keeps_the_frame_rules():
    a, c = P.portable_pair()
    host, worker = P.PortableConnection(a), P.PortableConnection(c)
    try:
        worker.send_encoded(P.Encoder(repr).encode(P.READY, [{"x": "y"}]))
        kind, payload = host.recv_frame(time.monotonic() + 5, {P.READY: P.READY_CAP})
        assert P.parse_from_worker(kind, payload, host.decoder).report == {"x": "y"}
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):                        # a read ends by its deadline
            host.recv_frame(t0 + 0.1, {P.RESULT: 100})
        assert 0.09 < time.monotonic() - t0 < 2.0
        assert not host.readable_now()
        worker.send_encoded((1 << 20).to_bytes(4, "big") + bytes([P.RESULT]))
        with pytest.raises(P.BadMessage, match="over the 100-byte cap"):   # unread
            host.recv_frame(time.monotonic() + 5, {P.RESULT: 100})
        with pytest.raises(TimeoutError):                        # a peer that does not read
            host.send_frame(P.CALL, b"x" * (64 << 20), time.monotonic() + 0.3)
        assert host.broken
    finally:
        host.close()
        worker.close()
    assert worker.readable_now() or True                         # (closed: no exception)


@pytest.mark.parametrize("connection", ["Connection", "PortableConnection"])
def test_a_frame_already_there_does_not_extend_a_read_past_its_deadline(connection):
    # A busy host reads late, when the worker's next request is already there: were that
    # read exempt from the deadline, a flood of requests would hold the call for ever.
    a, c = P.portable_pair()
    host, worker = getattr(P, connection)(a), P.PortableConnection(c)
    try:
        worker.send_encoded(P.Encoder(repr).encode(P.READY, [{}]))   # (in host's buffer now)
        assert host.readable_now()
        with pytest.raises(TimeoutError):
            host.recv_frame(time.monotonic() - 0.001, {P.READY: P.READY_CAP})
        kind, _ = host.recv_frame(time.monotonic() + 5, {P.READY: P.READY_CAP})
        assert kind == P.READY                                       # (kept for a live read)
    finally:
        host.close()
        worker.close()


def test_a_large_frame_is_read_whole_through_the_portable_connection(b):
    r = b.execute_tool("tool_big_result", {"mb": 3})
    assert r["success"] and len(r["output"]) >= 3 * 1048576 - 64


# ------------------------------------------------------------------ workers
def test_a_spawned_worker_serves_calls_and_keeps_its_state(b, sup):
    assert b.execute_tool("tool_set_state", {"value": "kept"})["success"]
    r = b.execute_tool("tool_get_state", {})
    assert r["output"]["value"] == "kept"
    pid = r["output"]["pid"]
    assert psutil.Process(pid).ppid() == os.getpid()            # no zygote in between
    s = row(b)
    assert s["start"] == "spawn" and s["pid"] == pid and s["calls"] == 2
    assert s["protections"]["env"] == "host environment"
    assert sup.pool_stats()["templates"] == "fork-only"
    assert sup.pool_stats()["start_method"] == "spawn"


def test_tool_output_reaches_logging_through_a_thread_and_is_bounded(sup, libs, tmp_path, caplog):
    b = SandboxedBinding(tools_folders=[libs], workspace=str(tmp_path), supervisor=sup,
                         tenant="printer")
    with caplog.at_level(logging.INFO, logger="lcp_sandbox.tool.faults"):
        assert b.execute_tool("tool_print_flood", {"mb": 4})["success"]
        assert b.execute_tool("tool_get_state", {})["success"]         # the channel is clean
        b.close()                    # the worker's end: its output thread has drained the pipe
    records = [rec for rec in caplog.records if rec.name == "lcp_sandbox.tool.faults"]
    logged = sum(len(rec.getMessage()) for rec in records if rec.levelno == logging.INFO)
    assert 0 < logged < 2 * 1048576
    assert any("dropped" in rec.getMessage() for rec in records)
    caplog.clear()


def test_soft_interrupt_is_a_control_record_504_state_kept(b):
    assert b.execute_tool("tool_set_state", {"value": "before"})["success"]
    pid = row(b)["pid"]
    r = b.execute_tool("tool_busy", {"seconds": 20}, timeout_s=0.4)
    assert r["status_code"] == 504 and "kept" in r["error"]
    assert b.execute_tool("tool_get_state", {})["output"] == {"value": "before", "pid": pid}


def test_a_tool_blocked_in_c_is_killed_after_its_grace(b):
    """interrupt_main is seen between bytecodes only: time.sleep() does not see it."""
    pid = b.execute_tool("tool_get_state", {})["output"]["pid"]
    b.host_tool_configs["faults"] = {"sandbox": {"grace_s": 0.3}}
    b.discover_tools(force_refresh=True)
    r = b.execute_tool("tool_sleep", {"seconds": 20}, timeout_s=0.3)
    assert r["status_code"] == 504 and "killed" in r["error"]
    assert wait_gone(pid, 10)
    r = b.execute_tool("tool_get_state", {})
    assert r["output"]["value"] == "initial" and r["output"]["pid"] != pid


def test_interrupt_from_the_host_is_499_and_keeps_the_worker(b):
    import threading
    b.execute_tool("tool_get_state", {})
    results = []
    t = threading.Thread(target=lambda: results.append(b.execute_tool("tool_busy", {"seconds": 20})))
    t.start()
    deadline = time.monotonic() + 10
    while not b.interrupt(t.ident):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    t.join(10)
    assert results[0]["status_code"] == 499


def test_memory_limits_507(b):
    b.host_tool_configs["faults"] = {"sandbox": {"memory_mb": 250}}
    b.discover_tools(force_refresh=True)
    r = b.execute_tool("tool_memory_hog", {"mb": 2048})             # RLIMIT_DATA (Linux)
    assert r["status_code"] == 507 and "kept" in r["error"]
    r = b.execute_tool("tool_spawn_hogs", {"count": 3, "mb": 120, "seconds": 20})   # the watchdog
    assert r["status_code"] == 507 and "memory limit of 250 MB" in r["error"]
    assert b.execute_tool("tool_get_state", {})["success"]


# ------------------------------------------------------------------ host death
HOST = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from lcp_sandbox import SandboxedBinding, Supervisor
sup = Supervisor(start_method="spawn")
b = SandboxedBinding(tools_folders=[sys.argv[2]], supervisor=sup, workspace=sys.argv[3])
pid = b.execute_tool("tool_get_state", {})["output"]["pid"]
child = b.execute_tool("tool_leave_child", {})["output"]
print(pid, child, flush=True)
time.sleep(600)
"""


def test_a_host_killed_with_sigkill_leaves_no_worker(libs, tmp_path):
    host = subprocess.Popen([sys.executable, "-c", HOST, str(REPO), str(libs), str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        pid, child = map(int, host.stdout.readline().split())
        spares = [p.pid for p in psutil.Process(host.pid).children() if p.pid != pid]
        assert psutil.pid_exists(pid) and psutil.pid_exists(child)
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    for p in (pid, child, *spares):
        assert wait_gone(p, 10), f"process {p} outlived its host"


def _until(check, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _all_up(spawner, confined=False):
    with spawner._lock:
        return all(c.up() for c in spawner._spares[confined])


# ------------------------------------------------------------------ spares
def test_spares_are_kept_per_environment_and_never_mixed(monkeypatch, libs, open_tmp):
    monkeypatch.setenv("LCP_SPAWN_TEST_SECRET", "hunter2")
    s = Supervisor(start_method="spawn")
    try:
        s.start()
        spawner = s._zygote
        _until(lambda: spawner.stats()["spares"] == spawn.SPARES and _all_up(spawner),
               "the spares spawned ahead at start()")
        spare = spawner._spares[False][0].pid
        open_b = SandboxedBinding(tools_folders=[libs], supervisor=s, workspace=str(open_tmp))
        assert open_b.execute_tool("tool_get_state", {})["output"]["pid"] == spare   # taken
        ws = open_tmp / "confined"
        ws.mkdir()
        shut = SandboxedBinding(tools_folders=[libs], supervisor=s, workspace=str(ws),
                                confine=True, tenant="c")
        pid = shut.execute_tool("tool_get_state", {})["output"]["pid"]
        assert pid not in (spare, *[c.pid for c in spawner._spares[False]])
        environ = psutil.Process(pid).environ()
        assert "LCP_SPAWN_TEST_SECRET" not in environ            # not even in its process image
        assert psutil.Process(spare).environ()["LCP_SPAWN_TEST_SECRET"] == "hunter2"   # parity
        assert row(shut)["protections"]["filesystem"].startswith("on")   # confined as forked ones
        open_b.close()
        shut.close()
    finally:
        s.close()


def test_a_confined_worker_outlives_the_host_thread_that_started_it(sup, libs, open_tmp):
    """The parent-death signal follows the thread that created a child: a spawned worker
    must not carry one, or a host calling from a thread pool loses it after each call."""
    b = SandboxedBinding(tools_folders=[libs], supervisor=sup, workspace=str(open_tmp),
                         confine=True, tenant="thread-started")
    done = {}
    t = threading.Thread(target=lambda: done.setdefault(
        "r", b.execute_tool("tool_set_state", {"value": "kept"})))
    t.start()
    t.join(60)
    assert done["r"]["success"], done
    pid = row(b)["pid"]
    assert row(b)["protections"]["privileges"].startswith("uid ")
    assert b.execute_tool("tool_get_state", {})["output"]["value"] == "kept"
    assert row(b)["pid"] == pid and row(b)["restarts"] == 0
    b.close()


# ------------------------------------------------------------------ confinement elsewhere
def test_confinement_fails_closed_where_the_system_lacks_it(monkeypatch, libs, open_tmp):
    monkeypatch.setattr(platforms, "SYSTEM", "darwin")           # simulate a missing mechanism
    s = Supervisor(start_method="spawn")
    try:
        shut = SandboxedBinding(tools_folders=[libs], supervisor=s, workspace=str(open_tmp),
                                confine=True)
        r = shut.execute_tool("tool_get_state", {})
        assert r["status_code"] == 503 and "Landlock" in r["error"] and "darwin" in r["error"]
        assert "best-effort" in r["error"] and shut.stats()[0]["pid"] is None
        off = SandboxedBinding(tools_folders=[libs], supervisor=s, workspace=str(open_tmp),
                               host_tool_configs={"faults": {"sandbox": {"network": False}}})
        r = off.execute_tool("tool_get_state", {})
        assert r["status_code"] == 503 and "network namespaces" in r["error"]
        best = SandboxedBinding(tools_folders=[libs], supervisor=s, workspace=str(open_tmp),
                                confine="best-effort", tenant="best")
        assert best.execute_tool("tool_get_state", {})["success"]
        assert row(best)["protections"]                           # what is in force, said
        for binding in (shut, off, best):
            binding.close()
    finally:
        s.close()


def test_the_portable_prepare_says_what_is_missing(monkeypatch):
    from lcp_sandbox.worker import portable_prepare
    monkeypatch.setattr(sys, "platform", "darwin")
    env = {k.encode(): v.encode() for k, v in os.environ.items()}
    init = P.Init("lib", [], None, {}, 0, None, env, {"root": "/nowhere"}, None, [],
                  {"network": False})
    report = portable_prepare.prepare(init)
    assert report["filesystem"] == "unavailable (not on darwin)"
    assert report["network"].startswith("unavailable") and report["env"].startswith("clean")


def test_a_start_that_finds_no_spare_up_grows_the_reserve_which_shrinks_when_unused(monkeypatch):
    # Starts with no call answered between them (no settle(): nothing is replaced), so the
    # later ones find no spare up, as in a burst of new libraries, whatever the machine's speed.
    cpus = spawn.SPARES + 1
    monkeypatch.setattr(spawn, "usable_cpus", lambda: cpus)      # one spare per CPU
    spawner = spawn.Spawner(lambda pid, status: None)
    taken = []
    try:
        _until(lambda: spawner.stats()["spares"] == spawn.SPARES and _all_up(spawner),
               "the first spares up")
        taken += [spawner._take(False, None) for _ in range(spawn.SPARES)]
        assert spawner.stats()["misses"] == 0                    # each found one up
        # None left: the reserve is one per CPU, all spawned now; the first up is taken.
        taken.append(spawner._take(False, None))
        assert spawner.stats()["misses"] == 1
        assert spawner.stats()["reserve"]["unconfined"] == cpus
        assert spawner.stats()["spares"] == cpus - 1
        # Lean, as a burst's are (read from the command lines the host gave them).
        modes = {psutil.Process(c.pid).cmdline()[4].split()[-1] for c in spawner._spares[False]}
        assert modes == {"lean"}
        _until(lambda: _all_up(spawner), "the grown reserve up")
        taken += [spawner._take(False, None) for _ in range(cpus - 1)]
        assert spawner.stats()["misses"] == 1                    # each found one up
        # Another start that finds none up: the reserve stays one per CPU.
        taken.append(spawner._take(False, None))
        assert spawner.stats()["misses"] == 2
        assert spawner.stats()["reserve"]["unconfined"] == cpus
        assert spawner.stats()["spares"] == cpus - 1
        assert len({c.pid for c in taken}) == len(taken)         # each start its own process
        spawner.settle()                       # the call answered: the reserve is refilled
        _until(lambda: spawner.stats()["spares"] == cpus, "the reserve refilled")
        # Unused for SHRINK_AFTER_S: back to SPARES, the extra spares gone.
        extra = [c.pid for c in spawner._spares[False]][spawn.SPARES:]
        monkeypatch.setattr(spawn, "SHRINK_AFTER_S", 0.2)
        with spawner._cond:
            spawner._cond.notify()
        _until(lambda: spawner.stats()["reserve"]["unconfined"] == spawn.SPARES, "the shrink")
        _until(lambda: spawner.stats()["spares"] == spawn.SPARES, "the extra spares' end")
        assert extra and all(wait_gone(pid) for pid in extra)
    finally:
        for child in taken:
            child.kill()
        spawner.close()


def test_a_bursts_reserve_is_one_interpreter_per_cpu_within_bounds():
    assert [spawn.burst_reserve(n) for n in (1, 2, 4)] == [2, 2, 4]
    assert spawn.burst_reserve(10 * spawn.SPARES_MAX) == spawn.SPARES_MAX


class _Starting:
    """A spare still starting: it never says BOOTED."""

    def __init__(self):
        self.ours, theirs = socket.socketpair()
        self.conn = P.PortableConnection(theirs)
        self.confined = False

    def up(self):
        return False


def test_a_spare_that_is_up_is_handed_out_before_one_still_starting():
    spawner = spawn.Spawner(lambda pid, status: None)
    starting = _Starting()
    try:
        _until(lambda: spawner.stats()["spares"] == spawn.SPARES and _all_up(spawner),
               "the first spares up")
        spare = spawner._spares[False][0]
        with spawner._lock:
            spawner._spares[False].insert(0, starting)
        assert spawner._take(False, None) is spare
        assert spawner._spares[False][0] is starting             # left to come up
        spare.kill()
    finally:
        with spawner._lock:
            spawner._spares[False].remove(starting)
        spawner.close()


def test_a_spare_is_up_only_once_it_said_booted_and_anything_else_ends_it():
    class Fake(_Starting):
        killed = 0

        def kill(self):
            self.killed += 1
    up = spawned_child.Child.up
    fake = Fake()
    fake.booted = False
    assert up(fake) is False                                     # nothing said yet
    fake.ours.sendall(P.BOOTED + b"frame")
    assert up(fake) is True and up(fake) is True
    assert fake.conn.sock.recv(16) == b"frame"                   # only its byte was read
    for said in (b"X", b""):                                     # a wrong byte; its end
        fake = Fake()
        fake.booted = False
        fake.ours.sendall(said) if said else fake.ours.close()
        assert up(fake) is None and fake.killed == 1


def test_a_start_whose_interpreter_never_comes_up_is_refused_by_the_call_deadline(
        monkeypatch, libs, tmp_path):
    # Interpreters that never say BOOTED (self-limiting: they end within a minute).
    monkeypatch.setattr(spawned_child, "_ENTRY", "import time; time.sleep(60)")
    s = Supervisor(start_method="spawn")
    b = SandboxedBinding(tools_folders=[libs], supervisor=s, workspace=str(tmp_path),
                         tenant="never-up", timeout_s=1)
    try:
        r = b.execute_tool("tool_get_state", {})
        assert r["status_code"] == 503 and r["success"] is False
        assert "tool_get_state" in r["error"] and "faults" in r["error"]
        assert "no spawned interpreter was up before the call's deadline" in r["error"]
        pids = list(s._zygote._children)
        assert pids
    finally:
        b.close()
        s.close()
    assert all(wait_gone(pid) for pid in pids)


def test_starts_waiting_side_by_side_each_have_an_interpreter_starting(monkeypatch):
    # Interpreters that never come up (self-limiting: they end within a minute), so every
    # start waits until its deadline: none may wait on fewer interpreters than starts wait.
    monkeypatch.setattr(spawned_child, "_ENTRY", "import time; time.sleep(60)")
    spawner = spawn.Spawner(lambda pid, status: None)
    starts = 6
    outcomes = []
    try:
        deadline = time.monotonic() + 3.0
        threads = [threading.Thread(target=lambda: outcomes.append(
            _taken_or_why(spawner, deadline))) for _ in range(starts)]
        [t.start() for t in threads]
        [t.join(30) for t in threads]
        assert outcomes == ["no spawned interpreter was up before the call's deadline"] * starts
        assert spawner.stats()["children"] >= starts
    finally:
        spawner.close()


def test_a_start_whose_interpreter_cannot_be_spawned_says_why_and_owes_nothing(monkeypatch):
    spawner = spawn.Spawner(lambda pid, status: None)
    try:
        _until(lambda: spawner.stats()["spares"] == spawn.SPARES and _all_up(spawner),
               "the first spares up")
        spares = [spawner._take(False, None) for _ in range(spawn.SPARES)]

        def refused(confined, ahead):
            raise OSError(24, "Too many open files")
        monkeypatch.setattr(spawner, "_spawn", refused)
        with pytest.raises(OSError, match="Too many open files"):
            spawner._take(False, None)
        assert spawner._pending == {False: 0, True: 0} and spawner._waiting == {False: 0, True: 0}
        for child in spares:
            child.kill()
    finally:
        spawner.close()


def _taken_or_why(spawner, deadline):
    try:
        return spawner._take(False, deadline)
    except TimeoutError as exc:
        return str(exc).split(" (")[0]


def test_a_dead_spare_is_never_handed_out(sup, libs, tmp_path):
    sup.start()
    spawner = sup._zygote
    deadline = time.monotonic() + 20
    while not spawner._spares[False]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    dead = spawner._spares[False][0]
    spawned_child.kill_tree(dead.pid)
    assert dead.wait_exit(dead.pid, 10) is not None
    binding = SandboxedBinding(tools_folders=[libs], supervisor=sup, workspace=str(tmp_path),
                               tenant="after-dead-spare")
    try:
        r = binding.execute_tool("tool_get_state", {})
        assert r["success"] and r["output"]["pid"] != dead.pid
    finally:
        binding.close()


# A parent and one child, both blocked on stdin until the test ends: a tree
# whose size nothing else changes (the test process's own tree does, as other
# tests' helpers come and go).
_STILL_TREE = """
import os, sys
if os.fork() == 0:
    sys.stdin.read(); os._exit(0)
print("ready", flush=True)
sys.stdin.read()
os.wait()
"""


def test_memory_is_read_with_psutil_where_there_is_no_proc(monkeypatch):
    from lcp_sandbox.system import proc
    tree = subprocess.Popen([sys.executable, "-c", _STILL_TREE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert tree.stdout is not None and tree.stdout.readline() == "ready\n"
        with_proc = proc.tree_usage(tree.pid)
        monkeypatch.setattr(proc, "_HAS_PROC", False)
        monkeypatch.setattr(proc, "_HAS_CHILDREN_FILES", False)
        rss, uss, processes = proc.tree_usage(tree.pid)
    finally:
        tree.communicate("")
    assert with_proc[2] == 2 and processes == 2 and 0 < uss <= rss
    assert abs(rss - with_proc[0]) < 0.5 * with_proc[0]


# ------------------------------------------------------------------ its start
def _booted(code: str) -> str:
    """What ``code`` prints in a fresh interpreter started as a spawned worker is."""
    from lcp_sandbox.backends.boot import boot_argv, boot_environment
    done = subprocess.run(boot_argv(code, ""), env=boot_environment(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# What the engine no longer imports before it serves; each was part of a spawned worker's start.
NOT_AT_START = ("logging", "pathlib", "dataclasses", "inspect", "tempfile", "json", "sqlite3",
                "decimal", "uuid")


def test_a_spawned_worker_starts_with_only_what_serving_needs():
    """Everything a spawned worker imports before its first call is on the path of a call that
    found no spare: the engine's start leaves the rest to import_ahead (or to the library)."""
    # (less what the interpreter's own start imported: an editable install's finder imports pathlib)
    loaded = _booted("import sys\nbefore = set(sys.modules)\nimport lcp_sandbox.worker.spawned\n"
                     f"print(' '.join(m for m in {NOT_AT_START!r} if m in sys.modules and m not in before))")
    assert loaded == ""


def test_import_ahead_yields_to_a_call_that_is_waiting():
    """With a call waiting, a spare serves it before any module it may not need; with time,
    it imports them all."""
    out = _booted("import select, socket, sys\n"
                  "from lcp_sandbox.worker import ahead\n"
                  "BEFORE = set(sys.modules)\n"
                  "host, spare = socket.socketpair()\n"
                  "waiting = lambda: bool(select.select([spare], [], [], 0)[0])\n"
                  "host.send(b'x')\n"
                  "ahead.import_ahead(waiting)\n"
                  "print(' '.join(m for m in ahead.AHEAD if m in sys.modules and m not in BEFORE))\n"
                  "spare.recv(1)\n"
                  "ahead.import_ahead(waiting)\n"
                  "print(' '.join(m for m in ahead.AHEAD if m not in sys.modules))\n")
    imported_while_waiting, missing_after = (out.split("\n") + [""])[:2]
    assert imported_while_waiting == ""
    assert missing_after == ""
