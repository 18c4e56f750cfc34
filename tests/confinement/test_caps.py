"""Caps per worker: "max_processes" (a pids cgroup of its own), and a confined worker whose
protections are not in force running nothing of its call, its import included."""
from __future__ import annotations

import errno
import os
import shutil

import pytest
from conftest import FIXTURES, SPAWN

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.testing import protections_off

LIBS = FIXTURES / "cap_libs"
ROOT = os.geteuid() == 0


@pytest.fixture
def libs(open_tmp):
    dst = open_tmp / "libs"
    shutil.copytree(LIBS, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def binding(sup, libs, root, tenant, **sandbox):
    root.mkdir(exist_ok=True)
    return SandboxedBinding(tools_folders=[libs], supervisor=sup, tenant=tenant,
                            workspace=str(root), workspace_root=str(root),
                            host_tool_configs={"forker": {"sandbox": sandbox}} if sandbox else None)


@pytest.mark.skipif(not ROOT, reason="a pids cgroup is made by a root host here")
def test_max_processes_caps_a_worker_tree_and_no_other(libs, open_tmp):
    with Supervisor(confine=True, tenants_root=str(open_tmp)) as sup:
        capped = binding(sup, libs, open_tmp / "a", "a", max_processes=10)
        free = binding(sup, libs, open_tmp / "b", "b")
        r = capped.execute_tool("tool_fork_many", {"count": 40})
        assert r["success"], r
        got = r["output"]
        assert 0 < got["forked"] < 10 and got["error"] == f"BlockingIOError {errno.EAGAIN}", got
        other = free.execute_tool("tool_fork_many", {"count": 40})["output"]
        assert other["forked"] == 40 and other["error"] is None          # not its cap
        again = capped.execute_tool("tool_fork_many", {"count": 5})["output"]
        assert again["forked"] == 5 and again["calls"] == 2             # same worker, state kept
        row = capped.stats()[0]
        assert row["protections"]["max_processes"] == (
            "on (a pids cgroup of its own: at most 10 processes and threads)")
        assert row["start"].startswith("fresh (max_processes")
        assert len(_our_cgroups()) == 1
    assert _our_cgroups() == []                       # removed with the workers
    assert not os.path.exists(f"/sys/fs/cgroup/pids/lcp-sandbox-{os.getpid()}")   # and theirs


def _our_cgroups() -> list:
    base = f"/sys/fs/cgroup/pids/lcp-sandbox-{os.getpid()}"
    return [e for e in os.listdir(base) if e.startswith("w-")] if os.path.isdir(base) else []


def test_max_processes_is_checked_before_any_worker(libs, open_tmp):
    with Supervisor() as sup:
        r = binding(sup, libs, open_tmp / "u", "u", max_processes=10).execute_tool(
            "tool_fork_many", {"count": 1})
        assert r["status_code"] == 500 and "caps a confined worker's processes" in r["error"]
        r = binding(sup, libs, open_tmp / "v", "v", max_processes=0, confine=True).execute_tool(
            "tool_fork_many", {"count": 1})
        assert r["status_code"] == 500 and "at least 1" in r["error"]


@pytest.mark.skipif(SPAWN, reason="fork-only (zygote path): its own root is the zygote's")
def test_a_worker_without_its_protections_imports_nothing(libs, open_tmp):
    """The call is in the worker's socket before its READY is read: the worker itself must
    stop before serving it, or the library's import (and the tool) would run unconfined."""
    root = open_tmp / "w"
    with Supervisor(confine=True) as sup:
        with protections_off(sup, "landlock", "root"):
            b = binding(sup, libs, root, "w")
            for _ in range(3):
                r = b.execute_tool("tool_fork_many", {"count": 1})
                assert r["status_code"] == 503 and "filesystem: " in r["error"], r
        assert not (root / "imported.txt").exists()
        b2 = binding(sup, libs, root, "w2")
        assert b2.execute_tool("tool_fork_many", {"count": 1})["success"]
        assert (root / "imported.txt").exists()     # (the marker the check looks for)
