"""A confined worker holds no privilege: no capabilities, not root, no pathname unix sockets.

Real workers, real sockets.  The host runs as root on the machines this is written
for (and in CI); the tests that need a root host skip elsewhere, saying why.
"""
import ctypes
import errno
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading

import pytest
from conftest import FIXTURES
from support.confined_kinds import KINDS, NAMESPACES_REFUSED, Confined

from lcp_sandbox import Limits, SandboxedBinding, Supervisor
from lcp_sandbox import protocol as P
from lcp_sandbox.backends.local.confine import handover, temp_dirs
from lcp_sandbox.testing import protections_off
from lcp_sandbox.worker.confine import seccomp

LIBS = FIXTURES / "priv_libs"
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the host is not root: no uid to drop to, nothing to chown")
ZERO = "0000000000000000"
BLOCKED = seccomp.UNIX_BLOCKED


def unix_on(sup) -> str:
    """A network-on confined worker's unix sockets: the host's, under Landlock's scope;
    none at all without it (abstract ones would reach the host's and other tenants')."""
    return "not blocked (network on)" if sup.kind.scoped else seccomp.UNIX_BLOCKED_ON


def host_status() -> dict:
    with open("/proc/self/status") as f:
        return {k: " ".join(v.split()) for k, _, v in (line.partition(":") for line in f)}


@pytest.fixture
def roots(open_tmp):
    a, b = open_tmp / "tenant_a", open_tmp / "tenant_b"
    a.mkdir(), b.mkdir()
    return a, b


@pytest.fixture(params=KINDS)
def kind(request, open_tmp):
    """Confined workers of one start kind (confined_kinds.py), tenants under open_tmp."""
    c = Confined(request.param, open_tmp)
    yield c
    c.close()


@pytest.fixture
def sup(kind):
    kind.sup.kind = kind
    return kind.sup


def binding(sup, root, tenant="a", **kw):
    if hasattr(sup, "kind"):
        return sup.kind.binding(LIBS, tenant, root=root, **kw)
    return SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant=tenant, workspace=str(root),
                            workspace_root=str(root), **kw)


def test_confined_worker_holds_no_capabilities(sup, roots):
    a, _ = roots
    st = binding(sup, a).execute_tool("tool_status", {})["output"]
    for key in ("CapEff", "CapPrm", "CapInh", "CapAmb"):
        assert st[key] == ZERO, (key, st)
    if ROOT:                                  # a non-root host may lack CAP_SETPCAP to clear it
        assert st["CapBnd"] == ZERO
    assert st["NoNewPrivs"] == "1"
    assert sup.stats()[0]["protections"]["privileges"].startswith("uid ")


@needs_root
def test_confined_worker_of_a_root_host_runs_as_nobody_or_its_tenants_own_uid(sup, roots):
    """By default a root host's confined worker is nobody; with a tenants_root each tenant
    has a uid of its own (run_as="per-tenant"), taken from the shared template too."""
    a, _ = roots
    (a / "from_host.txt").write_text("host wrote this;")          # root's, until handed over
    t = binding(sup, a)
    st = t.execute_tool("tool_status", {})["output"]
    per_tenant = sup.kind.kind != "fresh"                          # (it declared tenants_root)
    uid = sup.uids.of("a")[0] if per_tenant else 65534
    assert uid != 65534 or not per_tenant
    assert st["Uid"] == f"{uid} {uid} {uid} {uid}" and st["Gid"] == f"{uid} {uid} {uid} {uid}"
    assert st["Groups"] == ""
    r = t.execute_tool("tool_write", {"name": "from_host.txt", "text": "the worker too"})
    assert r["success"], r
    assert (a / "from_host.txt").read_text() == "host wrote this;the worker too"
    assert r["output"]["tmp_owner"] == uid
    assert os.stat(a).st_uid == os.stat(a / "from_host.txt").st_uid == uid
    if per_tenant:                                                 # its uid's alone
        assert stat.S_IMODE(os.stat(a).st_mode) == 0o700
    assert t.execute_tool("tool_write", {"name": "new.txt", "text": "x"})["success"]
    assert os.stat(a / "new.txt").st_uid == uid
    prot = sup.stats()[0]["protections"]
    assert prot["privileges"].startswith(f"uid {uid} gid {uid}, no capabilities"), prot
    assert ("taken from the shared template" in prot["privileges"]) == (
        not sup.stats()[0]["start"].startswith("fresh") and per_tenant), prot
    assert prot["unix_sockets"] == unix_on(sup)


