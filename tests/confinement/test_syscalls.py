"""A confined worker reaches only the system calls real tools use (the allowlist).

Real confined workers, network on and off, one binding each for the whole module:
refused families answer EPERM (clone3 ENOSYS) and the worker lives on; what tools do
(threads, fork, subprocess of git, asyncio, sqlite, numpy...) still works; the escape
hatch adds calls by name, dangerous ones only with the host's explicit switch.  A worker
started without the filter (lcp_sandbox.testing.protections_off) fails the same checks: the
tests can fail.  The filter programs themselves are checked by running them in a small
classic-BPF interpreter for every system call number of both architectures.
"""
import errno
import os
import socket
import threading
from pathlib import Path

import pytest
from conftest import FIXTURES
from support.confined_kinds import KINDS, Confined

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.core import syscalls as S
from lcp_sandbox.core.policy import SWITCHED_OFF
from lcp_sandbox.core.syscall_numbers import NUMBERS, number
from lcp_sandbox.testing import protections_off
from lcp_sandbox.worker.confine import seccomp

LIBS = FIXTURES / "syscall_libs"
MACHINE = os.uname().machine
pytestmark = pytest.mark.skipif(MACHINE not in ("x86_64", "aarch64"),
                                reason="no filter for this architecture")
#: Refused calls that reach their kernel handler without the filter (another answer than
#: EPERM there): a worker that answers EPERM to them has the filter.
TELLTALE = {"setns", "clone_newuser", "clone3", "bpf", "keyctl", "open_tree", "unshare",
            "process_vm_readv", "kcmp", "pidfd_getfd", "name_to_handle_at", "ioctl_tiocsti",
            "prlimit64_other", "personality_set", "setpriority_pid",
            "sched_setaffinity_pid", "sched_setscheduler_pid", "sched_setparam_pid",
            "ioprio_set_pid"}


def violations(refused: dict) -> set:
    """The probes of tool_refused that the allowlist did not answer as it should."""
    want = {"clone3": errno.ENOSYS}
    return {k for k, (rc, err) in refused.items() if rc >= 0 or err != want.get(k, errno.EPERM)}


@pytest.fixture(scope="module")
def root(open_tmp_module):
    return open_tmp_module


@pytest.fixture(scope="module", params=KINDS)
def sup(request, root):
    """Confined workers of one start kind (confined_kinds.py) for the whole module."""
    c = Confined(request.param, root / request.param)
    c.sup.kind = c
    yield c.sup
    c.close()


def make(sup, root: Path, tenant: str, confine=True, **sandbox) -> SandboxedBinding:
    configs = {"sysprobe": {"sandbox": sandbox}} if sandbox else None
    return sup.kind.binding(LIBS, tenant, host_tool_configs=configs, confine=confine)


@pytest.fixture(scope="module")
def on(sup, root):
    return make(sup, root, "on")


@pytest.fixture(scope="module")
def off(sup, root):
    return make(sup, root, "off", network=False)


@pytest.fixture(scope="module")
def bare(sup, root):
    """A confined worker started without the allowlist (the switch tests use)."""
    with protections_off(sup, "syscalls"):
        t = make(sup, root, "bare", confine="best-effort")      # (True would refuse it: 503)
        assert t.execute_tool("tool_increment", {})["success"]      # started now, unfiltered
    return t


def protections(sup, tenant: str) -> dict:
    return sup.stats(tenant=tenant)[0]["protections"]


@pytest.mark.parametrize("which", ["on", "off"])
def test_refused_families_answer_eperm_and_the_worker_lives_on(which, on, off, sup):
    t = {"on": on, "off": off}[which]
    before = t.execute_tool("tool_increment", {})["output"]
    pid = sup.stats(tenant=which)[0]["pid"]
    refused = t.execute_tool("tool_refused", {})["output"]
    assert TELLTALE <= set(refused)
    assert violations(refused) == set(), refused
    assert t.execute_tool("tool_increment", {})["output"] == before + 1      # state kept
    assert sup.stats(tenant=which)[0]["pid"] == pid
    assert protections(sup, which)["syscalls"] == (
        f"allowlist ({len(S.allowed_on(MACHINE))} calls, {MACHINE})")


