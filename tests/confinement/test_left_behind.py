"""What a tenant can leave behind is gone before its uid serves the next tenant
(docs/security.md, "What a tenant can leave behind"): each kind of thing, left by a real
confined worker, looked for by the next holder of the same uid.

The attack runs on the kind of host where a uid is all that keeps files apart: a default
Docker container without Landlock (tests/support/without_landlock.py --docker-default), a
uid per tenant, /tmp, /var/tmp and /dev/shm writable by every uid."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, SPAWN, SUPPORT

from lcp_sandbox.backends.local.confine import sweep

if os.geteuid() != 0:
    pytest.skip("a uid per tenant is given by a root host", allow_module_level=True)

LIBS = FIXTURES / "leftover_libs"
#: uids of this test process's own (CI runs two suites at once)
FIRST = 1_830_000_000 + os.getpid() % 997 * 1000


def on_docker_default(tmp: Path, n: int, unswept: bool = False) -> dict:
    """Run left_behind_host.py in an emulated default container without Landlock."""
    work = tmp / f"host-{n}"
    work.mkdir(mode=0o755)
    shutil.copytree(LIBS, work / "libs")
    subprocess.run(["chmod", "-R", "a+rX", str(work / "libs")], check=True)
    base = work / "tenants"
    base.mkdir(mode=0o711)
    base.chmod(0o711)
    config = {"first_uid": FIRST + n, "key": 0x4C430000 + os.getpid() % 997 * 16 + n,
              "unswept": unswept}
    cmd = [sys.executable, str(SUPPORT / "without_landlock.py"), "--docker-default",
           sys.executable, str(SUPPORT / "left_behind_host.py"), str(work / "libs"),
           str(base), json.dumps(config)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=work,
                          env={**os.environ, "HOME": str(work)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(SPAWN, reason="fork-only (zygote path): the emulated container's workers")
def test_a_recycled_uid_finds_nothing_of_the_last_tenant(open_tmp):
    """Tenant a's tool leaves 0600 files in /tmp, /var/tmp and /dev/shm, System V shared
    memory, a semaphore set and a message queue, and a process listening on a TCP port;
    a is removed; b gets a's uid and finds none of it.  The same run with the sweep
    switched off: b finds a's files and System V objects (what the sweep is for)."""
    out = on_docker_default(open_tmp, 0)
    left = out["left"]
    assert left["status_code"] == 200, left
    uid = left["output"]["uid"]
    assert out["released"] == uid == FIRST
    assert all(isinstance(v, int) for v in left["output"]["ipc"].values()), left
    assert out["a_stats"][0]["protections"]["filesystem"].startswith(
        "on (a uid of its tenant's own"), out["a_stats"][0]["protections"]
    found = out["found"]
    assert found["status_code"] == 200, found
    got = found["output"]
    assert got["uid"] == uid                                    # the same uid, recycled
    assert got["files"] == {p: "FileNotFoundError" for p in ("/tmp", "/var/tmp", "/dev/shm")}
    assert got["ipc"] == {k: "No such file or directory" for k in ("shm", "sem", "msg")}
    assert got["processes"] == [] and got["port"] == "ConnectionRefusedError", got
    assert out["record"].startswith("machine-wide (")


@pytest.mark.skipif(SPAWN, reason="fork-only (zygote path): the emulated container's workers")
def test_without_the_sweep_the_next_holder_finds_it(open_tmp):
    """The control of the test above: the sweep switched off (and no process left, which
    would keep the uid from b), b reads a's files and finds its System V objects."""
    out = on_docker_default(open_tmp, 1, unswept=True)
    try:
        got = out["found"]["output"]
        uid = out["left"]["output"]["uid"]
        assert got["uid"] == uid
        assert got["files"] == {p: f"the secret of uid {uid}"
                                for p in ("/tmp", "/var/tmp", "/dev/shm")}
        assert all(isinstance(v, int) for v in got["ipc"].values()), got
    finally:
        assert not sweep.sweep(FIRST + 1), "what the control run left was not removed"