@needs_root
@pytest.mark.parametrize("start", KINDS)
def test_run_as_is_configurable(roots, open_tmp, start):
    a, b = roots
    kind = Confined(start, open_tmp, run_as=(4242, 4343))
    with kind.sup as sup:
        sup.kind = kind
        ta = binding(sup, a)
        tb = binding(sup, b, tenant="b", host_tool_configs={"privprobe": {"sandbox": {"run_as": [5151, 5252]}}})
        assert ta.execute_tool("tool_status", {})["output"]["Uid"] == "4242 4242 4242 4242"
        assert ta.execute_tool("tool_status", {})["output"]["Gid"] == "4343 4343 4343 4343"
        assert tb.execute_tool("tool_status", {})["output"]["Uid"] == "5151 5151 5151 5151"
        assert tb.execute_tool("tool_write", {"name": "f.txt", "text": "x"})["success"]
        assert (os.stat(b / "f.txt").st_uid, os.stat(b / "f.txt").st_gid) == (5151, 5252)
        assert {s["tenant"]: s["protections"]["privileges"] for s in sup.stats()} == {
            "a": "uid 4242 gid 4343, no capabilities", "b": "uid 5151 gid 5252, no capabilities"}
        kind.check(ta), kind.check(tb)


@needs_root
@pytest.mark.parametrize("start", KINDS)
def test_paths_below_a_root_only_folder_stay_reachable(tmp_path, start):
    """pytest's tmp_path lies below 0700 folders of root (as Python does on machines
    where it is installed in root's home directory): the worker's library and workspace there are
    reachable by its uid, and nothing else of those folders is."""
    if NAMESPACES_REFUSED:
        pytest.skip("a filter refuses mount namespaces here (a default container): a folder "
                    "only root may pass cannot be covered for the worker")
    lib, ws = tmp_path / "libs", tmp_path / "tenants" / "ws"
    shutil.copytree(LIBS, lib, ignore=shutil.ignore_patterns("__pycache__"))
    ws.mkdir(parents=True)
    (tmp_path / "beside.txt").write_text("not for the worker")
    c = Confined(start, tmp_path / "tenants")
    try:
        t = c.binding(lib, "default", root=ws)
        uid = c.sup.uids.of("default")[0] if c.sup.run_as == "per-tenant" else 65534
        assert t.execute_tool("tool_status", {})["output"]["Uid"] == f"{uid} {uid} {uid} {uid}"
        assert t.execute_tool("tool_write", {"name": "f.txt", "text": "x"})["success"]
        assert t.execute_tool("tool_import", {"name": "wave"})["success"]       # stdlib, not preloaded
        assert t.execute_tool("tool_read", {"path": str(tmp_path / "beside.txt")})["output"] in (
            "FileNotFoundError", "PermissionError")
        fs = c.sup.stats()[0]["protections"]["filesystem"]
        # a fresh worker's own root holds the way down to them; a forked one covers the folder
        assert fs.startswith("on (own root" if c.own_namespaces else "on (") and (
            c.own_namespaces or "covered (own mount namespace" in fs), fs
        c.check(t)
    finally:
        c.close()
    assert not any(str(tmp_path) in line for line in open("/proc/self/mountinfo"))    # host unchanged


def test_run_as_never_root():
    with pytest.raises(ValueError):
        Supervisor(run_as=(0, 0))
    with pytest.raises(ValueError):
        Limits(run_as=(1000, 0))
    with pytest.raises(ValueError):
        Limits.merged(Limits(), {"run_as": "nobody"})
    assert Limits.merged(Limits(), {"run_as": [1001, 1002]}).run_as == (1001, 1002)


