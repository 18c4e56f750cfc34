"""Process-level limits of a worker, applied inside it before any tool code runs.

All of it is best effort: a limit the kernel refuses is logged, never fatal.
The settings come from the host (core/limits.py) in INIT, as a dict.
"""
from __future__ import annotations

import resource
import signal

from .libc import prctl

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits."""
    return prctl(PR_SET_PDEATHSIG, int(sig)) == 0


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process instead of init."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1) == 0


def _set(which: int, soft: int, slack: int = 0) -> None:
    # The hard limit comes down too (to the soft one, plus ``slack``): a tool may raise
    # its own soft limit up to the hard one, so a soft limit alone binds nobody hostile.
    try:
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY and soft > hard:
            soft = hard
        new_hard = soft + slack if hard == resource.RLIM_INFINITY else min(hard, soft + slack)
        resource.setrlimit(which, (soft, new_hard))
    except (ValueError, OSError):
        pass


def apply_in_worker(lim: dict) -> None:
    """Set the worker's own resource limits (called in the worker, before tools run)."""
    _set(resource.RLIMIT_CORE, 0)
    if lim.get("max_open_files"):
        _set(resource.RLIMIT_NOFILE, int(lim["max_open_files"]))
    if lim.get("max_file_size_mb"):
        _set(resource.RLIMIT_FSIZE, int(lim["max_file_size_mb"] * 1024 * 1024))
    if lim.get("cpu_s"):
        # SIGXCPU, then SIGKILL 1 s later.
        _set(resource.RLIMIT_CPU, int(lim["cpu_s"]), slack=1)
    if lim.get("memory_mb"):
        # RLIMIT_DATA counts private writable memory (heap and anonymous mmaps):
        # an allocation past it fails with MemoryError inside the tool.
        _set(resource.RLIMIT_DATA, int(lim["memory_mb"] * 1024 * 1024))
    # A tool writing past RLIMIT_FSIZE should get an OSError, not die of SIGXFSZ.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
