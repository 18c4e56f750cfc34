"""Tenants apart on each kind of Linux host, or refused (503): one tenant's tool attacks
another tenant and the host (tests/host_kind_attack.py, run as a host process of its own).

    root                        this machine: Landlock (ABI 7 here), CAP_SYS_ADMIN
    root, Landlock ABI 5        testing.landlock_abi_at_most(): no signal scope (Linux < 6.12)
    root without Landlock       a seccomp filter makes landlock_* answer ENOSYS
                                (tests/without_landlock.py), for the host and all it starts
    container                   root with a default container's capabilities (capsh --drop):
                                no CAP_SYS_ADMIN, so the namespaces come through a user
                                namespace; and the same where user namespaces are refused
                                (unshare answers EPERM: tests/without_landlock.py --no-userns)
    container without setuid    the same, also without CAP_SETUID / CAP_SETGID
    unprivileged                a host user (setpriv) with a Python it may read; with and
                                without Landlock, with and without user namespaces

Where a fresh worker can have a PID namespace of its own in a root of its own, tenants
are apart whatever the kernel; elsewhere Landlock (ABI 6's scope) holds files and signals;
where neither holds, every call is refused with 503 and the host lives on.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HERE, REPO, SPAWN

if SPAWN:
    pytest.skip("fork-only (zygote path): the PID namespace and own root of a fresh confined "
                "worker are the zygote's", allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("the host kinds are made from a root test process", allow_module_level=True)

LIBS = HERE / "host_kind_libs"
HOST = HERE / "host_kind_attack.py"
WITHOUT_LANDLOCK = HERE / "without_landlock.py"
UNPRIVILEGED = 4242
#: A default container's capabilities: these are dropped (Docker keeps CHOWN, DAC_OVERRIDE,
#: FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE, NET_RAW, SYS_CHROOT,
#: MKNOD, AUDIT_WRITE, SETFCAP; tests/test_deploy.py checks deploy/Dockerfile's list
#: against these).
CONTAINER_DROPS = ("cap_sys_admin,cap_net_admin,cap_sys_ptrace,cap_sys_module,cap_sys_rawio,"
                   "cap_sys_pacct,cap_sys_boot,cap_sys_nice,cap_sys_resource,cap_sys_time,"
                   "cap_sys_tty_config,cap_lease,cap_audit_control,cap_mac_override,"
                   "cap_mac_admin,cap_syslog,cap_wake_alarm,cap_block_suspend,cap_audit_read,"
                   "cap_perfmon,cap_bpf,cap_checkpoint_restore,cap_ipc_lock,cap_ipc_owner,"
                   "cap_linux_immutable,cap_dac_read_search,cap_net_broadcast")


@pytest.fixture(scope="module")
def user_python(open_tmp_module) -> str:
    """A Python an unprivileged user may run, with the engine and its dependencies: a
    virtualenv of the system's interpreter (the same CPython minor version, so the same
    compiled modules) holding copies of the engine and its three dependencies (the
    checkout may lie below a folder only root may pass)."""
    system = shutil.which(f"python3.{sys.version_info.minor}", path="/usr/bin:/usr/local/bin")
    if system is None or os.path.realpath(system).startswith("/root"):
        pytest.skip(f"no system python3.{sys.version_info.minor} an unprivileged user can run")
    venv = open_tmp_module / "user-python"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3.*/site-packages"))
    import cloudpickle
    import msgpack
    import psutil
    for module in (psutil, msgpack, cloudpickle):
        shutil.copytree(os.path.dirname(module.__file__), site / module.__name__,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "lcp_sandbox", site / "lcp_sandbox",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "a+rX", str(venv)], check=True)
    return str(venv / "bin" / "python")


def host(kind: str, tmp: Path, user_python: str = "", **config) -> dict:
    """Run the attack under ``kind``; what the host printed (it must live to print it)."""
    work = tmp / kind
    work.mkdir(mode=0o755)
    shutil.copytree(LIBS, work / "libs")
    shutil.copy(HOST, work / "host.py")
    shutil.copy(WITHOUT_LANDLOCK, work / "without_landlock.py")
    base = work / "tenants"
    base.mkdir()
    python = user_python or sys.executable
    cmd = [python, str(work / "host.py"), str(work / "libs"), str(base), json.dumps(config)]
    if kind.endswith("without_landlock") or "no_userns" in kind:
        flags = (["--no-userns"] if "no_userns" in kind else []) + (
            [] if kind.endswith("without_landlock") else ["--keep-landlock"])
        cmd = [python, str(work / "without_landlock.py"), *flags, *cmd]
    if kind.startswith("container"):
        drops = CONTAINER_DROPS + (",cap_setuid,cap_setgid" if "setuid" in kind else "")
        cmd = ["capsh", f"--drop={drops}", "--", "-c", " ".join(map(repr, cmd))]
    if kind.startswith("unprivileged"):
        subprocess.run(["chmod", "-R", "a+rX", str(work)], check=True)
        os.chown(base, UNPRIVILEGED, UNPRIVILEGED)
        cmd = ["setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}",
               "--clear-groups", *cmd]
    env = {**os.environ, "HOME": str(work)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=work)
    assert done.returncode == 0, (kind, done.returncode, done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_apart(out: dict, own_pid_namespace: bool) -> None:
    """Tenant a reached nothing of tenant b or of the host; b's worker and state lived on."""
    attack = out["attack"]
    assert attack["status_code"] == 200, attack
    got = attack["output"]
    for what in ("read_secret", "list_other", "write_other", "proc_other", "proc_host",
                 "signal_other", "signal_host", "write_tmp", "read_shadow"):
        assert got[what] in ("PermissionError", "FileNotFoundError", "ProcessLookupError",
                             "OSError"), (what, got[what])          # (OSError: read-only)
    assert got["list_tenants"] in ("PermissionError", ["a"]), got["list_tenants"]
    assert got["uid"] != 0
    assert out["planted"] is False
    assert out["kill"]["status_code"] == 200
    assert out["b_again"]["output"] == out["b_first"]["output"] + 1     # b's state kept
    assert out["b_same_worker"] is True
    processes = out["a_stats"][0]["protections"]["processes"]
    if own_pid_namespace:
        assert processes.startswith("on (own PID namespace"), processes
        assert out["kill"]["output"] == "ProcessLookupError"      # nobody else in its namespace
        assert out["a_stats"][0]["protections"]["filesystem"].startswith("on (own root")
    else:
        assert processes.startswith("on (Landlock scope"), processes
    # by pid, a priority or an affinity is the worker's own only (the system call filter
    # refuses it before the kernel looks the pid up; in a PID namespace it names no one)
    assert got["renice_other"] in ("PermissionError", "ProcessLookupError")
    assert got["pin_other"] in ("PermissionError", "ProcessLookupError")