def test_tool_cannot_take_privileges_back(sup, roots):
    a, _ = roots
    (a / "mine.txt").write_text("x")
    attempts = [("setuid0", ""), ("setgid0", ""), ("raw_socket", ""), ("chown_root", str(a / "mine.txt"))]
    t = binding(sup, a)
    for what, path in attempts:
        out = t.execute_tool("tool_try", {"what": what, "path": path})["output"]
        assert out["ok"] is False and out["error"] == "PermissionError", (what, out)
    if ROOT:       # the same attempts work in an unconfined worker of this host: the test can fail
        with Supervisor() as plain:
            u = SandboxedBinding(tools_folders=[LIBS], supervisor=plain, workspace=str(a))
            for what, path in attempts:
                assert u.execute_tool("tool_try", {"what": what, "path": path})["output"] == {"ok": True}, what


def test_unconfined_worker_is_unchanged(roots):
    a, _ = roots
    with Supervisor() as plain:
        u = SandboxedBinding(tools_folders=[LIBS], supervisor=plain, workspace=str(a))
        st = u.execute_tool("tool_status", {})["output"]
        host = host_status()
        for key in ("Uid", "Gid", "CapEff", "CapPrm", "CapBnd"):
            assert st[key] == host[key], key
        assert st["Seccomp"] == host["Seccomp"]             # (the host's filters, if any: none added)
        prot = plain.stats()[0]["protections"]
        assert prot["privileges"] == f"the host's (uid {os.geteuid()}, not confined)"
        assert prot["unix_sockets"] == "not blocked (not confined)"


def test_hand_over_refuses_system_folders(open_tmp):
    for path in ("/", "/usr", "/etc", "/tmp", "/home", os.path.dirname(sys.prefix), sys.prefix):
        assert not handover.may_hand_over(os.path.realpath(path)), path
    assert handover.may_hand_over(str(open_tmp / "ws"))


@needs_root
def test_refused_root_fails_the_call_and_changes_nothing(roots, monkeypatch):
    a, _ = roots
    monkeypatch.setattr(handover, "may_hand_over", lambda path: False)      # as for "/" or /usr
    with Supervisor(confine=True) as sup:
        r = binding(sup, a).execute_tool("tool_status", {})
    assert r["status_code"] == 403 and "is or holds a system directory" in r["error"], r
    assert os.stat(a).st_uid == 0


@needs_root
def test_hand_over_never_follows_links(open_tmp):
    root, outside = open_tmp / "ws", open_tmp / "outside"
    (root / "sub" / "deeper").mkdir(parents=True)
    outside.mkdir()
    (root / "sub" / "deeper" / "f.txt").write_text("x")
    (outside / "secret.txt").write_text("s")
    (outside / "linked.txt").write_text("l")
    (root / "to_secret").symlink_to(outside / "secret.txt")
    (root / "sub" / "to_outside").symlink_to(outside, target_is_directory=True)
    os.link(outside / "linked.txt", root / "hardlink.txt")
    os.mkfifo(root / "fifo")
    handover.hand_over(str(root), 4242, 4343)
    for p in (root, root / "sub", root / "sub" / "deeper", root / "sub" / "deeper" / "f.txt"):
        assert (os.stat(p).st_uid, os.stat(p).st_gid) == (4242, 4343), p
    for p in (outside, outside / "secret.txt", outside / "linked.txt", root / "fifo"):
        assert os.stat(p).st_uid == 0, p
    assert os.lstat(root / "to_secret").st_uid == 0
    handover.hand_over(str(open_tmp / "missing"), 4242, 4343)          # nothing there: nothing done


