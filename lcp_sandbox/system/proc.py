"""Process trees and exit statuses, read from /proc and wait(2) (psutil where there is
no /proc: macOS, Windows): no side effects.

Shared by the host (the memory of a worker's tree, how a worker
ended) and the zygote (which processes to kill with a worker, its status).
"""
from __future__ import annotations

import os
import signal
from typing import Optional


def describe_exit(status: Optional[int]) -> str:
    """'killed by SIGSEGV' / 'exited with code 3' from a Popen-style return code."""
    if status is None:
        return "ended for an unknown reason"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"was killed by {name}"
    return f"exited with code {status}"


def status_from_wait(wait_status: int) -> int:
    """os.waitpid status -> Popen-style return code (negative = signal)."""
    if os.WIFSIGNALED(wait_status):
        return -os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def children(pid: int) -> list[int]:
    """The direct children of ``pid``, from /proc/<pid>/task/<tid>/children."""
    if not _HAS_CHILDREN_FILES:
        # Kernels without CONFIG_PROC_CHILDREN: slower, same answer.
        import psutil
        try:
            return [c.pid for c in psutil.Process(pid).children()]
        except psutil.Error:
            return []
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
    except (OSError, ValueError):
        pass
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants.

    Reads a few files per process of the tree; psutil's children() reads every
    process of the machine, which made a watchdog pass over 200 workers cost
    seconds."""
    out, i = [pid], 0
    while i < len(out):
        out.extend(children(out[i]))
        i += 1
    return out


_HAS_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
_HAS_PROC = os.path.exists(f"/proc/{os.getpid()}/statm")


def memory(pid: int) -> tuple[int, int]:
    """(RSS, USS) of one process in bytes: USS counts only its private pages (what a
    fork shares copy-on-write with its parent or siblings is not its own); from
    /proc/<pid>/smaps_rollup, or (RSS, RSS) from statm when that cannot be read; where
    there is no /proc (macOS, Windows: the spawn path), from psutil."""
    if not _HAS_PROC:
        return _psutil_memory(pid)
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            rss = uss = 0
            for line in f:
                if line.startswith(b"Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith((b"Private_Clean:", b"Private_Dirty:")):
                    uss += int(line.split()[1]) * 1024
            if rss:
                return rss, uss
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            rss = int(f.read().split()[1]) * _PAGE
        return rss, rss
    except (OSError, ValueError, IndexError):
        return 0, 0


def _psutil_memory(pid: int) -> tuple[int, int]:
    import psutil
    try:
        info = psutil.Process(pid).memory_full_info()
        return info.rss, getattr(info, "uss", info.rss)
    except psutil.Error:
        return 0, 0


def tree_usage(pid: int) -> tuple[int, int, int]:
    """(RSS, USS, processes) of a process and all its descendants, bytes ((0, 0, 1) if gone)."""
    rss = uss = 0
    tree = process_tree(pid)
    for p in tree:
        r, u = memory(p)
        rss += r
        uss += u
    return rss, uss, len(tree)


def tree_memory(pid: int) -> tuple[int, int]:
    """(RSS, USS) of a process and all its descendants, in bytes ((0, 0) if gone)."""
    return tree_usage(pid)[:2]
