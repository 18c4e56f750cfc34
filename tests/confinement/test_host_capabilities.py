"""A root host in a default container that lacks a capability it needs to manage workers
of another uid answers 503 naming it, before anything runs (CAP_KILL counted in what the
zygote it starts holds); with all of them, calls run, a call past its timeout is stopped
and temp files are removed.  With the check switched off, a kill the kernel refuses is
said, never reported as done.

Each host is a process of its own under Docker's default profile and capabilities
(tests/support/without_landlock.py --docker-default), with one more capability dropped by
``capsh --drop`` (the HOST script below prints what its calls answered).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SUPPORT

from lcp_sandbox.backends.local.confine.handover import check_capabilities
from lcp_sandbox.core.outcomes import Unavailable
from lcp_sandbox.system import capabilities

if os.geteuid() != 0 or not sys.platform.startswith("linux"):
    pytest.skip("a root host's capabilities: made from a root test process on Linux",
                allow_module_level=True)

WITHOUT_LANDLOCK = SUPPORT / "without_landlock.py"

LIBRARY = '''\
import os
import tempfile
import time


def tool_whoami() -> dict:
    """The uid this worker runs as."""
    return {"success": True, "output": os.getuid()}


def tool_sleep(seconds: float) -> dict:
    """Sleep through any interruption, then say so: only a kill stops it."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            time.sleep(end - time.monotonic())
        except BaseException:
            pass
    return {"success": True, "output": "awake"}


def tool_leave_a_process_and_exit() -> dict:
    """Fork a process that sleeps, then end this worker (what it left is the zygote's
    to kill)."""
    if os.fork() == 0:
        # (the worker's socket closed here too: its end is seen at once)
        os.closerange(0, 4096)
        time.sleep(30)
        os._exit(0)
    os._exit(3)


def tool_leave_temp_files() -> dict:
    """A folder with a file in this worker's temp dir; its path."""
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "left.txt"), "w") as f:
        f.write("x")
    return {"success": True, "output": folder}
'''

HOST = '''\
import ctypes, json, logging, os, sys
import psutil
from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local.confine import handover
from lcp_sandbox.system.capabilities import NUMBERS

logging.basicConfig(level=logging.WARNING)
for name in filter(None, os.environ.get("DROP_BOUNDING", "").split(",")):
    # out of the bounding set only: this process keeps using it, what it starts does not
    assert ctypes.CDLL(None).prctl(24, ctypes.c_ulong(NUMBERS[name]), 0, 0, 0) == 0

libs, base, per_tenant = sys.argv[1], sys.argv[2], sys.argv[3] == "per-tenant"
for unchecked in sys.argv[4:]:
    # the check switched off: what the engine does beyond it
    handover.MANAGING.pop(unchecked)
sup = Supervisor(confine=True, tenants_root=base if per_tenant else None)
workspace = os.path.join(base, "t1")
os.makedirs(workspace, mode=0o755)
b = SandboxedBinding(tools_folders=[libs], tenant="t1", workspace=workspace, supervisor=sup,
                     timeout_s=20)