def assert_refused(out: dict, *missing: str) -> None:
    """Every call answered 503 naming what is missing; nothing ran."""
    for key in ("b_first", "attack", "kill", "b_again"):
        r = out[key]
        assert r["status_code"] == 503 and "not all in force" in r["error"], r
        for kind in missing:
            assert f"{kind}: " in r["error"], (kind, r["error"])
        assert 'confine="best-effort"' in r["error"]
    assert out["planted"] is False


@pytest.mark.parametrize("templates", [False, True], ids=["fresh", "templates"])
def test_root(open_tmp, templates):
    out = host("root", open_tmp, templates=templates)
    start = out["a_stats"][0]["start"]
    assert (start == "template") is templates, start
    assert_apart(out, own_pid_namespace=not templates)
    assert_uid(out, per_tenant=templates)          # (a tenants_root: a uid of its own)


def assert_uid(out: dict, per_tenant: bool) -> None:
    """Tenant a's worker ran as a uid of its own (from the default range), or as nobody."""
    uid = out["attack"]["output"]["uid"]
    if per_tenant:
        assert 1_800_000_000 <= uid < 1_801_000_000, uid
        assert out["a_stats"][0]["protections"]["privileges"].startswith(f"uid {uid} gid {uid}")
    else:
        assert uid == 65534


