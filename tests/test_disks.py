"""disk_mb: a tenant's root holds at most so many bytes; a write past it fails inside the tool
(ENOSPC), other tenants and the tenant's own earlier files untouched."""
from __future__ import annotations

import os
import shutil

import pytest

from conftest import HERE
from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local import disks

LIBS = HERE / "disk_libs"
pytestmark = pytest.mark.skipif(disks._missing() != "", reason=disks._missing() or "-")


def binding(sup, root, tenant: str, mb, confine=True, folder=None) -> SandboxedBinding:
    ws = root / (folder or tenant)
    ws.mkdir(exist_ok=True)
    return SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant=tenant, confine=confine,
                            workspace=str(ws), workspace_root=str(ws),
                            host_tool_configs={"filler": {"sandbox": {"disk_mb": mb}}})


def out(t, tool, **params):
    got = t.execute_tool(tool, params)
    assert got["success"], got
    return got["output"]


def test_a_tenant_fills_its_own_disk_only(open_tmp):
    (open_tmp / "a").mkdir()
    (open_tmp / "a" / "before.txt").write_text("kept")          # there before the cap
    with Supervisor(confine=True) as sup:
        a = binding(sup, open_tmp, "a", 16)
        b = binding(sup, open_tmp, "b", 16)
        assert out(a, "tool_files") == [["before.txt", 4]]         # copied onto its disk
        assert out(a, "tool_fill", name="keep.bin", mb=4) == {"written_mb": 4, "error": None}
        full = out(a, "tool_fill", name="big.bin", mb=64)
        assert full["error"] == "ENOSPC" and 8 <= full["written_mb"] < 16, full
        assert out(a, "tool_files") == [["before.txt", 4], ["keep.bin", 4 * 2**20]]   # nothing lost
        assert out(b, "tool_fill", name="b.bin", mb=10) == {"written_mb": 10, "error": None}
        assert sup.stats(tenant="a")[0]["protections"]["disk"].startswith(
            "on (its root is a file system of its own: 16 MB")
        assert os.path.ismount(open_tmp / "a")
    assert not os.path.ismount(open_tmp / "a")                 # close() unmounted it
    assert not (open_tmp / "a" / "keep.bin").exists()          # (its files: in the image)
    with Supervisor(confine=True) as again:                    # the next host mounts it again
        a = binding(again, open_tmp, "a", 16)
        assert out(a, "tool_files") == [["before.txt", 4], ["keep.bin", 4 * 2**20]]
    assert os.path.getsize(disks.image_of(str(open_tmp / "a"))) == 16 * 2**20


def test_a_disk_is_not_resized_and_a_mount_point_is_not_taken(open_tmp):
    with Supervisor(confine=True) as sup:
        assert out(binding(sup, open_tmp, "a", 16), "tool_files") == "none"
        got = binding(sup, open_tmp, "a2", 32, folder="a").execute_tool("tool_files", {})
        assert got["status_code"] == 503 and "asks another size" in got["error"]
    with Supervisor(confine=True) as sup:
        got = binding(sup, open_tmp, "a", 32).execute_tool("tool_files", {})
        assert got["status_code"] == 503 and "is not resized" in got["error"]
        assert [s["pid"] for s in sup.stats()] == [None]              # no worker started


def test_without_the_means_the_call_is_refused_or_runs_without_the_cap(open_tmp, monkeypatch):
    monkeypatch.setattr(disks, "_MKFS", "mkfs.lcp-sandbox-none")
    with Supervisor(confine=True) as sup:
        got = binding(sup, open_tmp, "a", 16).execute_tool("tool_files", {})
        assert got["status_code"] == 503
        assert "needs mkfs.lcp-sandbox-none (the e2fsprogs package)" in got["error"]
        assert [s["pid"] for s in sup.stats()] == [None]              # no worker started
        loose = binding(sup, open_tmp, "b", 16, confine="best-effort")
        assert out(loose, "tool_files") == "none"
        assert sup.stats(tenant="b")[0]["protections"]["disk"].startswith("unavailable")
    assert not os.path.exists(disks.image_of(str(open_tmp / "a")))


def test_disk_mb_needs_a_confined_worker_and_room_for_a_file_system(open_tmp):
    with Supervisor() as sup:
        for mb, confine, said in ((16, False, "caps a confined worker's root"),
                                  (4, True, "at least 8")):
            got = binding(sup, open_tmp, "a", mb, confine).execute_tool("tool_files", {})
            assert got["status_code"] == 500 and said in got["error"], got
    shutil.rmtree(open_tmp / "a")
