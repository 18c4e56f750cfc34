"""Confined workers from shared templates (Supervisor(tenants_root=...)) hold what fresh
confined workers hold, and two tenants of one template share no channel.

Each test runs against the three start kinds of confined_kinds.py (fresh, base,
template) where it applies.  Libraries under tests/fixtures/channel_libs/.
"""
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest
from conftest import FIXTURES
from support.confined_kinds import KINDS, Confined, started_as

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.core.policy import ENGINE_DIR
from lcp_sandbox.testing import protections_off

LIBS = FIXTURES / "channel_libs"
LIB = LIBS / "chanprobe"
ROOT = os.geteuid() == 0
OFF = {"chanprobe": {"sandbox": {"network": False}}}


@pytest.fixture(scope="module")
def tenants(open_tmp_module):
    return open_tmp_module


def confined(kind: str, tenants: Path, **kw) -> Confined:
    root = tenants / kind
    root.mkdir(exist_ok=True)
    root.chmod(0o711)
    return Confined(kind, root, **kw)


@pytest.fixture(scope="module", params=KINDS)
def kind(request, tenants):
    c = confined(request.param, tenants)
    yield c
    c.close()


def holds(c: Confined, tenant: str, network: bool) -> dict:
    b = c.binding(LIBS, tenant, host_tool_configs=None if network else OFF)
    sibling = c.tenants_root / "sibling"
    sibling.mkdir(exist_ok=True)
    (sibling / "secret.txt").write_text("s")
    paths = {"own_root": [str(c.tenants_root / tenant), "write"],
             "own_root_read": [str(c.tenants_root / tenant), "read"],
             "sibling_read": [str(sibling / "secret.txt"), "read"],
             "sibling_write": [str(sibling), "write"],
             "tenants_folder": [str(c.tenants_root), "read"],
             "library_read": [str(LIB / "chanprobe.py"), "read"],
             "library_write": [str(LIB), "write"],
             "engine_read": [os.path.join(ENGINE_DIR, "lcp_sandbox", "__init__.py"), "read"],
             "engine_write": [os.path.join(ENGINE_DIR, "lcp_sandbox"), "write"],
             "tmp_write": [tempfile.gettempdir(), "write"]}
    r = b.execute_tool("tool_holds", {"paths": paths, "host_pid": os.getpid()})
    assert r["status_code"] == 200, r
    c.check(b)
    # Refused by Landlock (EACCES), or not there at all: a fresh worker's own root holds
    # only the allowed paths (ENOENT; EROFS for a read-only bind) and Landlock as well.
    out = {k: "denied" if k in paths and v in DENIED[c.own_namespaces] else v
           for k, v in r["output"].items()}
    out["host_netns"] = out.pop("netns") == os.readlink("/proc/self/ns/net")
    out["protections"] = dict(c.sup.stats(tenant=tenant)[0]["protections"])
    # A fresh worker has a PID namespace of its own: the host's pid names nothing there;
    # one forked from a template relies on Landlock (ABI 6+: signals scoped, /proc/self only).
    filesystem = out["protections"].pop("filesystem")
    if c.own_namespaces:                  # its own root, and Landlock as a second layer
        assert filesystem.startswith("on (own root") and "Landlock: on (ABI" in filesystem
    else:
        assert filesystem.startswith("on (ABI"), filesystem
    processes = out["protections"].pop("processes")
    proc_host = out.pop("proc_host")
    if c.own_namespaces:
        assert processes.startswith("on (own PID namespace") and proc_host == "FileNotFoundError"
    else:
        assert processes.startswith("on (Landlock scope") and proc_host == "PermissionError"
    tmpdir = out.pop("tmp_in_its_own_dir")
    assert tmpdir and os.path.basename(tmpdir).startswith("lcp-sandbox-")
    return out