@needs_root
def test_a_root_swapped_for_a_link_is_neither_given_nor_made_private(open_tmp, monkeypatch):
    """A tenant's root inside a folder its own uid owns (a project in its tenant's root):
    that tenant's worker can swap the root for a link once the host checked the path.
    The host then gives nothing, sets no mode through the link, and refuses the start."""
    tenant, victim = open_tmp / "t", open_tmp / "victim"
    root = tenant / "proj"
    root.mkdir(parents=True)
    victim.mkdir()
    os.chmod(victim, 0o755)
    checked = handover.may_hand_over

    def then_swapped(path):
        allowed = checked(path)
        if os.path.isdir(root) and not os.path.islink(root):
            os.rename(root, tenant / "away")
            os.symlink(victim, root)
        return allowed

    monkeypatch.setattr(handover, "may_hand_over", then_swapped)
    init = P.Init("lib", [], None, {}, 0, [], {}, {"root": str(root), "read_paths": []}, None, [], {})
    with pytest.raises(PermissionError, match="was replaced"):         # the start is refused
        handover.hand_over_root(init, (4242, 4242), "lib", "tool_x", private=True, nproc=8)
    st = os.stat(victim)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    assert os.path.islink(root)                                 # the swap did happen


@needs_root
@pytest.mark.parametrize("swap", ["link", "folder"])
def test_a_temp_dir_swapped_before_it_is_given_gives_nothing(open_tmp, monkeypatch, swap):
    """A worker whose uid owns the folder the temp dirs are made in can replace a new one
    at once (inotify names it): by a link to any file, or by a folder of its own.  The host
    gives nothing through it, and the worker's start fails, naming why."""
    victim = open_tmp / "victim"
    victim.write_text("root's")
    made, left = temp_dirs.made_dir, []

    def swapped(prefix, parent=None):
        path = made(prefix, parent)
        left.append(path)
        os.rmdir(path)
        if swap == "link":
            os.symlink(victim, path)
        else:
            os.mkdir(path)
            os.chown(path, 4242, 4242)
        return path

    monkeypatch.setattr(temp_dirs, "made_dir", swapped)
    with pytest.raises(PermissionError, match="was replaced"):
        temp_dirs.private_tmpdir((4242, 4242), str(open_tmp))
    assert os.stat(victim).st_uid == 0
    a = open_tmp / "a"
    a.mkdir()
    try:
        with Supervisor(confine=True) as sup:
            r = binding(sup, a).execute_tool("tool_status", {})
    finally:
        for path in left:                               # what the swap left in the system's temp dir
            os.unlink(path) if os.path.islink(path) else shutil.rmtree(path, ignore_errors=True)
    assert r["status_code"] == 503 and "could not start a worker" in r["error"], r
    assert "was replaced" in r["error"] and "tool_status" in r["error"], r
    assert os.stat(victim).st_uid == 0


@needs_root
def test_temp_dirs_are_not_made_in_a_folder_swapped_for_a_link(open_tmp):
    """The temp dirs' folder of a template whose workers share a uid is that uid's: a worker
    can swap it for a link.  The host makes no folder where the link points."""
    parent, elsewhere = open_tmp / "parent", open_tmp / "elsewhere"
    elsewhere.mkdir()
    parent.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(PermissionError, match="was replaced"):
        temp_dirs.private_tmpdir((4242, 4242), str(parent))
    assert os.listdir(elsewhere) == []
    made = temp_dirs.private_tmpdir((4242, 4242), str(elsewhere))
    assert os.path.dirname(made) == str(elsewhere) and os.stat(made).st_uid == 4242