def test_a_worker_without_the_filter_fails_the_same_checks(bare, sup):
    refused = bare.execute_tool("tool_refused", {})["output"]
    assert TELLTALE <= violations(refused), refused
    assert protections(sup, "bare")["syscalls"] == SWITCHED_OFF
    assert protections(sup, "bare")["filesystem"].startswith("on (")    # only the filter is off


def test_unconfined_workers_are_not_filtered(root):
    with Supervisor() as plain:
        t = SandboxedBinding(tools_folders=[LIBS], supervisor=plain, workspace=str(root))
        assert t.execute_tool("tool_call", {"name": "clone3"})["output"][1] != errno.ENOSYS
        assert plain.stats()[0]["protections"]["syscalls"] == "not confined"


@pytest.mark.parametrize("which", ["on", "off"])
def test_calls_with_argument_rules_keep_their_allowed_forms(which, on, off):
    allowed = {"on": on, "off": off}[which].execute_tool("tool_allowed", {})["output"]
    assert all(err != errno.EPERM for _, err in allowed.values()), allowed
    # (getppid: 1 in its own PID namespace, the init beside a fresh worker)
    assert allowed["personality_query"][0] >= 0 and allowed["getppid"][0] >= 0
    assert allowed["prctl_get_nnp"] == [1, 0]                  # no_new_privs is set


@pytest.mark.parametrize("which", ["on", "off"])
def test_what_tools_do_still_works(which, on, off):
    corpus = {"on": on, "off": off}[which].execute_tool("tool_corpus", {})
    assert corpus["success"], corpus
    assert corpus["output"] == dict.fromkeys(corpus["output"], "ok")
    assert {"threads", "fork", "subprocess", "asyncio", "sqlite", "numpy"} <= set(corpus["output"])


def test_tcp_to_a_loopback_listener_with_the_network_on(on):
    with socket.create_server(("127.0.0.1", 0)) as srv:
        def serve() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.sendall(b"hello\n")
        th = threading.Thread(target=serve, daemon=True)
        th.start()
        r = on.execute_tool("tool_tcp", {"port": srv.getsockname()[1]})
        th.join(10)
    assert r["output"] == "hello\n", r


def test_timeout_and_memory_limit_keep_their_codes(on, sup, root):
    before = on.execute_tool("tool_increment", {})["output"]
    r = on.execute_tool("tool_sleep", {"seconds": 30}, timeout_s=0.5)
    assert r["status_code"] == 504, r
    assert on.execute_tool("tool_increment", {})["output"] == before + 1    # interrupted, kept
    mem = make(sup, root, "mem", memory_mb=300)
    r = mem.execute_tool("tool_eat", {"mb": 1024})
    assert r["status_code"] == 507, r
    assert protections(sup, "mem")["syscalls"].startswith("allowlist")


class Client:
    def generate_text(self, prompt: str) -> str:
        return f"host says {prompt}"


def test_host_objects_confirm_relay_and_code_registered_at_run_time(sup, root):
    ws = sup.kind.tenants_root / "relay"
    ws.mkdir()
    t = SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant="relay", workspace=str(ws),
                         workspace_root=str(ws), confirm_handler=lambda *a: ("allow", "fine"))
    assert t.execute_tool("tool_confirm", {})["output"] == ["allow", "fine"]
    r = t.execute_tool("tool_client", {}, lollms_client_instance=Client())
    assert r["output"] == "host says hi", r
    code = ("import subprocess\n"
            "def tool_git_version() -> dict:\n"
            "    '''git --version, from code registered at run time.'''\n"
            "    out = subprocess.run(['git', '--version'], capture_output=True, text=True)\n"
            "    return {'success': True, 'output': out.stdout}\n")
    assert t.register_tool_from_code("gitv", code)
    assert t.execute_tool("tool_git_version", {})["output"].startswith("git version")
    assert all(s["protections"]["syscalls"].startswith("allowlist") for s in t.stats())


