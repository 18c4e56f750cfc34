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

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local.confine import sweep
from lcp_sandbox.backends.local.confine.tenant_uids import TenantUids

if os.geteuid() != 0:
    pytest.skip("a uid per tenant is given by a root host", allow_module_level=True)

LIBS = FIXTURES / "leftover_libs"


def _effective_caps() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))


#: The emulation is made from a root host (it installs its filter with CAP_SYS_ADMIN): in one
#: already (.ci/run's default-container run), it cannot be made again.
emulates = pytest.mark.skipif(
    SPAWN or not _effective_caps() & 1 << 21,
    reason="the default container is emulated from a root host with CAP_SYS_ADMIN (zygote "
           "path); this process is in one already, or on the spawn path")


def _keyrings_refused() -> bool:
    """Whether a filter refuses keyrings to this process (a default container's): add_key of
    no type answers EPERM, else EINVAL; nothing is made."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    number = 248 if os.uname().machine == "x86_64" else 217
    libc.syscall(number, b"", b"", None, 0, ctypes.c_int(-4))
    return ctypes.get_errno() == 1
#: uids of this test process's own (CI runs two suites at once)
FIRST = 1_830_000_000 + os.getpid() % 997 * 1000


def on_docker_default(tmp: Path, n: int, unswept: bool = False, come_back: bool = False) -> dict:
    """Run left_behind_host.py in an emulated default container without Landlock."""
    work = tmp / f"host-{n}"
    work.mkdir(mode=0o755)
    shutil.copytree(LIBS, work / "libs")
    subprocess.run(["chmod", "-R", "a+rX", str(work / "libs")], check=True)
    base = work / "tenants"
    base.mkdir(mode=0o711)
    base.chmod(0o711)
    config = {"first_uid": FIRST + n, "key": 0x4C430000 + os.getpid() % 997 * 16 + n,
              "unswept": unswept, "come_back": come_back}
    cmd = [sys.executable, str(SUPPORT / "without_landlock.py"), "--docker-default",
           sys.executable, str(SUPPORT / "left_behind_host.py"), str(work / "libs"),
           str(base), json.dumps(config)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=work,
                          env={**os.environ, "HOME": str(work)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@emulates
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


@emulates
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


@emulates
def test_a_worker_s_temp_dir_is_removed_once_it_is_gone_not_before(open_tmp):
    """Without Landlock a worker may write /tmp: one that makes its temp dir again as it
    ends, once the host removed it, would leave it behind were it removed while the worker
    still ran (its tenant's binding closed: the worker asked to stop)."""
    out = on_docker_default(open_tmp, 2, come_back=True)
    assert out["come_back"]["status_code"] == 200, out["come_back"]
    assert out["came_back"] is False


def _confined(sup: Supervisor, root: Path, tenant: str, **sandbox) -> SandboxedBinding:
    (root / tenant).mkdir()
    return SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant=tenant,
                            workspace=str(root / tenant), workspace_root=str(root / tenant),
                            host_tool_configs={"leaver": {"sandbox": sandbox}} if sandbox
                            else None)


def test_a_worker_makes_no_key_no_system_v_object_and_no_posix_queue(open_tmp):
    """Keyrings outlive their uid's processes (the kernel keeps a uid's user keyring): the
    system call filter refuses them to every confined worker, and a library cannot lift
    that without allow_dangerous.  System V IPC and POSIX message queues are refused too,
    unless the library names the calls (then the sweep removes the System V objects)."""
    with Supervisor(confine=True, tenants_root=str(open_tmp), uid_range=(FIRST + 10, 5)) as sup:
        t = _confined(sup, open_tmp, "t")
        for tool in ("tool_add_key", "tool_shmget", "tool_mq_open"):
            assert t.execute_tool(tool)["output"] == "Operation not permitted", tool
        lifted = _confined(sup, open_tmp, "u", syscalls={"allow": ["add_key", "keyctl"]})
        refused = lifted.execute_tool("tool_add_key")
        assert refused["status_code"] == 500 and "allow_dangerous" in refused["error"]
        uid = sup.uids.of("t")[0]
        t.close()
        assert sup.remove_tenant("t", str(open_tmp / "t")) == uid
        assert sup.uids.record.entries[uid].state == "clean"