@needs_root
def test_hand_over_skips_mount_points(open_tmp):
    """A folder of the same file system bind-mounted into the root is not handed over
    (in a child process with its own mount namespace: the host's mounts stay as they are),
    also when the host read its mount table before the mount (it keeps it until the
    kernel says the table changed)."""
    if NAMESPACES_REFUSED:
        pytest.skip("a filter refuses mount(2) here (a default container): the test's own "
                    "bind mount cannot be made")
    root, outside = open_tmp / "ws", open_tmp / "outside"
    (root / "mnt").mkdir(parents=True)
    outside.mkdir()
    (outside / "f.txt").write_text("x")
    code = f"""if True:
        import ctypes, os
        from lcp_sandbox.backends.local.confine import handover
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.unshare(0x20000) == 0
        assert libc.mount(b"none", b"/", None, 16384 | (1 << 18), None) == 0       # MS_REC | MS_PRIVATE
        handover.hand_over({str(root)!r}, 4141, 4141)             # the mount table read (and kept)
        assert libc.mount({str(outside).encode()!r}, {str(root / "mnt").encode()!r}, None, 4096, None) == 0
        handover.hand_over({str(root)!r}, 4242, 4343)
        print(os.stat({str(root / "mnt" / "f.txt")!r}).st_uid, os.stat({str(root)!r}).st_uid)
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "4242"]
    assert os.stat(outside / "f.txt").st_uid == 0


# ------------------------------------------------------------------ unix sockets
@pytest.fixture
def services(roots, open_tmp):
    """Pathname unix sockets served by the host: one in tenant b's workspace, one
    standing for a host service (a docker socket would be one).  Both are mode 0666
    in searchable folders, so only the sandbox can keep a worker out."""
    a, b = roots
    (open_tmp / "run").mkdir(mode=0o755)
    paths = [str(b / "tenant_b.sock"), str(open_tmp / "run" / "service.sock")]
    servers = []
    for path in paths:
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        os.chmod(path, 0o666)
        srv.listen(8)
        srv.settimeout(30)
        servers.append(srv)

        def serve(srv=srv, name=os.path.basename(path)):
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                with conn:
                    conn.sendall(f"hello from {name}\n".encode())

        threading.Thread(target=serve, daemon=True).start()
    yield paths
    for srv in servers:
        srv.close()


def test_unix_sockets_blocked_when_network_off(sup, roots, services):
    a, _ = roots
    off = binding(sup, a, host_tool_configs={"privprobe": {"sandbox": {"network": False}}})
    for path in services:
        r = off.execute_tool("tool_unix_connect", {"path": path})
        assert r["success"] is False and r["error"].startswith("PermissionError"), r
    pairs = off.execute_tool("tool_pairs", {})["output"]   # the channel still works, so do pairs
    assert pairs == {"stream": "ping", "seqpacket": "ping", "dgram": "PermissionError", "asyncio": "ran"}
    # Its only socket is its channel to the host: connected, stream.
    assert off.execute_tool("tool_sockets", {})["output"] == [[socket.AF_UNIX, socket.SOCK_STREAM, True]]
    assert sup.stats()[0]["protections"]["unix_sockets"] == BLOCKED

    # The same tool reaches both sockets without the protection: the test can fail.
    on = binding(sup, a, tenant="a-network-on")
    with Supervisor() as plain:
        # (network off needs a namespace for an unconfined worker: a default container has
        # none, and the network on reaches pathname sockets all the same)
        unconfined = SandboxedBinding(tools_folders=[LIBS], supervisor=plain, workspace=str(a),
                                      host_tool_configs={"privprobe": {"sandbox": {
                                          "network": NAMESPACES_REFUSED}}})
        for path in services:
            name = os.path.basename(path)
            got = on.execute_tool("tool_unix_connect", {"path": path})["output"]
            # its own root: neither socket is there at all; without Landlock's scope it
            # has no unix socket at all
            if sup.kind.own_namespaces or not sup.kind.scoped:
                assert got != f"hello from {name}\n", got
            else:
                assert got == f"hello from {name}\n"
            assert unconfined.execute_tool("tool_unix_connect", {"path": path})["output"] == f"hello from {name}\n"
        assert plain.stats()[0]["protections"]["unix_sockets"] == "not blocked (not confined)"
    assert {s["tenant"]: s["protections"]["unix_sockets"] for s in sup.stats()} == {
        "a": BLOCKED, "a-network-on": unix_on(sup)}


def works_here(family: int) -> bool:
    try:
        socket.socket(family, socket.SOCK_STREAM).close()
        return True
    except OSError:
        return False


def io_uring_here() -> list:
    """io_uring_setup(1, params) in this (host) process: [worked, errno]."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(425), ctypes.c_long(1), ctypes.create_string_buffer(120))
    if rc >= 0:
        os.close(rc)
        return [1, 0]
    return [0, ctypes.get_errno()]


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="no filter for this architecture")
def test_side_doors_to_sockets_are_closed(sup, roots):
    """Other socket families (AF_VSOCK is in no network namespace), io_uring (it can
    create sockets) and x32 system call numbers are refused with the network off, and
    by the allowlist with it on too (AF_UNIX then allowed); without the filter the same
    calls get the answer the host gets."""
    a, _ = roots
    off = binding(sup, a, host_tool_configs={"privprobe": {"sandbox": {"network": False}}})
    on = binding(sup, a, tenant="a-network-on")
    assert off.execute_tool("tool_socket", {"family": socket.AF_INET})["output"] == "PermissionError"
    assert on.execute_tool("tool_socket", {"family": socket.AF_INET})["output"] == "ok"
    assert on.execute_tool("tool_socket", {"family": socket.AF_UNIX})["output"] == (
        "ok" if sup.kind.scoped else "PermissionError")
    with protections_off(sup, "syscalls"):                      # started now, without the filter
        bare = binding(sup, a, tenant="a-no-filter", confine="best-effort")
        assert bare.execute_tool("tool_socket", {"family": socket.AF_INET})["output"] == "ok"
    for family in (getattr(socket, "AF_VSOCK", 40), 38):                       # 38: AF_ALG
        for t in (off, on):
            assert t.execute_tool("tool_socket", {"family": family})["output"] == "PermissionError"
        if works_here(family):
            assert bare.execute_tool("tool_socket", {"family": family})["output"] == "ok", family
    assert off.execute_tool("tool_socket", {"family": socket.AF_UNIX})["output"] == "PermissionError"
    for t in (off, on):
        assert t.execute_tool("tool_syscall", {"name": "io_uring_setup"})["output"] == [0, errno.EPERM]
    if io_uring_here() == [1, 0]:
        assert bare.execute_tool("tool_syscall", {"name": "io_uring_setup"})["output"] == [1, 0]
    if os.uname().machine == "x86_64":
        # x32 numbers are refused whatever the call; without the filter this kernel answers
        # otherwise (a socket, or ENOSYS when x32 is not built in).
        for t in (off, on):
            assert t.execute_tool("tool_syscall", {"name": "x32_socket"})["output"] == [0, errno.EPERM]
        assert bare.execute_tool("tool_syscall", {"name": "x32_socket"})["output"] != [0, errno.EPERM]
    assert bare.execute_tool("tool_socket", {"family": socket.AF_INET})["output"] == "ok"
    assert sup.stats(tenant="a-no-filter")[0]["protections"]["syscalls"].startswith("unavailable")


