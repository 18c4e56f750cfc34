"""disk_mb: a tenant's root holds at most so many bytes; a write past it fails inside the tool
(ENOSPC), other tenants and the tenant's own earlier files untouched."""
from __future__ import annotations

import os
import shutil

import pytest
from conftest import FIXTURES

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local.confine import disks

LIBS = FIXTURES / "disk_libs"
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


# ---------------------------------------------------------------- given back
def _mounted_at(root) -> list[str]:
    """The mounts at ``root`` as this process sees them (/proc/self/mountinfo)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [line for line in f if line.split()[4] == str(root)]


def _holders(root) -> list[str]:
    """Who holds the disk at ``root``: each process's pid, command line and mount namespace
    (what a failing assertion shows, so a holder from outside the test can be named)."""
    import psutil
    loops = [d["loops"] for d in disks.on_disk(str(root.parent)) if d["root"] == str(root)]
    held = []
    for pid in disks.users(loops[0] if loops else []):
        try:
            proc = psutil.Process(pid)
            held.append(f"{pid} {' '.join(proc.cmdline())[:120]} "
                        f"mnt:{os.readlink(f'/proc/{pid}/ns/mnt')}")
        except (psutil.Error, OSError):
            held.append(f"{pid} (gone)")
    return held


def _loops(image) -> str:
    """What losetup says of the loop devices backed by ``image`` ("" when none is)."""
    import subprocess
    return subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_closed_binding_s_disk_is_unmounted_and_its_loop_device_freed(open_tmp):
    """Tenant a's only binding closes: its disk leaves the host's mounts and its loop device
    is freed, while tenant b's stays; a's files stay in the image, mounted again by a's next
    binding."""
    from conftest import poll
    with Supervisor(confine=True) as sup:
        a = binding(sup, open_tmp, "a", 16)
        b = binding(sup, open_tmp, "b", 16)
        assert out(a, "tool_fill", name="kept.bin", mb=1)["error"] is None
        assert out(b, "tool_files") == "none"
        image = disks.image_of(str(open_tmp / "a"))
        assert _mounted_at(open_tmp / "a") and "/dev/loop" in _loops(image)
        a.close()
        assert not _mounted_at(open_tmp / "a")
        assert poll(lambda: _loops(image) == ""), _loops(image)
        assert _mounted_at(open_tmp / "b")                         # b's binding lives on
        again = binding(sup, open_tmp, "a", 16)
        assert out(again, "tool_files") == [["kept.bin", 2**20]]


def test_removing_a_tenant_deletes_its_disk_and_an_earlier_host_s_mount_too(open_tmp):
    """remove_tenant: the disk unmounted, its image and the root deleted; also for a disk
    a host that ended without unmounting left mounted (as a killed server does)."""
    from conftest import poll
    with Supervisor(confine=True) as sup:
        a = binding(sup, open_tmp, "a", 16)
        assert out(a, "tool_fill", name="x.bin", mb=1)["error"] is None
        a.close()
        sup.remove_tenant("a", str(open_tmp / "a"))
        image = disks.image_of(str(open_tmp / "a"))
        assert not os.path.exists(image) and not (open_tmp / "a").exists()
        assert poll(lambda: _loops(image) == "")
    (open_tmp / "c").mkdir()
    left = disks.TenantDisks()                         # a host that never unmounts
    left.ensure(str(open_tmp / "c"), 8)
    with Supervisor(confine=True) as sup:
        sup.remove_tenant("c", str(open_tmp / "c"))
    image = disks.image_of(str(open_tmp / "c"))
    assert not _mounted_at(open_tmp / "c") and not os.path.exists(image)
    assert poll(lambda: _loops(image) == "")


def test_disks_list_and_prune_free_only_what_no_process_uses(open_tmp):
    """`lcp-sandbox disks prune ROOT`: a disk mounted with no worker is unmounted, one whose
    tenant has a live worker is kept (its worker's own mount namespace mounts it), an image
    whose root is gone is deleted; `disks list --json` shows each state."""
    import json
    import subprocess
    import sys

    from conftest import poll

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "lcp_sandbox.fronts.cli", "disks", *args],
                              capture_output=True, text=True, timeout=60)
    for name in ("idle", "gone"):
        (open_tmp / name).mkdir()
        disks.TenantDisks().ensure(str(open_tmp / name), 8)      # mounted, no worker
    subprocess.run(["umount", str(open_tmp / "gone")], check=True)
    (open_tmp / "gone").rmdir()
    with Supervisor(confine=True) as sup:
        live = binding(sup, open_tmp, "live", 16)
        assert out(live, "tool_files") == "none"
        listed = {os.path.basename(d["root"]): d for d in json.loads(cli("list", str(open_tmp),
                                                                        "--json").stdout)}
        assert {n: (d["mounted"], d["exists"], bool(d["users"])) for n, d in listed.items()} == {
            "gone": (False, False, False), "idle": (True, True, False), "live": (True, True, True)}
        dry = cli("prune", str(open_tmp), "--dry-run")
        assert "would be unmounted" in dry.stdout and _mounted_at(open_tmp / "idle")
        pruned = cli("prune", str(open_tmp))
        assert pruned.returncode == 0, pruned.stderr
        assert f"{open_tmp / 'idle'}: unmounted" in pruned.stdout, (
            pruned.stdout, _holders(open_tmp / "idle"))
        assert f"{open_tmp / 'live'}: kept: in use by" in pruned.stdout
        assert f"{open_tmp / 'gone'}: image deleted (its root is gone)" in pruned.stdout
        assert not _mounted_at(open_tmp / "idle") and _mounted_at(open_tmp / "live")
        assert not os.path.exists(disks.image_of(str(open_tmp / "gone")))
        assert poll(lambda: _loops(disks.image_of(str(open_tmp / "idle"))) == "")
        assert out(live, "tool_files") == "none"                  # its worker never noticed