def test_a_templated_worker_holds_what_a_fresh_one_holds(tenants):
    """Uid, capabilities, no_new_privs, seccomp filters, network namespace, environment,
    what it may read and write: equal for the three start kinds, network on and off."""
    got = {}
    for k in KINDS:
        c = confined(k, tenants)
        try:
            got[k] = {net: holds(c, f"a-{net}", net) for net in (True, False)}
            for net, h in got[k].items():     # a root host with a tenants_root: a uid per
                per_tenant = c.sup.run_as == "per-tenant"            # tenant, taken with the
                uid = (c.sup.uids.of(f"a-{net}")[0] if per_tenant         # key filter
                       else 65534 if ROOT else os.getuid())
                assert (h.pop("Uid"), h.pop("Gid")) == (f"{uid} {uid} {uid} {uid}",) * 2
                privileges = h["protections"].pop("privileges")
                assert privileges.startswith(f"uid {uid} gid {uid}, no capabilities"), privileges
                capped = h["protections"].pop("tenant_processes", None)
                assert (capped or "").startswith("on (") == per_tenant, capped
                assert h.pop("Seccomp_filters") == ("2" if per_tenant and k != "fresh" else "1")
                assert per_tenant == (ROOT and k != "fresh")
        finally:
            c.close()
    fresh = got["fresh"]
    assert got["base"] == fresh and got["template"] == fresh
    for net, h in fresh.items():
        assert h["CapEff"] == h["CapPrm"] == h["CapInh"] == h["CapAmb"] == "0000000000000000"
        assert h["NoNewPrivs"] == "1" and h["Seccomp"] == "2"
        if ROOT:
            assert h["CapBnd"] == "0000000000000000"
        assert h["own_root"] == h["own_root_read"] == "ok"
        assert h["library_read"] == h["engine_read"] == "ok"
        for denied in ("sibling_read", "sibling_write", "tenants_folder", "library_write",
                       "engine_write", "tmp_write"):
            assert h[denied] == "denied", (net, denied, h[denied])
        assert h["host_netns"] is net
        assert h["inet"] == ("ok" if net else "PermissionError")


#: How a path a worker may not reach answers (by own_namespaces): Landlock refuses; in a
#: fresh worker's own root it is not there, or read-only.
DENIED = {True: ("PermissionError", "FileNotFoundError", "OSError"), False: ("PermissionError",)}

#: What signalling another tenant's worker gives: a fresh worker cannot even name it (its own
#: PID namespace), a forked one is refused by Landlock's scope.
UNREACHABLE = {True: "ProcessLookupError", False: "PermissionError"}


def test_two_network_off_tenants_of_one_template_share_no_channel(kind):
    a = kind.binding(LIBS, "a-off", host_tool_configs=OFF)
    b = kind.binding(LIBS, "b-off", host_tool_configs=OFF)
    pid_a = a.execute_tool("tool_listen", {"kind": "abstract"})
    for t in (a, b):
        for what in ("tcp", "udp", "abstract"):
            assert t.execute_tool("tool_listen", {"kind": what})["output"] == {"error": "PermissionError"}
        assert t.execute_tool("tool_reach", {"kind": "tcp", "addr": 1})["output"] == "PermissionError"
        assert t.execute_tool("tool_reach", {"kind": "udp", "addr": 1})["output"] == "PermissionError"
        assert t.execute_tool("tool_reach", {"kind": "usersock", "addr": 0})["output"] == \
            "PermissionError"
    kind.check(a), kind.check(b)
    pa, pb = (kind.sup.stats(tenant=t)[0]["pid"] for t in ("a-off", "b-off"))
    assert pid_a["output"] == {"error": "PermissionError"}
    assert b.execute_tool("tool_reach", {"kind": "signal", "addr": 0, "pid": pa})["output"] == \
        UNREACHABLE[kind.own_namespaces]
    own = 2 if kind.own_namespaces else pa          # (pid 2 of its own PID namespace)
    assert a.execute_tool("tool_reach", {"kind": "signal", "addr": 0, "pid": own})["output"] == "ok"
    if kind.kind != "fresh":           # one template's workers share its network namespace
        ns = {os.readlink(f"/proc/{p}/ns/net") for p in (pa, pb)}
        assert len(ns) == 1


