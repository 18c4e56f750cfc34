"""The host's open-files limit: it holds two descriptors per worker (its socket
and its log pipe), so the supervisor raises its soft RLIMIT_NOFILE at start, and a
worker that cannot start for want of descriptors is explained, not just refused."""
from __future__ import annotations

import errno
import resource


def raise_open_files_limit() -> dict[str, object]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (the host holds two
    descriptors per worker: its socket and its log pipe); what holds, for pool_stats()."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out: dict[str, object] = {"soft": soft, "hard": hard, "raised_from": None}
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
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        which = ("this process's limit of" if exc.errno == errno.EMFILE
                 else "the system's file table, limit")
        return (f". The host ran out of file descriptors ({which} {soft} open files, "
                f"RLIMIT_NOFILE; each worker holds two): raise the limit or lower max_workers")
    return ""
