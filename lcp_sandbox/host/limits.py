"""Per-library sandbox settings: the host's configuration of a worker.

Read from ``host_tool_configs[stem]["sandbox"]`` over the binding's defaults;
sent to the worker in INIT as a dict, where worker/rlimits.py applies the
process limits and worker/confine/ the confinement.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ..core.policy import run_as_ids
from ..core.syscalls import check_setting
from .outcomes import CallFailed


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
    # confinement (worker/confine/); None: the binding's / supervisor's setting
    confine: Optional[bool] = None
    network: bool = True                    # False: own network namespace, loopback only
    env: Optional[dict] = None              # extra environment variables for the worker
    read_paths: tuple = ()                  # extra read-only paths for a confined worker
    run_as: Optional[tuple] = None          # (uid, gid) of a confined worker of a root host;
                                            # None: the supervisor's run_as (65534, 65534)
    template: bool = True                   # False: every worker imports the library itself
                                            # (no shared template process, host/templates.py)
    syscalls: Optional[dict] = None         # {"allow": [names], "allow_dangerous": bool}: calls
                                            # a confined worker adds to the allowlist
                                            # (core/syscalls.py; checked here)

    def __post_init__(self) -> None:
        if self.run_as is not None:
            self.run_as = run_as_ids(self.run_as)
        if self.syscalls is not None:
            self.syscalls = check_setting(self.syscalls)

    @classmethod
    def merged(cls, base: "Limits", override: Optional[dict]) -> "Limits":
        if not override:
            return base
        known = {k: v for k, v in override.items() if k in cls.__dataclass_fields__}
        return replace(base, **known)        # (not asdict: it deep-copies every field, slowly)


def library_limits(base: Limits, override: Optional[dict], library: str) -> Limits:
    """A library's limits; settings the host got wrong (an unknown system call name...)
    end the call before any worker starts, with a 500 that says what is wrong."""
    try:
        return Limits.merged(base, override)
    except (ValueError, TypeError) as exc:
        raise CallFailed(f"[{library}] not run: host_tool_configs[{library!r}][\"sandbox\"] "
                         f"is invalid: {exc}") from None


def raise_open_files_limit() -> dict:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (the host holds two
    descriptors per worker: its socket and its log pipe); what holds, for pool_stats()."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out = {"soft": soft, "hard": hard, "raised_from": None}
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            out.update(soft=target, raised_from=soft)
        except (ValueError, OSError) as exc:
            out["not_raised"] = str(exc)
    return out


def out_of_descriptors(exc: BaseException) -> str:
    """A sentence for an OSError that is EMFILE / ENFILE (else "")."""
    import errno
    import resource
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        which = "this process's limit of" if exc.errno == errno.EMFILE else "the system's file table, limit"
        return (f". The host ran out of file descriptors ({which} {soft} open files, RLIMIT_NOFILE; "
                f"each worker holds two): raise the limit or lower max_workers")
    return ""
