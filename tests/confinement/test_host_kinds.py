"""Tenants apart on each kind of Linux host, or refused (503): one tenant's tool attacks
another tenant and the host (tests/support/host_kind_attack.py, run as a host process of its own).

    root                        this machine: Landlock (ABI 7 here), CAP_SYS_ADMIN
    root, Landlock ABI 5        testing.landlock_abi_at_most(): no signal scope (Linux < 6.12)
    root without Landlock       a seccomp filter makes landlock_* answer ENOSYS
                                (tests/support/without_landlock.py), for the host and all it starts
    container                   root with a default container's capabilities (capsh --drop):
                                no CAP_SYS_ADMIN, so the namespaces come through a user
                                namespace; and the same where user namespaces are refused
                                (unshare answers EPERM: tests/support/without_landlock.py --no-userns)
    container without setuid    the same, also without CAP_SETUID / CAP_SETGID
    unprivileged                a host user (setpriv) with a Python it may read; with and
                                without Landlock, with and without user namespaces
    docker default              Docker's default seccomp profile (without_landlock.py
                                --docker-default: no unshare, setns, mount, clone with
                                CLONE_NEW*; clone3 ENOSYS) installed as root, then Docker's
                                14 capabilities: no namespace at all; Landlock at ABI 7 (this
                                kernel), at most 5, at most 3, and none
    kubernetes restricted       the same filter under a non-root uid with no capability and
                                no_new_privs (the "restricted" Pod Security Standard); one
                                uid for every tenant (the host's)

Each kind is attacked with the network on, off and by a policy.  Where a fresh worker can
have a PID namespace of its own in a root of its own, tenants are apart whatever the
kernel; elsewhere Landlock (ABI 6's scope) holds files and signals, or a uid of the
tenant's own does (a root host in a default container: the kernel's uid checks, its root
0700); a network-off worker without a network namespace is held off the network by the
system call filter.  Where none of it holds, every call is refused with 503 naming what is
missing, and the host lives on.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, SPAWN, SUPPORT

if SPAWN:
    pytest.skip("fork-only (zygote path): the PID namespace and own root of a fresh confined "
                "worker are the zygote's", allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("the host kinds are made from a root test process", allow_module_level=True)

LIBS = FIXTURES / "host_kind_libs"
HOST = SUPPORT / "host_kind_attack.py"
WITHOUT_LANDLOCK = SUPPORT / "without_landlock.py"
UNPRIVILEGED = 4242
#: A default container's capabilities: these are dropped (Docker keeps CHOWN, DAC_OVERRIDE,
#: FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE, NET_RAW, SYS_CHROOT,
#: MKNOD, AUDIT_WRITE, SETFCAP; tests/fronts/test_deploy.py checks deploy/Dockerfile's list
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
    compiled modules) holding copies of the engine and of its runtime dependencies (the
    checkout may lie below a folder only root may pass)."""
    system = shutil.which(f"python3.{sys.version_info.minor}", path="/usr/bin:/usr/local/bin")
    if system is None or os.path.realpath(system).startswith("/root"):
        pytest.skip(f"no system python3.{sys.version_info.minor} an unprivileged user can run")
    venv = open_tmp_module / "user-python"
    subprocess.run([system, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3.*/site-packages"))
    for path in _runtime_files():
        if path.is_dir():
            shutil.copytree(path, site / path.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, site / path.name)
    shutil.copytree(REPO / "lcp_sandbox", site / "lcp_sandbox",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "a+rX", str(venv)], check=True)
    return str(venv / "bin" / "python")


def _runtime_files() -> list:
    """The top-level modules and packages of the engine's runtime dependencies
    (pyproject.toml's, and theirs), as installed here."""
    import importlib.metadata as md
    import re

    import tomllib

    def name(requirement: str) -> str:
        return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0]

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    todo = [name(r) for r in pyproject["project"]["dependencies"]]
    seen: set = set()
    found: dict = {}
    while todo:
        dist_name = todo.pop()
        if dist_name.lower() in seen:
            continue
        seen.add(dist_name.lower())
        dist = md.distribution(dist_name)
        for file in dist.files or ():
            top = file.parts[0]
            if len(file.parts) == 1 and not top.endswith((".py", ".so")):
                continue
            if top.endswith((".dist-info", ".data")) or top in ("..", "__pycache__"):
                continue
            found[top] = Path(dist.locate_file(top))
        todo += [name(r) for r in dist.requires or () if "extra ==" not in r]
    return sorted(found.values())