@pytest.mark.skipif(_keyrings_refused(), reason="a filter refuses keyrings to this process "
                                                "(a default container): no key can be made")
def test_a_uid_that_holds_kernel_keys_is_retired(tmp_path, monkeypatch):
    """A key made as the uid (outside the engine: no worker may) cannot be removed by the
    host: the uid given back is retired, never given again."""
    monkeypatch.setenv("LCP_SANDBOX_UIDS_DIR", str(tmp_path / "uids"))
    uids = TenantUids((FIRST + 20, 2), str(tmp_path))
    uid = uids.of("a")[0]
    add_key = ("import ctypes, os; n = 248 if os.uname().machine == 'x86_64' else 217;"
               "assert ctypes.CDLL(None).syscall(n, b'user', b'k', b'v', 1, ctypes.c_int(-4)) > 0")
    subprocess.run(["/usr/bin/python3", "-c", add_key], user=uid, group=uid, check=True)
    assert any("kernel keys" in s for s in sweep.look(uid).stuck)
    uids.release("a")
    assert uids.record.entries[uid].state == "retired"
    assert uids.of("b")[0] == uid + 1
    assert "kernel keys are its" in uids.record.entries[uid].why


def test_the_sweep_removes_only_what_the_uid_owns_never_through_a_link(tmp_path, monkeypatch):
    """In a shared place (here /tmp): the uid's files, its folders, its links (not what
    they point to) are removed, deep in folders of others too; another uid's file in a folder of the uid's stays, and so
    does that folder (then the uid is stuck: retired); the tenants' folder (``keep``), even
    in /tmp, is looked in, never swept.  A walk past its budget is stuck too."""
    import tempfile
    uid, other = FIRST + 30, FIRST + 31
    shared = Path(tempfile.mkdtemp(prefix="lcp-sweep-test-"))
    shared.chmod(0o1777)
    target = tmp_path / "root-s-file"
    target.write_text("root's")
    made = {"file": shared / "file", "folder": shared / "folder",
            "inner": shared / "folder" / "inner", "link": shared / "link",
            "open": shared / "open", "others": shared / "open" / "others",
            "in_open": shared / "open" / "mine", "tenants": shared / "tenants",
            "root": shared / "tenants" / "a", "closed": shared / "closed",
            "deep": shared / "closed" / "deep", "in_deep": shared / "closed" / "deep" / "mine"}
    try:
        made["file"].write_text("x")
        made["folder"].mkdir()
        made["inner"].write_text("x")
        made["link"].symlink_to(target)
        made["open"].mkdir(mode=0o777)
        made["others"].write_text("x")
        made["in_open"].write_text("x")
        made["tenants"].mkdir()
        made["tenants"].chmod(0o711)
        made["root"].mkdir()
        made["closed"].mkdir(mode=0o755)
        made["deep"].mkdir()
        made["deep"].chmod(0o777)
        made["in_deep"].write_text("x")
        for key in ("file", "folder", "inner", "open", "in_open", "root", "in_deep"):
            os.chown(made[key], uid, uid)
        os.lchown(made["link"], uid, uid)
        os.chown(made["others"], other, other)
        left = sweep.sweep(uid, [str(made["tenants"])])
        assert not made["file"].exists() and not made["folder"].exists()
        assert not made["link"].is_symlink() and target.read_text() == "root's"
        assert made["others"].exists() and made["open"].exists()
        assert not made["in_open"].exists() and made["root"].exists()
        assert not made["in_deep"].exists()             # in a folder it could write, deeper
        assert left.stuck == [f"{made['open']} is its"], left
        assert left.held == [f"{made['root']} is its"], left
        monkeypatch.setattr(sweep, "WALK_BUDGET", 3)
        assert "the walk passed 3 entries" in sweep.look(uid).stuck
    finally:
        import shutil
        shutil.rmtree(shared, ignore_errors=True)