def test_a_library_adds_calls_by_name(sup, root):
    plain = make(sup, root, "mq-default")
    assert plain.execute_tool("tool_mq", {})["output"] == [-1, errno.EPERM]
    mq = make(sup, root, "mq", syscalls={"allow": ["mq_unlink", "ioctl"]})
    # the kernel's own answer now, not the filter's EPERM: no such queue (ENOENT), or, seen
    # once on a machine running two suites at once, EACCES from the queues' file system
    assert mq.execute_tool("tool_mq", {})["output"] in ([-1, errno.ENOENT], [-1, errno.EACCES])
    refused = mq.execute_tool("tool_refused", {})["output"]
    assert violations(refused) == {"ioctl_tiocsti"}                  # its rule was lifted
    assert protections(sup, "mq")["syscalls"] == (
        f"allowlist ({len(S.allowed_on(MACHINE, ('mq_unlink',)))} calls, {MACHINE}; "
        "the library's: mq_unlink, ioctl)")


def test_dangerous_calls_need_the_hosts_explicit_switch(sup, root):
    t = make(sup, root, "bpf", syscalls={"allow": ["bpf"]})
    r = t.execute_tool("tool_call", {"name": "bpf"})
    assert r["status_code"] == 500 and "allow_dangerous" in r["error"] and "bpf" in r["error"], r
    assert sup.stats(tenant="bpf") == []                             # no worker was started
    t = make(sup, root, "bpf-yes", syscalls={"allow": ["bpf"], "allow_dangerous": True})
    assert t.execute_tool("tool_call", {"name": "bpf"})["output"][1] != errno.EPERM
    t = make(sup, root, "typo", syscalls={"allow": ["mq_unlnk"]})
    r = t.execute_tool("tool_call", {"name": "bpf"})
    assert r["status_code"] == 500 and "'mq_unlnk' is no system call" in r["error"], r
    assert "did you mean 'mq_unlink'" in r["error"]


def test_check_setting():
    assert S.check_setting(None) is None
    assert S.check_setting({"allow": ["mq_open", "mq_open"]}) == {"allow": ("mq_open",),
                                                                  "allow_dangerous": False}
    for bad, text in ((["x"], "must be a dict"), ({"allow": "mq_open"}, "list"),
                      ({"alow": []}, "takes"), ({"allow": ["socket"]}, "follow"),
                      ({"allow": ["clone3"]}, "namespaces"), ({"allow": ["ptrace"]}, "dangerous"),
                      ({"allow": [], "allow_dangerous": "yes"}, "true or false")):
        with pytest.raises((ValueError, TypeError), match=text):
            S.check_setting(bad)


# ------------------------------------------------------------ the programs, interpreted
AUDIT = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def run_bpf(rows: tuple, nr: int, arch: int, args: tuple = ()) -> int:
    """Classic BPF as seccomp runs it, for the instructions the generator emits."""
    words = {0: nr, 4: arch}
    for i, a in enumerate(args):
        words[16 + 8 * i], words[20 + 8 * i] = a & 0xFFFFFFFF, a >> 32
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = rows[pc]
        pc += 1
        if code == 0x20:
            acc = words.get(k, 0)
        elif code == 0x54:
            acc &= k
        elif code == 0x05:
            pc += k
        elif code == 0x06:
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf


ALLOW, EPERM = 0x7FFF0000, 0x50000 | errno.EPERM


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
@pytest.mark.parametrize("network", [True, False])
def test_the_program_answers_every_number_as_the_tables_say(machine, network):
    rows = seccomp.filter_program(machine, network)
    arch = AUDIT[machine]
    allowed = set(S.allowed_on(machine))
    for name in NUMBERS:
        nr = number(name, machine)
        if nr is None or name in S.FILTERED:
            continue
        want = (0x50000 | errno.ENOSYS if name in S.ENOSYS else ALLOW if name in allowed else EPERM)
        assert run_bpf(rows, nr, arch) == want, name
    for nr in (500, 1000, 0x3FFFFFFF, 0x40000000 | 41, 0xFFFFFFFF):
        assert run_bpf(rows, nr, arch) == EPERM, nr
    assert run_bpf(rows, 0, arch ^ 1) == EPERM                       # another ABI
    clone, sock = number("clone", machine), number("socket", machine)
    assert run_bpf(rows, clone, arch, (0x3D0F00,)) == ALLOW              # pthread_create's
    assert run_bpf(rows, clone, arch, (0x01200011,)) == ALLOW            # fork()'s
    assert run_bpf(rows, clone, arch, (0x10000000 | 17,)) == EPERM       # CLONE_NEWUSER
    assert run_bpf(rows, clone, arch, (0x40000000,)) == EPERM            # CLONE_NEWNET
    for family, ok in ((socket.AF_INET, network), (socket.AF_INET6, network),
                       (socket.AF_NETLINK, True), (socket.AF_UNIX, network), (40, False),
                       (38, False), (17, False)):
        assert (run_bpf(rows, sock, arch, (family, 1, 0)) == ALLOW) == ok, family
    # network off: NETLINK_ROUTE only (NETLINK_USERSOCK would connect workers of one namespace)
    assert (run_bpf(rows, sock, arch, (socket.AF_NETLINK, 3, 2)) == ALLOW) == network
    ioctl, prctl = number("ioctl", machine), number("prctl", machine)
    assert run_bpf(rows, ioctl, arch, (0, 0x5401)) == ALLOW
    assert run_bpf(rows, ioctl, arch, (0, 0x5412)) == EPERM                # TIOCSTI
    assert run_bpf(rows, prctl, arch, (15,)) == ALLOW
    assert run_bpf(rows, prctl, arch, (35,)) == EPERM                      # PR_SET_MM
    pl = number("prlimit64", machine)
    assert run_bpf(rows, pl, arch, (0,)) == ALLOW and run_bpf(rows, pl, arch, (1,)) == EPERM
    sp, io = number("setpriority", machine), number("ioprio_set", machine)
    assert run_bpf(rows, sp, arch, (0, 0, 5)) == ALLOW                      # os.nice
    assert run_bpf(rows, sp, arch, (0, 4242, 5)) == run_bpf(rows, sp, arch, (2, 0, 5)) == EPERM
    assert run_bpf(rows, io, arch, (1, 0)) == ALLOW
    assert run_bpf(rows, io, arch, (1, 4242)) == run_bpf(rows, io, arch, (2, 0)) == EPERM
    for name in ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr"):
        nr = number(name, machine)
        assert run_bpf(rows, nr, arch, (0,)) == ALLOW and run_bpf(rows, nr, arch, (7,)) == EPERM


def test_denylist_without_the_allowlist_keeps_the_unix_socket_rules():
    for machine in ("x86_64", "aarch64"):
        rows, arch = seccomp.filter_program(machine, False, False), AUDIT[machine]
        assert run_bpf(rows, number("bpf", machine), arch) == ALLOW
        assert run_bpf(rows, number("io_uring_setup", machine), arch) == EPERM
        assert run_bpf(rows, number("socket", machine), arch, (socket.AF_UNIX,)) != ALLOW
        pair = number("socketpair", machine)
        assert run_bpf(rows, pair, arch, (1, socket.SOCK_STREAM)) == ALLOW
        assert run_bpf(rows, pair, arch, (1, socket.SOCK_DGRAM)) != ALLOW