def host(kind: str, tmp: Path, user_python: str = "", tenants_mode: int = 0o711,
         **config) -> dict:
    """Run the attack under ``kind``; what the host printed (it must live to print it), by
    network setting (``networks``, default ["on"]).  The tenants' folder lets every uid pass
    and none list (``tenants_mode``), as docs/security.md asks of a host whose tenants are
    apart by their uids."""
    work = tmp / kind
    work.mkdir(mode=0o755)
    shutil.copytree(LIBS, work / "libs")
    shutil.copy(HOST, work / "host.py")
    shutil.copy(WITHOUT_LANDLOCK, work / "without_landlock.py")
    base = work / "tenants"
    base.mkdir()
    python = user_python or sys.executable
    cmd = [python, str(work / "host.py"), str(work / "libs"), str(base), json.dumps(config)]
    cmd = _emulated(kind, cmd, python, work / "without_landlock.py")
    if kind.startswith(("unprivileged", "restricted")):
        subprocess.run(["chmod", "-R", "a+rX", str(work)], check=True)
        os.chown(base, UNPRIVILEGED, UNPRIVILEGED)
    base.chmod(tenants_mode)
    env = {**os.environ, "HOME": str(work)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=work)
    assert done.returncode == 0, (kind, done.returncode, done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _emulated(kind: str, cmd: list, python: str, filters: Path) -> list:
    """``cmd`` as run on a host of ``kind`` (the module docstring's list)."""
    landlock = [] if kind.endswith("without_landlock") else ["--keep-landlock"]
    if kind.startswith("docker"):
        # Docker's profile, installed as root (as the runtime does), then its capabilities
        cmd = [python, str(filters), "--docker-default", *landlock, *cmd]
    elif kind.startswith("restricted"):
        # a non-root uid with no capability and no_new_privs, under the same profile
        cmd = ["setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}",
               "--clear-groups", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all",
               python, str(filters), "--docker-default", *landlock, *cmd]
    elif kind.endswith("without_landlock") or "no_userns" in kind:
        flags = (["--no-userns"] if "no_userns" in kind else []) + landlock
        cmd = [python, str(filters), *flags, *cmd]
    if kind.startswith("container"):
        drops = CONTAINER_DROPS + (",cap_setuid,cap_setgid" if "setuid" in kind else "")
        cmd = [python, str(filters), "--readable-python-only",
               "capsh", f"--drop={drops}", "--", "-c", " ".join(map(repr, cmd))]
    if kind.startswith("unprivileged"):
        cmd = ["setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}",
               "--clear-groups", *cmd]
    return cmd


REFUSED = ("PermissionError", "FileNotFoundError", "ProcessLookupError", "OSError")


def assert_apart(out: dict, own_pid_namespace: bool, by_uid: bool = False,
                 landlock: bool = True, network: str = "on", guard: bool = False) -> None:
    """Tenant a reached nothing of tenant b or of the host; b's worker and state lived on.
    ``by_uid``: processes apart by a uid of the tenant's own (no PID namespace nor Landlock
    scope); ``landlock`` False: files apart by that uid alone (no Landlock, no own root);
    ``guard``: processes apart by the host's guard (one uid for all, no scope)."""
    attack = out["attack"]
    assert attack["status_code"] == 200, attack
    got = attack["output"]
    for what in ("read_secret", "list_other", "write_other", "proc_other", "proc_host",
                 "signal_other", "signal_host", "read_shadow", "read_uid_store"):
        assert got[what] in REFUSED, (what, got[what])          # (OSError: read-only)
    assert got["list_tenants"] in ("PermissionError", [f"a-{network}"]), got["list_tenants"]
    assert got["uid"] != 0
    assert out["planted"] is False
    assert out["kill"]["status_code"] == 200
    assert out["b_again"]["output"] == out["b_first"]["output"] + 1     # b's state kept
    assert out["b_same_worker"] is True
    protections = out["a_stats"][0]["protections"]
    processes = protections["processes"]
    if own_pid_namespace:
        assert processes.startswith("on (own PID namespace"), processes
        assert out["kill"]["output"] == "ProcessLookupError"      # nobody else in its namespace
        assert protections["filesystem"].startswith("on (own root")
    elif by_uid:
        assert processes.startswith("on (a uid of its tenant's own"), processes
    elif guard:
        assert processes.startswith("on (the host's guard (seccomp user notification)"), \
            processes
        assert_guarded(out)
    else:
        assert processes.startswith("on (Landlock scope"), processes
    # by pid, a priority or an affinity is the worker's own only (the system call filter
    # refuses it before the kernel looks the pid up; in a PID namespace it names no one)
    assert got["renice_other"] in ("PermissionError", "ProcessLookupError")
    assert got["pin_other"] in ("PermissionError", "ProcessLookupError")
    # what tempfile makes is in its private temp dir, its uid's alone
    tmpdir, mode = got["mkstemp"]
    assert os.path.basename(tmpdir).startswith("lcp-sandbox-") and mode == "0o600", got["mkstemp"]
    shared = ("write_tmp", "write_shm", "write_var_tmp")
    if landlock or own_pid_namespace:
        for what in (*shared, "proc_other_cmdline"):
            assert got[what] in REFUSED, (what, got[what])
    else:
        # no Landlock nor a root of its own: the sticky shared places stay writable, and
        # what it makes there is its own (umask 077); command lines are visible to all uids
        assert all(got[what] == "0o600" for what in shared), got
        assert protections["filesystem"].startswith("on (a uid of its tenant's own")
    assert_network(out, network, scoped=not (by_uid or own_pid_namespace or guard) or landlock and
                   "scoped" in protections["filesystem"])


#: What the host's guard refuses: each call names the other tenant's worker or the host
#: (by the pids the host sees) or the host's process group.  EPERM, whatever the call would
#: have answered (without the guard, the same uid passes: "ok" or EFAULT).
GUARD_REFUSES = ("tgkill_other", "tkill_other", "sigqueue_host", "probe_other", "pidfd_other",
                 "pidfd_host", "killpg_host", "sigio_other",
                 "sigio_host_group", "priority_other", "pgid_other")


def assert_guarded(out: dict) -> None:
    """The host's guard: every call naming another tenant's or the host's process refused,
    kill(-1) too; a tool still signals its own children (by pid and by their group), its
    own group, and names itself."""
    got = out["name_processes"]
    assert got["status_code"] == 200, got
    named = got["output"]
    for what in GUARD_REFUSES:
        assert named[what] == "PermissionError", (what, named[what])
    # (refused by the system call filter before the guard: the caller's own only)
    assert named["setpriority_other"] == named["prlimit_other"] == "PermissionError", named
    assert named["own_child"] == named["own_child_group"] == "killed by 9", named
    assert named["own_pidfd"] == "ok" and isinstance(named["own_priority"], int), named
    # its process group is its own (the zygote makes each worker a group leader)
    assert named["kill_own_group"] == "ok", named
    assert out["kill"]["output"] == "PermissionError", out["kill"]


def assert_network(out: dict, network: str, scoped: bool) -> None:
    """What tenant a reached of the host's endpoints and of tenant b's abstract socket."""
    got = out["attack"]["output"]
    # no abstract unix socket of the host or of another tenant: Landlock's scope, or no
    # unix socket at all (the system call filter, where there is no scope)
    assert got["abstract_host"] == "PermissionError", got["abstract_host"]
    assert got.get("abstract_other", "PermissionError") == "PermissionError", got
    unix = out["a_stats"][0]["protections"]["unix_sockets"]
    if network == "policy":
        # no namespace: Landlock's TCP rules let it reach the proxy's port only, the
        # filter refuses every socket of its own (test_egress.py: what it does reach)
        for what in ("tcp_host", "udp_host", "raw", "packet", "unix_host", "dgram_pair"):
            assert got[what] == "PermissionError", (what, got[what])
        assert out["udp_received"] is False
        assert got["netlink"].pop("route") == "ok"
        assert set(got["netlink"].values()) == {"PermissionError"}, got["netlink"]
        policy = out["a_stats"][0]["protections"]["network"]
        assert policy.startswith("policy (1 rules: no network namespace of its own"), policy
        assert "Landlock ABI" in policy and "TCP rules" in policy, policy
    elif network == "off":
        for what in ("tcp_host", "udp_host", "raw", "packet", "unix_host", "dgram_pair"):
            assert got[what] == "PermissionError", (what, got[what])
        assert out["udp_received"] is False
        assert got["netlink"].pop("route") == "ok"              # what the filter allows
        assert set(got["netlink"].values()) == {"PermissionError"}, got["netlink"]
        assert out["a_stats"][0]["protections"]["network"].startswith("on ("), out["a_stats"]
    elif not scoped:
        assert unix.startswith("blocked (seccomp: no unix socket"), unix
        assert got["unix_host"] == got["dgram_pair"] == "PermissionError", got
        assert got["tcp_host"] == "ok"                          # the host's network, as asked
    else:
        assert unix == "not blocked (network on)" and got["tcp_host"] == "ok", unix


def assert_refused(out: dict, *missing: str) -> None:
    """Every call answered 503 naming what is missing; nothing ran."""
    for key in ("b_first", "attack", "kill", "b_again"):
        r = out[key]
        assert r["status_code"] == 503 and "not all in force" in r["error"], r
        for kind in missing:
            assert f"{kind}: " in r["error"], (kind, r["error"])
        assert 'confine="best-effort"' in r["error"]
    assert out["new_tenant"]["first"]["status_code"] == 503
    assert out["planted"] is False


def on(out: dict) -> dict:
    """The network-on attack (the default host_kind_attack.py runs)."""
    return out["on"]


@pytest.mark.parametrize("templates", [False, True], ids=["fresh", "templates"])
def test_root(open_tmp, templates):
    out = on(host("root", open_tmp, templates=templates))
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
    template (whose workers would rest on their uid alone for files, where a fresh worker
    gets a root of its own) refuses to import, so workers start fresh."""
    out = on(host("root_without_landlock", open_tmp, templates=templates))
    assert_apart(out, own_pid_namespace=True)
    assert "Landlock: unavailable (kernel without Landlock)" in \
        out["a_stats"][0]["protections"]["filesystem"]
    if templates:
        assert out["templates"] and all(t.startswith("refused: not in force: filesystem")
                                        for t in out["templates"]), out["templates"]
        assert out["a_stats"][0]["start"].startswith("fresh (refused: not in force")


def test_root_landlock_abi_5(open_tmp):
    """Landlock without the signal scope (Linux 6.2-6.11): a worker forked from the
    template holds by Landlock (files) and a uid of its tenant's own (processes), with no
    unix socket (no scope keeps abstract ones apart); a new tenant's first call comes from
    the template too.  (A fresh worker holds by its PID namespace: test_root.)"""
    got = host("root_abi_5", open_tmp, templates=True, abi=5, networks=["on", "off"])
    for network, out in got.items():
        assert out["templates"][-2:] == ["ok", "ok"], out["templates"]
        assert out["a_stats"][0]["start"] == "template"
        assert out["new_tenant"]["start"] == "template", out["new_tenant"]
        assert_apart(out, own_pid_namespace=False, by_uid=True, network=network)
        assert out["a_stats"][0]["protections"]["filesystem"].startswith("on (ABI 5)")
        assert_uid(out, per_tenant=True)


def test_container(open_tmp):
    """No CAP_SYS_ADMIN: the namespaces come through a user namespace the zygote maps (every
    uid to itself: it keeps CAP_SETUID), and the worker still becomes nobody."""
    out = on(host("container", open_tmp))
    assert_apart(out, own_pid_namespace=True)
    assert out["attack"]["output"]["uid"] == 65534
    assert out["a_stats"][0]["protections"]["privileges"].startswith("uid 65534 gid 65534")


def test_container_with_a_tenants_root_gives_each_tenant_its_own_uid(open_tmp):
    """The same with a tenants_root: the worker forked from the shared template (network
    on), as a uid of its own (the template keeps CAP_SETUID behind its key)."""
    out = on(host("container_tenants", open_tmp, templates=True))
    assert out["a_stats"][0]["start"] == "template" and out["templates"] == ["ok", "ok"]
    assert_apart(out, own_pid_namespace=False)
    assert_uid(out, per_tenant=True)


def test_container_without_user_namespaces_relies_on_landlock(open_tmp):
    out = on(host("container_no_userns", open_tmp))
    assert_apart(out, own_pid_namespace=False)
    assert out["attack"]["output"]["uid"] == 65534


def test_container_without_setuid_never_runs_a_worker_as_root(open_tmp):
    out = on(host("container_without_setuid", open_tmp))
    assert_refused(out, "privileges")


@pytest.mark.parametrize("landlock", [True, False], ids=["landlock", "without_landlock"])
def test_unprivileged(open_tmp, user_python, landlock):
    """A host that is not root: the same namespaces, through a user namespace mapping its
    uid to itself; the worker keeps the host's uid."""
    out = on(host("unprivileged" + ("" if landlock else "_without_landlock"), open_tmp,
                  user_python))
    assert_apart(out, own_pid_namespace=True)
    assert out["attack"]["output"]["uid"] == UNPRIVILEGED
    assert out["a_stats"][0]["protections"]["privileges"].startswith(f"uid {UNPRIVILEGED} ")


def test_unprivileged_without_user_namespaces_relies_on_landlock(open_tmp, user_python):
    out = on(host("unprivileged_no_userns", open_tmp, user_python))
    assert_apart(out, own_pid_namespace=False)


def test_unprivileged_without_user_namespaces_nor_landlock_is_refused(open_tmp, user_python):
    """Nothing keeps files apart (one uid, no Landlock, no root of its own): refused,
    naming files; processes are the host's guard's (kill(-1, SIGKILL) from a confined tool
    would kill the host without it)."""
    out = on(host("unprivileged_no_userns_without_landlock", open_tmp, user_python))
    assert_refused(out, "filesystem")
    assert "processes: " not in out["attack"]["error"], out["attack"]["error"]


def test_best_effort_without_landlock_runs_and_says_what_is_missing(open_tmp):
    """Degrading is opt-in: with confine="best-effort" the template imports and serves
    without Landlock (files rest on nothing: a fresh worker could have a root of its own
    here), and stats() say what is missing."""
    out = on(host("root_best_effort_without_landlock", open_tmp, confine="best-effort",
                  templates=True))
    assert out["b_first"]["status_code"] == out["attack"]["status_code"] == 200
    assert out["templates"] == ["ok", "ok"] and out["a_stats"][0]["start"] == "template"
    prot = out["a_stats"][0]["protections"]
    assert prot["filesystem"].startswith("unavailable (kernel without Landlock)"), prot
    assert prot["processes"].startswith("on (a uid of its tenant's own"), prot
    assert "kill" not in out                 # (it would reach every process of its uid)


# ------------------------------------------------------------------ default containers
#: Landlock in the container kinds: this kernel's (7), at most 5 (no scope: Linux 6.10, RHEL
#: 9.6), at most 3 (COS and Azure Linux 3 on 6.6), none (ENOSYS: COS before, gVisor).
ABIS = {"abi_7": 0, "abi_5": 5, "abi_3": 3, "without_landlock": 0}
ALL_NETWORKS = ["on", "off", "policy"]


def container(kind: str, tmp: Path, abi: str, user_python: str = "", **config) -> dict:
    """The attack in a default container (``kind``: docker or restricted) at ``abi``."""
    return host(f"{kind}_{abi}", tmp, user_python, abi=ABIS[abi], networks=ALL_NETWORKS,
                **config)


def assert_policy_refused(out: dict) -> None:
    """A network policy needs a network namespace of its own or Landlock's TCP rules (ABI
    4+): 503 naming both."""
    assert_refused(out, "network")
    assert "unshare: Operation not permitted" in out["attack"]["error"]
    assert "or Landlock ABI 4's TCP rules" in out["attack"]["error"], out["attack"]["error"]


#: The kinds' Landlock ABIs with TCP rules (4+): a network policy runs by port there.
TCP_RULES = ("abi_7", "abi_5")


@pytest.mark.parametrize("abi", list(ABIS))
def test_docker_default_with_a_tenants_root(open_tmp, abi):
    """Root in a default Docker container, a uid per tenant: no namespace at all, so
    processes are apart by Landlock's scope or else by the tenants' uids, files by Landlock
    or else by the uids and 0700 roots, the network off by the system call filter.  Every
    worker after a library's first is forked from its template, a new tenant's first too."""
    got = container("docker", open_tmp, abi, templates=True)
    landlock = abi != "without_landlock"
    for network in ("on", "off"):
        out = got[network]
        assert out["a_stats"][0]["start"] == "template", out["a_stats"]
        assert out["new_tenant"]["start"] == "template", out["new_tenant"]
        assert out["new_tenant"]["first"]["status_code"] == 200, out["new_tenant"]
        assert_apart(out, own_pid_namespace=False, by_uid=abi != "abi_7", landlock=landlock,
                     network=network)
        assert_uid(out, per_tenant=True)
        assert out["a_stats"][0]["protections"]["filesystem"].startswith(
            f"on (ABI {abi[-1]}" if landlock else "on (a uid of its tenant's own")
    assert "system call filter" in got["off"]["a_stats"][0]["protections"]["network"]
    if abi in TCP_RULES:
        assert_apart(got["policy"], own_pid_namespace=False, by_uid=abi != "abi_7",
                     network="policy")
    else:
        assert_policy_refused(got["policy"])


@pytest.mark.parametrize("abi", ["abi_5", "without_landlock"])
def test_docker_default_fresh_workers(open_tmp, abi):
    """The same with every worker fresh (the library's "template": false): each becomes its
    tenant's uid itself, with no PID namespace nor root of its own."""
    got = host(f"docker_{abi}", open_tmp, abi=ABIS[abi], networks=["on", "off"],
               tenants_root=True, fresh=True)
    for network, out in got.items():
        assert out["a_stats"][0]["start"].startswith("fresh (templates off"), out["a_stats"]
        assert_apart(out, own_pid_namespace=False, by_uid=True,
                     landlock=abi != "without_landlock", network=network)
        assert_uid(out, per_tenant=True)


def test_docker_default_with_a_listable_tenants_folder_is_refused_without_landlock(open_tmp):
    """Files apart by uid need the tenants' folder closed to listing: where it lists every
    tenant's folder to every uid (0755), 503 saying so (and how to fix it)."""
    out = on(host("docker_without_landlock", open_tmp, tenants_mode=0o755, templates=True))
    assert_refused(out, "filesystem")
    assert "lists the other tenants' folders" in out["attack"]["error"]
    assert "chmod 0711" in out["attack"]["error"]


def test_docker_default_with_a_tenants_folder_others_may_enter_is_refused_without_landlock(
        open_tmp):
    """A tenant's folder the host made 0755, before its tenant's first worker made it
    0700: by its name, every uid could read it.  While one is there, 503 naming it."""
    out = on(host("docker_without_landlock", open_tmp, unused_folder_mode=0o755,
                  templates=True))
    assert_refused(out, "filesystem")
    assert "holds what every uid may open by name: unused" in out["attack"]["error"]


@pytest.mark.parametrize("abi", ["abi_7", "abi_5", "without_landlock"])
def test_docker_default_with_one_uid_for_all(open_tmp, abi):
    """No tenants_root: every tenant's worker runs as nobody.  Landlock's scope keeps them
    apart (ABI 6+); below it the host's guard keeps their processes apart, and Landlock
    their files; without Landlock nothing keeps files apart (the uids are the same): 503."""
    got = container("docker", open_tmp, abi)
    if abi != "without_landlock":
        for network in ("on", "off"):
            assert_apart(got[network], own_pid_namespace=False, network=network,
                         guard=abi != "abi_7")
            assert got[network]["attack"]["output"]["uid"] == 65534
        assert_apart(got["policy"], own_pid_namespace=False, network="policy",
                     guard=abi != "abi_7")
        return
    for network in ALL_NETWORKS:
        assert_refused(got[network], "filesystem")


@pytest.mark.parametrize("abi", list(ABIS))
def test_kubernetes_restricted(open_tmp, user_python, abi):
    """A non-root pod with no capability, no_new_privs and the runtime's default profile:
    one uid for all (the host's).  Landlock's scope keeps tenants apart (ABI 6+); below it,
    the host's guard keeps their processes apart and Landlock their files: the library's
    template holds the guard before its import, and each worker forked from it is a tree
    of its own for the guard; without Landlock, 503 naming files."""
    got = container("restricted", open_tmp, abi, user_python, templates=True)
    if abi in ("abi_5", "abi_3"):
        for network in ("on", "off"):
            out = got[network]
            assert out["a_stats"][0]["start"] == "template", out["a_stats"]
            assert out["new_tenant"]["start"] == "template", out["new_tenant"]
            assert out["new_tenant"]["first"]["status_code"] == 200, out["new_tenant"]
            assert_apart(out, own_pid_namespace=False, network=network, guard=True)
            assert out["attack"]["output"]["uid"] == UNPRIVILEGED
            assert out["a_stats"][0]["pid"] != out["b_stats"][0]["pid"]
        if abi in TCP_RULES:
            assert_apart(got["policy"], own_pid_namespace=False, network="policy", guard=True)
        else:
            assert_policy_refused(got["policy"])
        return
    if abi == "abi_7":
        for network in ("on", "off"):
            out = got[network]
            assert out["a_stats"][0]["start"] == "template", out["a_stats"]
            assert out["new_tenant"]["start"] == "template", out["new_tenant"]
            assert_apart(out, own_pid_namespace=False, network=network)
            assert out["attack"]["output"]["uid"] == UNPRIVILEGED
        assert_apart(got["policy"], own_pid_namespace=False, network="policy")
        return
    for network in ALL_NETWORKS:
        assert_refused(got[network], "filesystem")


def test_the_emulated_profile_names_the_engines_numbers():
    """tests/support/without_landlock.py writes its numbers out; they are the kernel's (the engine's
    table agrees), so the emulation refuses what Docker's profile refuses."""
    from support import without_landlock as emulation

    from lcp_sandbox.core.syscall_numbers import number
    for machine, table in emulation.DOCKER_REFUSED.items():
        for name, nr in {**table, **emulation.DOCKER_REFUSED_GENERIC}.items():
            assert number(name, machine) == nr, (machine, name)
        assert number("clone", machine) == emulation.CLONE[machine]
        assert number("unshare", machine) == emulation.UNSHARE[machine]
        assert number("clone3", machine) == emulation.CLONE3


def test_the_emulated_container_holds_dockers_capabilities_and_profile():
    """Under --docker-default a root command holds Docker's 14 capabilities (0xa80425fb, as
    `docker run` gives its root), no_new_privs is not set, and namespaces are refused."""
    probe = ("import ctypes, os\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             "status = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)\n"
             "print(status['CapEff'].strip(), status['CapBnd'].strip(),\n"
             "      status['NoNewPrivs'].strip(), libc.unshare(0), ctypes.get_errno())")
    done = subprocess.run([sys.executable, str(WITHOUT_LANDLOCK), "--docker-default",
                           "--keep-landlock", sys.executable, "-c", probe],
                          capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["00000000a80425fb", "00000000a80425fb", "0", "-1", "1"]