def test_filter_programs_assemble():
    for machine in ("x86_64", "aarch64"):
        for network, allowlist in ((False, False), (False, True), (True, True)):
            rows = seccomp.filter_program(machine, network, allowlist)
            assert rows[0] == (0x20, 0, 0, 4)                      # load the architecture first
            assert rows[1][3] == seccomp._AUDIT_ARCH[machine]
            assert len(rows) < (64 if not allowlist else 512)


_REHEARSE = """
import json, os, resource
from lcp_sandbox.worker.confine import handoff, privileges
from lcp_sandbox.worker.libc import prctl
PR_GET_DUMPABLE = 3

def state():
    return [privileges.capabilities(), os.getresuid(), os.getresgid(), os.getgroups(),
            resource.getrlimit(resource.RLIMIT_NPROC), prctl(PR_GET_DUMPABLE)]

before = state()
handoff.rehearse_take()
print(json.dumps([before, state(), privileges.capability_sets()]))
"""


def test_a_spares_rehearsal_of_its_uid_handoff_changes_nothing():
    """rehearse_take() runs in a spare before its INIT, with the template's capabilities
    still held: its ids, every capability set, groups, process limit and dumpable flag are
    what they were (here, a root process: anything it dropped or set would show).  The
    capget-only read agrees with the full one."""
    out = subprocess.run([sys.executable, "-c", _REHEARSE], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    import json
    before, after, sets = json.loads(out.stdout)
    assert before == after
    assert sets == {k: before[0][k] for k in ("effective", "permitted", "inheritable")}
