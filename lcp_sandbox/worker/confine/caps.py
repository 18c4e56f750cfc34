"""A confined worker's caps that the kernel keeps: its pids cgroup, its root's file system."""
from __future__ import annotations

import os
import resource
from typing import Optional


def join_pids_cgroup(path: Optional[str], limit: int, why: Optional[str] = None) -> str:
    """Move this process (as root, before any tool code) into its pids cgroup ``path`` (made
    by the host with pids.max = ``limit``); the report, read back from the kernel."""
    if not path:
        return f"unavailable (the host made no pids cgroup for it: {why or 'none asked for'})"
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        with open("/proc/self/cgroup") as f:
            mine = f.read()
    except OSError as exc:
        return f"unavailable (joining its pids cgroup: {exc.strerror or exc})"
    if os.path.basename(path) not in mine:
        return "unavailable (not in its pids cgroup after joining it)"
    return f"on (a pids cgroup of its own: at most {limit} processes and threads)"


def disk_state(root: str, mb: int) -> str:
    """Whether ``root`` is a file system of at most ``mb`` MiB (the host made it so:
    backends/local/confine/disks.py), as the kernel says."""
    try:
        st = os.statvfs(root)
    except OSError as exc:
        return f"unavailable (its root: {exc.strerror or exc})"
    total = st.f_blocks * st.f_frsize / 2**20
    if total > mb:
        return (f"unavailable (its root is on a file system of {total:.0f} MB, not one of its "
                f"own of {mb} MB)")
    return (f"on (its root is a file system of its own: {mb} MB, "
            f"{st.f_bavail * st.f_frsize / 2**20:.1f} MB free)")


def cap_tenant_processes(limit: int) -> str:
    """RLIMIT_NPROC of this worker's uid (its tenant's own, after the drop): the kernel counts
    every process and thread of that uid, so all of the tenant's workers together stay at
    ``limit``; a fork beyond it fails with EAGAIN inside the tool.  Lowering needs no
    privilege; a lower hard limit already in force is kept."""
    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    except (OSError, ValueError) as exc:
        return f"unavailable (RLIMIT_NPROC {limit}: {exc})"
    return f"on (its tenant's uid: at most {limit} processes and threads, all its workers together)"