def test_network_off_without_a_namespace_is_held_by_the_filter(kind):
    """Where no network namespace can be made (a default container), a network-off worker
    is in the host's: its system call filter is what keeps it off (no TCP or UDP socket to
    the host's loopback, no abstract socket, no netlink but NETLINK_ROUTE), and stats() say
    so (tests/confinement/test_host_kinds.py: the same in an emulated default container)."""
    host = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    host.bind(("127.0.0.1", 0))
    host.listen(4)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0lcp-test-host-{os.getpid()}")
    abstract.listen(4)
    with host, abstract, protections_off(kind.sup, "netns"):
        t = kind.binding(LIBS, "off-no-netns", host_tool_configs=OFF)
        for what, addr in (("tcp", host.getsockname()[1]), ("udp", host.getsockname()[1]),
                           ("abstract", f"lcp-test-host-{os.getpid()}"), ("usersock", 0)):
            assert t.execute_tool("tool_reach", {"kind": what, "addr": addr})["output"] == \
                "PermissionError", what
        network = kind.sup.stats(tenant="off-no-netns")[0]["protections"]["network"]
        assert network.startswith("on (the system call filter: no socket but AF_NETLINK's "
                                  "NETLINK_ROUTE") and "switched off for a test" in network
        kind.check(t)
    # the allowlist off too: its socket rule still holds the network (the allowlist is
    # what is missing)
    with protections_off(kind.sup, "netns", "syscalls"):
        bare = kind.binding(LIBS, "off-bare", host_tool_configs=OFF)
        r = bare.execute_tool("tool_reach", {"kind": "tcp", "addr": 1})
        assert r["status_code"] == 503 and "syscalls: unavailable" in r["error"], r
        assert "network: " not in r["error"], r


def test_siblings_reach_neither_abstract_sockets_nor_signals_of_each_other(kind):
    """Network on: each worker's Landlock domain is its own (ABI 6+ scoping)."""
    a, b = kind.binding(LIBS, "a-on"), kind.binding(LIBS, "b-on")
    got = a.execute_tool("tool_listen", {"kind": "abstract"})["output"]
    assert a.execute_tool("tool_reach", {"kind": "abstract", "addr": got["addr"]})["output"] == "ok"
    assert b.execute_tool("tool_reach", {"kind": "abstract", "addr": got["addr"]})["output"] == \
        "PermissionError"
    pa = kind.sup.stats(tenant="a-on")[0]["pid"]         # (the host's pid: got's may be 1)
    assert b.execute_tool("tool_reach", {"kind": "signal", "addr": 0, "pid": pa})[
        "output"] == UNREACHABLE[kind.own_namespaces]
    tcp = a.execute_tool("tool_listen", {"kind": "tcp"})["output"]      # the probe can connect
    assert b.execute_tool("tool_reach", {"kind": "tcp", "addr": tcp["addr"]})["output"] == "ok"
    kind.check(a), kind.check(b)


def test_who_imports(kind):
    """A library template imports once, before its workers; a base's workers import
    themselves, after their own confinement; a fresh worker imports itself."""
    b = kind.binding(LIBS, "importer")
    imported_by, pid = b.execute_tool("tool_imported_by", {})["output"]
    assert (imported_by != pid) is (kind.kind == "template")


def test_code_registered_at_run_time_never_gets_a_template(tenants):
    c = confined("template", tenants)
    try:
        code = ("import os\nPID = os.getpid()\n"
                "def tool_dyn() -> dict:\n    return {'success': True, 'output': [PID, os.getpid()]}\n")
        starts = []
        for t in ("d1", "d2", "d3"):
            b = c.binding(LIBS, t)
            assert b.register_tool_from_code("dyn", code)
            imported, pid = b.execute_tool("tool_dyn", {})["output"]
            assert imported == pid
            starts.append(c.sup.stats(tenant=t)[-1]["start"])
            c.settled()
        assert all(s.startswith(("fresh (code registered", "base (code registered")) for s in starts)
        assert "base (code registered at run time imports after its own confinement)" in starts
        libs = {t["library"] for t in c.sup.pool_stats()["templates"]}
        assert not any("dyn" in name for name in libs)
    finally:
        c.made.clear()                   # (their starts are checked above)
        c.close()