out = {"whoami": b.execute_tool("tool_whoami", {})}
out["pids"] = [w["pid"] for w in b.stats() if w.get("pid")]
out["temp"] = b.execute_tool("tool_leave_temp_files", {})
out["sleep"] = b.execute_tool("tool_sleep", {"seconds": 30}, timeout_s=1)
out["alive"] = [p for p in out["pids"] if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
if os.environ.get("LEAVE_A_PROCESS") and out["whoami"].get("success"):
    out["left"] = b.execute_tool("tool_leave_a_process_and_exit", {})
    out["of_its_uid"] = [p.pid for p in psutil.process_iter(["uids"])
                         if p.info["uids"].real == out["whoami"]["output"]]
b.close()
sup.close()
if out["temp"].get("success"):
    out["temp_left"] = os.path.lexists(os.path.dirname(out["temp"]["output"]))
print(json.dumps(out))
'''

MANAGED = ("KILL", "CHOWN", "FOWNER", "DAC_OVERRIDE", "SETUID", "SETGID", "SETPCAP")


def host(tmp: Path, drop: str, mode: str = "per-tenant", unchecked: tuple = (),
         bounding: str = "", leave: bool = False) -> dict:
    """Run HOST as root under Docker's default profile and capabilities, less ``drop``
    ("" for none), the capabilities ``unchecked`` left out of the check, ``bounding``
    dropped by HOST from its bounding set alone (``leave``: a worker leaves a process
    behind); what its calls answered, and its stderr."""
    work = tmp / f"{drop or 'all'}-{mode}-{bounding}"
    (work / "libs").mkdir(parents=True)
    (work / "libs" / "capprobe.py").write_text(LIBRARY)
    (work / "host.py").write_text(HOST)
    shutil.copy(WITHOUT_LANDLOCK, work / "without_landlock.py")
    base = work / "tenants"
    base.mkdir(mode=0o711)
    base.chmod(0o711)
    subprocess.run(["chmod", "-R", "a+rX", str(work / "libs")], check=True)
    cmd = [sys.executable, str(work / "host.py"), str(work / "libs"), str(base), mode, *unchecked]
    if drop:
        cmd = ["capsh", f"--drop=cap_{drop.lower()}", "--", "-c", " ".join(map(repr, cmd))]
    cmd = [sys.executable, str(work / "without_landlock.py"), "--docker-default",
           "--keep-landlock", *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=work,
                          env={**os.environ, "HOME": str(work), "DROP_BOUNDING": bounding,
                               "LEAVE_A_PROCESS": "1" if leave else ""})
    assert done.returncode == 0, (drop, done.stderr[-3000:])
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


@pytest.fixture(scope="module")
def needs_capsh() -> None:
    if shutil.which("capsh") is None:
        pytest.skip("capsh (libcap2-bin) drops a capability for the host process")


@pytest.mark.parametrize("cap", MANAGED)
def test_a_host_without_a_capability_it_needs_answers_503_naming_it(open_tmp, needs_capsh, cap):
    out = host(open_tmp, cap)
    for call in ("whoami", "temp", "sleep"):
        answer = out[call]
        assert answer["status_code"] == 503, (cap, answer)
        assert f"CAP_{cap}" in answer["error"] and f"--cap-add {cap}" in answer["error"], answer
        assert "non-root user" in answer["error"]
    assert out["pids"] == [] and "temp_left" not in out


def test_a_host_without_cap_kill_refuses_workers_of_nobody_too(open_tmp, needs_capsh):
    out = host(open_tmp, "KILL", mode="nobody")
    assert out["whoami"]["status_code"] == 503 and "CAP_KILL" in out["whoami"]["error"]


def test_the_zygote_that_kills_is_checked_for_cap_kill_not_the_host_alone(open_tmp):
    """A host that still holds CAP_KILL but no longer in its bounding set starts a zygote
    without it: the zygote could not kill the workers, and the calls are refused."""
    out = host(open_tmp, "", bounding="KILL")
    assert out["whoami"]["status_code"] == 503, out["whoami"]
    assert "CAP_KILL" in out["whoami"]["error"]


def test_a_kill_refused_is_never_reported_as_done(open_tmp, needs_capsh):
    """Past the check (switched off here): without CAP_KILL the zygote's kill of the
    timed-out worker is refused, and the call says so instead of "its worker was killed";
    what a worker that ended left behind and could not be killed is logged."""
    out = host(open_tmp, "KILL", unchecked=("KILL",), leave=True)
    assert out["whoami"]["status_code"] == 200
    error = out["sleep"]["error"]
    assert "could not be killed (Operation not permitted)" in error, error
    assert "was killed" not in error
    try:
        # they do live on: this test's root (every capability) ends them
        assert out["alive"] == out["pids"]
        assert "exited with code 3" in out["left"]["error"]
        assert "could not kill worker" in out["stderr"], out["stderr"]
        assert "the processes it left could not be killed (Operation not permitted)" in out[
            "stderr"], out["stderr"]
        assert len(out["of_its_uid"]) >= 2
    finally:
        for pid in out["of_its_uid"]:
            os.kill(pid, signal.SIGKILL)


def test_with_all_of_them_calls_run_stop_and_leave_nothing(open_tmp):
    """Docker's default capabilities hold the seven: the worker runs as its tenant's uid,
    the call past its timeout ends with its worker gone, its temp files removed."""
    out = host(open_tmp, "")
    assert out["whoami"]["status_code"] == 200 and out["whoami"]["output"] != 0
    assert out["temp"]["status_code"] == 200
    assert out["sleep"]["status_code"] == 504, out["sleep"]
    assert "its worker was killed" in out["sleep"]["error"]
    assert out["pids"] and out["alive"] == []
    assert out["temp_left"] is False


def test_the_check_names_every_capability_missing_and_best_effort_keeps_only_managing():
    everything = capabilities.effective()
    assert everything is not None
    without = everything & ~(1 << capabilities.NUMBERS["KILL"]) \
        & ~(1 << capabilities.NUMBERS["SETPCAP"])
    with pytest.raises(Unavailable) as got:
        check_capabilities("lib", "tool", 65534, best_effort=False, mask=without)
    text = got.value.result["error"]
    assert "CAP_KILL" in text and "CAP_SETPCAP" in text and "privileges: " in text
    with pytest.raises(Unavailable) as got:
        check_capabilities("lib", "tool", 65534, best_effort=True, mask=without)
    assert "CAP_KILL" in got.value.result["error"]
    assert "CAP_SETPCAP" not in got.value.result["error"]
    check_capabilities("lib", "tool", 65534, best_effort=True,
                       mask=without | 1 << capabilities.NUMBERS["KILL"])
    with pytest.raises(Unavailable):
        check_capabilities("lib", "tool", 65534, best_effort=False, mask=0)
