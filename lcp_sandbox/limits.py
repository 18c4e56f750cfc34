"""Process-level limits of a worker, and how to describe a worker's end.

Applied inside a freshly forked worker before any tool code runs.  All of
it is best effort: a limit the kernel refuses is logged, never fatal.
"""
from __future__ import annotations

import ctypes
import os
import resource
import signal
from dataclasses import dataclass, asdict
from typing import Optional

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc = None


def _prctl(option: int, arg: int) -> bool:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        return _libc.prctl(option, arg, 0, 0, 0) == 0
    except Exception:
        return False


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits."""
    return _prctl(PR_SET_PDEATHSIG, int(sig))


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process instead of init."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


@dataclass
class Limits:
    """Per-library sandbox settings (``host_tool_configs[stem]["sandbox"]``)."""
    timeout_s: Optional[float] = 60.0       # None/0: no timeout
    grace_s: float = 2.0                    # soft interrupt -> hard kill
    memory_mb: Optional[float] = None       # kernel limit + watchdog on the process tree
    cpu_s: Optional[int] = None             # RLIMIT_CPU of the worker
    max_open_files: int = 1024
    max_file_size_mb: Optional[float] = 4096
    max_result_mb: float = 64
    log_bytes_per_s: int = 256 * 1024       # tool stdout/stderr forwarded to logging
    # confinement (confine.py); None: the binding's / supervisor's setting
    confine: Optional[bool] = None
    network: bool = True                    # False: own network namespace, loopback only
    env: Optional[dict] = None              # extra environment variables for the worker
    read_paths: tuple = ()                  # extra read-only paths for a confined worker
    run_as: Optional[tuple] = None          # (uid, gid) of a confined worker of a root host;
                                            # None: the supervisor's run_as (65534, 65534)

    def __post_init__(self) -> None:
        if self.run_as is not None:
            from .confine import run_as_ids
            self.run_as = run_as_ids(self.run_as)

    @classmethod
    def merged(cls, base: "Limits", override: Optional[dict]) -> "Limits":
        if not override:
            return base
        known = {k: v for k, v in override.items() if k in cls.__dataclass_fields__}
        return cls(**{**asdict(base), **known})


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
        _set(resource.RLIMIT_CPU, int(lim["cpu_s"]), slack=1)     # SIGXCPU, then SIGKILL 1 s later
    if lim.get("memory_mb"):
        # RLIMIT_DATA counts private writable memory (heap and anonymous mmaps):
        # an allocation past it fails with MemoryError inside the tool.
        _set(resource.RLIMIT_DATA, int(lim["memory_mb"] * 1024 * 1024))
    # A tool writing past RLIMIT_FSIZE should get an OSError, not die of SIGXFSZ.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


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


_PAGE = os.sysconf("SC_PAGE_SIZE")


def children(pid: int) -> list[int]:
    """The direct children of ``pid``, from /proc/<pid>/task/<tid>/children."""
    if not _HAS_CHILDREN_FILES:
        import psutil                 # kernels without CONFIG_PROC_CHILDREN: slower, same answer
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


def tree_rss(pid: int) -> int:
    """Resident memory of a process and all its descendants, in bytes (0 if gone)."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/statm", "rb") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            pass
    return total