def test_files_beneath_tenants_root_are_never_imported_in_a_template(tenants):
    c = confined("template", tenants)
    try:
        folder = c.tenants_root / "uploaded"
        shutil.copytree(LIBS, folder, ignore=shutil.ignore_patterns("__pycache__"))
        for t in ("u1", "u2", "u3"):
            b = c.binding(folder, t)
            assert b.execute_tool("tool_imported_by", {})["output"][0] == \
                c.sup.stats(tenant=t)[0]["pid"]
            c.settled()
        assert c.sup.stats(tenant="u3")[0]["start"] == \
            "base (its files lie beneath tenants_root (a tenant could have written them))"
    finally:
        c.made.clear()                   # (their starts are checked above)
        c.close()


def test_stats_say_why_a_confined_worker_started_fresh(tenants, open_tmp):
    inside = tenants / "why"
    inside.mkdir(exist_ok=True)
    with Supervisor(confine=True) as sup:
        b = SandboxedBinding(tools_folders=[LIBS], supervisor=sup, workspace=str(inside),
                             workspace_root=str(inside))
        assert b.execute_tool("tool_imported_by", {})["success"]
        assert sup.stats()[0]["start"] == "fresh (confined, and the host declared no tenants_root)"
    with Supervisor(confine=True, tenants_root=str(tenants)) as sup:
        b = SandboxedBinding(tools_folders=[LIBS], supervisor=sup, workspace=str(open_tmp),
                             workspace_root=str(open_tmp))
        assert b.execute_tool("tool_imported_by", {})["success"]
        assert sup.stats()[0]["start"] == "fresh (confined, its root is outside tenants_root)"
        off = SandboxedBinding(tools_folders=[LIBS], supervisor=sup, workspace=str(inside),
                               workspace_root=str(inside),
                               host_tool_configs={"chanprobe": {"sandbox": {"template": False}}})
        assert off.execute_tool("tool_imported_by", {})["success"]
        assert sup.stats(tenant="default")[-1]["start"] == "fresh (templates off for this library)"


@pytest.mark.skipif(not ROOT, reason="the host is not root: no uid to drop to")
def test_a_library_of_its_own_run_as_gets_a_template_of_its_own(tenants):
    c = confined("template", tenants)
    try:
        own = {"chanprobe": {"sandbox": {"run_as": [5151, 5252]}}}
        a, b = c.binding(LIBS, "ua"), c.binding(LIBS, "ub", host_tool_configs=own)
        ha = a.execute_tool("tool_holds", {"paths": {}})["output"]
        hb = b.execute_tool("tool_holds", {"paths": {}})["output"]
        ua = (c.sup.uids.of("ua")[0] if c.sup.run_as == "per-tenant" else
              65534 if ROOT else os.getuid())
        assert ha["Uid"] == f"{ua} {ua} {ua} {ua}" and hb["Uid"] == "5151 5151 5151 5151"
        c.check(a), c.check(b)
        mine = [t for t in c.sup.pool_stats()["templates"] if t["library"] == "chanprobe"]
        assert len(mine) == 2 and {t["state"] for t in mine} == {"ok"}
    finally:
        c.close()


def test_nothing_is_left_after_close(tenants, new_processes, monkeypatch):
    own_tmp = tenants / "own-tmp"             # (other processes of this machine use /tmp too)
    own_tmp.mkdir()
    own_tmp.chmod(0o711)
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    c = confined("template", tenants)
    for t in ("n1", "n2"):
        assert c.binding(LIBS, t).execute_tool("tool_listen", {"kind": "tcp"})["success"]
    assert started_as("template", c.sup.stats(tenant="n2")[0]["start"])
    assert new_processes() and os.listdir(own_tmp)       # its temp-dir parents, its workers'
    c.close()
    assert os.listdir(own_tmp) == []
    assert new_processes() == set()
