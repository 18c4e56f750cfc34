"""run_as="per-tenant": a uid of its own per tenant, kept across supervisors; the kernel's
own file permissions then keep tenants apart even with every other file protection off."""
from __future__ import annotations

import json
import os
import stat

import pytest

from conftest import HERE
from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local import tenant_uids
from lcp_sandbox.backends.local.tenant_uids import TenantUids
from lcp_sandbox.core.outcomes import Unavailable
from lcp_sandbox.testing import protections_off

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="uids are given by a root host")
LIBS = HERE / "priv_libs"
RANGE = (1_800_000_000, 1000)


def ids(binding) -> list:
    """The worker's [uid, gid] (its /proc/self/status)."""
    st = binding.execute_tool("tool_status")["output"]
    return [int(st["Uid"].split()[0]), int(st["Gid"].split()[0])]


def tenant(sup, root, name, **kw):
    ws = root / name
    ws.mkdir(exist_ok=True)
    return SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant=name, workspace=str(ws),
                            workspace_root=str(ws), **kw)


@needs_root
def test_each_tenant_gets_a_uid_of_its_own_and_keeps_it(open_tmp):
    with Supervisor(confine=True, run_as="per-tenant", uid_range=RANGE,
                    tenants_root=str(open_tmp)) as sup:
        a, b = tenant(sup, open_tmp, "a"), tenant(sup, open_tmp, "b")
        ua, ub = ids(a), ids(b)
    assert ua != ub and ua[0] == ua[1] and ub[0] == ub[1]
    assert all(RANGE[0] <= u[0] < RANGE[0] + RANGE[1] for u in (ua, ub))
    for name, uid in (("a", ua[0]), ("b", ub[0])):
        st = (open_tmp / name).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, 0o700)
    store = open_tmp / ".lcp-sandbox-uids.json"
    assert json.loads(store.read_text()) == {"a": ua[0], "b": ub[0]}
    assert store.stat().st_uid == 0 and stat.S_IMODE(store.stat().st_mode) == 0o600
    with Supervisor(confine=True, run_as="per-tenant", uid_range=RANGE,
                    tenants_root=str(open_tmp)) as again:          # a restart: the same uid
        assert ids(tenant(again, open_tmp, "a")) == ua


@needs_root
def test_file_permissions_alone_keep_tenants_apart(open_tmp):
    """Landlock and the own root switched off (best effort): tenant a still cannot read
    tenant b's file, by the kernel's permission check alone; with one shared uid it could."""
    (open_tmp / "b").mkdir()
    (open_tmp / "b" / "secret.txt").write_text("b's secret")
    secret = str(open_tmp / "b" / "secret.txt")
    with Supervisor(confine="best-effort", run_as="per-tenant", uid_range=RANGE) as sup:
        with protections_off(sup, "landlock", "root"):
            b = tenant(sup, open_tmp, "b")
            assert b.execute_tool("tool_read", {"path": secret})["output"] == "b's secret"
            a = tenant(sup, open_tmp, "a")
            assert a.execute_tool("tool_read", {"path": secret})["output"] == "PermissionError"
    with Supervisor(confine="best-effort") as shared:                 # the same, one uid
        with protections_off(shared, "landlock", "root"):
            b = tenant(shared, open_tmp, "b")
            ids(b)                                                     # (b's root: nobody's)
            a = tenant(shared, open_tmp, "a2")
            assert a.execute_tool("tool_read", {"path": secret})["output"] == "b's secret"


def test_settings_are_checked():
    with pytest.raises(ValueError, match="uid_range"):
        Supervisor(run_as="per-tenant", uid_range=(0, 10))
    with pytest.raises(ValueError, match="run_as"):
        Supervisor(run_as="per-tenants")


def test_a_host_that_is_not_root_refuses_a_uid_per_tenant(monkeypatch):
    """It cannot give one: every tenant would keep the host's uid. Refused (503), unless
    best effort; a fixed run_as is what it always was."""
    uids = TenantUids(RANGE, None)
    monkeypatch.setattr(tenant_uids.os, "geteuid", lambda: 1000)
    with pytest.raises(Unavailable) as caught:
        uids.worker_ids("per-tenant", "a", True, "lib", "tool_x")
    assert caught.value.result["status_code"] == 503
    assert "needs a root host" in caught.value.result["error"] and "uid 1000" in caught.value.result["error"]
    assert uids.worker_ids("per-tenant", "a", "best-effort", "lib", "tool_x")[1] is True
    assert uids.worker_ids((5151, 5252), "a", True, "lib", "tool_x") == ((5151, 5252), False)


@needs_root
@pytest.mark.parametrize("run_as", ["per-tenant", (65534, 65534)])
def test_a_templated_worker_cannot_renice_another_tenants_worker(open_tmp, run_as):
    """A worker forked from a template has no PID namespace of its own (Landlock scopes its
    signals, not priorities or affinity): with a uid per tenant the kernel refuses both;
    with the uid they share, the system call filter (by pid, only the caller itself)."""
    import time
    libs = HERE / "host_kind_libs"
    with Supervisor(confine=True, run_as=run_as, uid_range=RANGE,
                    tenants_root=str(open_tmp)) as sup:
        made = {}
        for name in ("a", "b"):
            ws = open_tmp / name
            ws.mkdir()
            made[name] = SandboxedBinding(tools_folders=[libs], supervisor=sup, tenant=name,
                                          workspace=str(ws), workspace_root=str(ws))
            made[name].execute_tool("tool_count")
        deadline = time.monotonic() + 60                   # their templates, made
        while any(t["state"] == "starting" for t in sup.pool_stats()["templates"]):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        for name in ("a", "b"):                           # both now forked from templates
            made[name].restart_library("attacker")
        made["b"].execute_tool("tool_count")
        b_pid = sup.stats(tenant="b")[0]["pid"]
        got = made["a"].execute_tool("tool_attack", {"other_root": str(open_tmp / "b"),
                                                     "other_pid": b_pid, "host_pid": os.getpid()})
        assert [sup.stats(tenant=t)[0]["start"] for t in "ab"] == ["template"] * 2
        out = got["output"]
        assert out["renice_other"] == out["pin_other"] == out["signal_other"] == "PermissionError"
        assert out["read_secret"] in ("PermissionError", "FileNotFoundError")
