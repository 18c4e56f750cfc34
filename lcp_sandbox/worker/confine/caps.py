"""A confined worker's caps that the kernel keeps per process tree: its pids cgroup."""
from __future__ import annotations

import os
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