@pytest.mark.parametrize("templates", [False, True], ids=["fresh", "templates"])
def test_root_without_landlock(open_tmp, templates):
    """No Landlock: a fresh worker's own root and PID namespace keep tenants apart; a
    template (which would rely on Landlock) refuses to import, so workers start fresh."""
    out = host("root_without_landlock", open_tmp, templates=templates)
    assert_apart(out, own_pid_namespace=True)
    assert "Landlock: unavailable (kernel without Landlock)" in \
        out["a_stats"][0]["protections"]["filesystem"]
    if templates:
        assert all(t.startswith("refused: not in force: filesystem") for t in out["templates"])
        assert out["a_stats"][0]["start"].startswith("fresh (refused: not in force")


def test_root_landlock_abi_5(open_tmp):
    """Landlock without the signal scope (Linux 6.2-6.11): templates refuse, fresh workers
    hold by their PID namespace."""
    out = host("root_abi_5", open_tmp, templates=True, abi=5)
    assert all("processes (unavailable" in t for t in out["templates"]), out["templates"]
    assert_apart(out, own_pid_namespace=True)
    assert "Landlock: on (ABI 5)" in out["a_stats"][0]["protections"]["filesystem"]


def test_container(open_tmp):
    """No CAP_SYS_ADMIN: the namespaces come through a user namespace the zygote maps (every
    uid to itself: it keeps CAP_SETUID), and the worker still becomes nobody."""
    out = host("container", open_tmp)
    assert_apart(out, own_pid_namespace=True)
    assert out["attack"]["output"]["uid"] == 65534
    assert out["a_stats"][0]["protections"]["privileges"].startswith("uid 65534 gid 65534")


def test_container_with_a_tenants_root_gives_each_tenant_its_own_uid(open_tmp):
    """The same with a tenants_root: the worker forked from the shared template (network
    on), as a uid of its own (the template keeps CAP_SETUID behind its key)."""
    out = host("container_tenants", open_tmp, templates=True)
    assert out["a_stats"][0]["start"] == "template" and out["templates"] == ["ok", "ok"]
    assert_apart(out, own_pid_namespace=False)
    assert_uid(out, per_tenant=True)


def test_container_without_user_namespaces_relies_on_landlock(open_tmp):
    out = host("container_no_userns", open_tmp)
    assert_apart(out, own_pid_namespace=False)
    assert out["attack"]["output"]["uid"] == 65534


def test_container_without_setuid_never_runs_a_worker_as_root(open_tmp):
    out = host("container_without_setuid", open_tmp)
    assert_refused(out, "privileges")


@pytest.mark.parametrize("landlock", [True, False], ids=["landlock", "without_landlock"])
def test_unprivileged(open_tmp, user_python, landlock):
    """A host that is not root: the same namespaces, through a user namespace mapping its
    uid to itself; the worker keeps the host's uid."""
    out = host("unprivileged" + ("" if landlock else "_without_landlock"), open_tmp,
               user_python)
    assert_apart(out, own_pid_namespace=True)
    assert out["attack"]["output"]["uid"] == UNPRIVILEGED
    assert out["a_stats"][0]["protections"]["privileges"].startswith(f"uid {UNPRIVILEGED} ")


def test_unprivileged_without_user_namespaces_relies_on_landlock(open_tmp, user_python):
    out = host("unprivileged_no_userns", open_tmp, user_python)
    assert_apart(out, own_pid_namespace=False)


def test_unprivileged_without_user_namespaces_nor_landlock_is_refused(open_tmp, user_python):
    """Here kill(-1, SIGKILL) from a confined tool would have killed the host: refused."""
    out = host("unprivileged_no_userns_without_landlock", open_tmp, user_python)
    assert_refused(out, "filesystem", "processes")


def test_best_effort_without_landlock_runs_and_says_what_is_missing(open_tmp):
    out = host("root_best_effort_without_landlock", open_tmp, confine="best-effort",
               templates=True)
    """Degrading is opt-in: with confine="best-effort" the template imports and serves
    without Landlock, and stats() say what is missing."""
    assert out["b_first"]["status_code"] == out["attack"]["status_code"] == 200
    assert out["templates"] == ["ok", "ok"] and out["a_stats"][0]["start"] == "template"
    prot = out["a_stats"][0]["protections"]
    assert prot["filesystem"].startswith("unavailable (kernel without Landlock)"), prot
    assert prot["processes"].startswith("unavailable"), prot
    assert "kill" not in out                 # (it would reach every process of its uid)
