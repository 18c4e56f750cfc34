"""What a tenant can see of others: a confined worker's view through /proc of another tenant's
worker and of the host process, on the kind of host this test process is (.ci/run runs it
here and under tests/support/without_landlock.py's emulations).

One tenant's tool reads, for the other tenant's worker (its pid as the host's stats() say)
and for the host (this process): whether /proc lists it, its cmdline, environ, status and
cwd.  What holds, by kind (docs/security.md, "What a tenant can see of others"):

    own PID namespace   a fresh worker where namespaces can be made: its /proc is its own
                        namespace's, so no other process is there at all (FileNotFoundError)
    Landlock            a forked worker, or a fresh one without namespaces: its layer reads
                        /proc/self only (PermissionError, listing included)
    the tenant's uid    no Landlock and no namespace (a default container): /proc lists every
                        process; command lines and status are readable, and say nothing of
                        a tenant (the zygote's boot line; the tenant's uid); environ and cwd
                        need the same uid (and a dumpable process): PermissionError
    refused             none of them: 503, nothing runs
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import psutil
import pytest
from conftest import FIXTURES, SPAWN
from support.confined_kinds import NAMESPACES_REFUSED

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.testing import landlock_abi_at_most
from lcp_sandbox.worker.confine.landlock import landlock_abi

LIBS = FIXTURES / "visibility_libs"
CAPPED = int(os.environ.get("LCP_TEST_LANDLOCK_ABI") or 0)
LANDLOCK = min(landlock_abi(), CAPPED or 99) > 0


def expected(tenants_root: bool) -> str:
    """What keeps a worker's /proc from others on this host, by the kind alone (never by
    what the worker reports): see the module's docstring."""
    namespaces = not NAMESPACES_REFUSED and not SPAWN
    if not tenants_root and namespaces:
        return "own PID namespace"
    if LANDLOCK:
        return "Landlock"
    if tenants_root and namespaces:
        # templates refuse without Landlock where a fresh worker can have its own root
        return "own PID namespace"
    if tenants_root and os.geteuid() == 0:
        return "the tenant's uid"
    return "refused"


class Tenants:
    """Two confined tenants, ``a`` (the one that looks) and ``b``, on one supervisor; with a
    ``tenants_root``, each a uid of its own, workers forked from the library's template."""

    def __init__(self, tmp: Path, tenants_root: bool) -> None:
        self.tmp = tmp
        self.sup = Supervisor(confine=True, tenants_root=str(tmp) if tenants_root else None)
        self.capped = landlock_abi_at_most(self.sup, CAPPED) if CAPPED else None
        if self.capped is not None:
            self.capped.__enter__()
        self.made: list = []
        if tenants_root and self.sup.start_method == "zygote":
            self.binding("warm").execute_tool("tool_look", {"pids": []})
            self.settled()
        mark = uuid.uuid4().hex[:12]
        self.a, self.b = self.binding(f"a-{mark}"), self.binding(f"b-{mark}")

    def binding(self, tenant: str) -> SandboxedBinding:
        root = self.tmp / tenant
        # The host's: its worker's uid gets it (0700) at its first start.
        root.mkdir(mode=0o700)
        b = SandboxedBinding(tools_folders=[str(LIBS)], supervisor=self.sup, tenant=tenant,
                             workspace=str(root), workspace_root=str(root))
        self.made.append(b)
        return b

    def settled(self, timeout: float = 60.0) -> None:
        """Wait until no template is being made (the next tenant is forked from it)."""
        deadline = time.monotonic() + timeout
        while any(t["state"] == "starting" for t in self.sup.pool_stats()["templates"]):
            assert time.monotonic() < deadline, self.sup.pool_stats()["templates"]
            time.sleep(0.01)

    def close(self) -> None:
        for b in self.made:
            b.close()
        self.sup.close()


def row(binding: SandboxedBinding) -> dict:
    return next(s for s in binding.stats() if s["library"] == "seer")


@pytest.fixture(params=[True, False], ids=["tenants_root", "no-tenants_root"])
def tenants(request, open_tmp):
    t = Tenants(open_tmp, request.param)
    t.expected = expected(request.param)
    yield t
    t.close()


def test_what_a_tenant_sees_of_another_tenant_and_of_the_host(tenants):
    b_first = tenants.b.execute_tool("tool_look", {"pids": []})
    if tenants.expected == "refused":
        assert b_first["status_code"] == 503, b_first
        return
    assert b_first["status_code"] == 200, b_first
    other, host = row(tenants.b)["pid"], os.getpid()
    assert other and psutil.pid_exists(other)
    r = tenants.a.execute_tool("tool_look", {"pids": [other, host]})
    assert r["status_code"] == 200, r
    got = r["output"]
    seen_other, seen_host = got["seen"][str(other)], got["seen"][str(host)]
    processes = row(tenants.a)["protections"]["processes"]
    if tenants.expected == "own PID namespace":
        # no process outside its own tree is there at all (the listing itself: Landlock's
        # second layer, where the kernel has it)
        for seen in (seen_other, seen_host):
            assert set(seen.values()) == {"FileNotFoundError"}, seen
        assert got["listed"] == ("PermissionError" if LANDLOCK else [False, False]), got
        assert processes.startswith("on (own PID namespace"), processes
    elif tenants.expected == "Landlock":
        # /proc/self only: not even the listing
        assert got["listed"] == "PermissionError", got
        for seen in (seen_other, seen_host):
            assert set(seen.values()) == {"PermissionError"}, seen
    else:
        assert_seen_by_uid(tenants, got, other, host)
        assert processes.startswith("on (a uid of its tenant's own"), processes


def assert_seen_by_uid(tenants: Tenants, got: dict, other: int, host: int) -> None:
    """No Landlock, no namespace: /proc lists every process and shows command lines and
    status to every uid; what they say names no tenant, and what would (environ, cwd) is
    refused by the kernel: another uid, and a worker that is not dumpable."""
    seen_other, seen_host = got["seen"][str(other)], got["seen"][str(host)]
    assert got["listed"] == [True, True], got
    for seen in (seen_other, seen_host):
        assert seen["environ"] == seen["cwd"] == "PermissionError", seen
    # Another tenant's worker: the zygote's boot line and the tenant's uid, nothing more.
    tenant = tenants.b.tenant
    mark = tenant.split("-", 1)[1]
    assert mark not in seen_other["cmdline"] and mark not in str(seen_other["status"]), seen_other
    assert seen_other["cmdline"].split("\0")[1:3] == ["-I", "-c"], seen_other["cmdline"]
    assert int(seen_other["status"]["Uid"]) == psutil.Process(other).uids().real != got["uid"]
    # The host: its own command line, as it was started (never a secret: docs/security.md).
    assert seen_host["cmdline"].split("\0")[:-1] == psutil.Process(host).cmdline()


def test_the_tenant_uid_row_names_no_tenant_in_a_worker_s_title(tenants):
    """(The uid row's claim, on every kind, seen from the host) a worker's command line and
    process name say nothing of its tenant: what another tenant could read there."""
    r = tenants.b.execute_tool("tool_look", {"pids": []})
    if tenants.expected == "refused":
        assert r["status_code"] == 503, r
        return
    proc = psutil.Process(row(tenants.b)["pid"])
    mark = tenants.b.tenant.split("-", 1)[1]
    for title in (" ".join(proc.cmdline()), proc.name(), *(" ".join(c.cmdline()) for c in
                                                          proc.children(recursive=True))):
        assert mark not in title, title

