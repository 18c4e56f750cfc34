"""Tenants apart by their uids, where neither Landlock nor namespaces of its own hold
(a default container: Docker's seccomp profile refuses unshare and mount; a kernel before
Linux 6.12 has no Landlock scope, one before 5.13 no Landlock at all).

A worker that holds a uid of its tenant's own and no capability is kept from other
tenants and from the host by the kernel's permission checks on uids:

    processes      kill(2), pidfd_send_signal and SIGIO to another uid's process: EPERM;
                   ptrace and /proc/<pid>/{environ,mem,maps,fd,cwd,root...}: the ptrace
                   access check (same uid, and workers are not dumpable); priorities,
                   affinity, limits of another pid: the system call filter (its own only)
                   and the same uid check.  Left visible, as on any multi-user system
                   without hidepid: /proc/<pid>/cmdline, stat and status of every process.
    files          its root and its temp dir are its uid's, mode 0700, so another tenant's
                   uid cannot pass; what it creates is 0600 (umask 077: private_umask(),
                   for every worker of its tenant's own uid);
                   the folder holding the tenants' roots must not list them to it; the
                   engine and the Python installation must not be writable by it.
                   /tmp, /var/tmp, /dev/shm and the rest of core/shared_places.py stay
                   writable by every uid: each must carry the sticky bit (no one removes or
                   renames another's files), and what a tool makes there is 0600; its
                   TMPDIR (tempfile) is its private temp dir.  What its uid leaves there is
                   swept before the uid serves another tenant (backends/local/confine/sweep.py).

Each check is read back from the kernel after the uid was taken; a report starts with
"on" only when all of it holds, and says what failed otherwise.
"""
from __future__ import annotations

import os
import stat
from typing import Iterable, Sequence

from ...core.shared_places import SHARED_WRITABLE
from ..libc import libc

_PRIVATE_UMASK = 0o077


def namespaces_refused() -> bool:
    """Whether a system call filter refuses namespaces to this process whatever the flags
    (a default container's: unshare(0), a no-op otherwise, answers EPERM); asked before its
    own filter is in.  Only then do files rest on the uid alone: elsewhere a fresh worker
    has a root of its own."""
    return libc.unshare(0) != 0


def holds_own_uid(conf: dict, privileges: str) -> bool:
    """Whether this worker runs as a uid of its tenant's own (the host gave it one:
    ``conf["per_tenant"]``), with all three ids that uid and no capability (``privileges``:
    drop_privileges()' or handoff.take()'s report, read back from the kernel)."""
    run_as = list(conf.get("run_as") or [])
    if not conf.get("per_tenant") or len(run_as) != 2 or not privileges.startswith("uid "):
        return False
    uid, gid = int(run_as[0]), int(run_as[1])
    return (uid > 0 and os.getresuid() == (uid,) * 3 and os.getresgid() == (gid,) * 3
            and "no capabilities" in privileges)


def processes_by_uid() -> str:
    """The report of processes kept apart by the uid (holds_own_uid() said so)."""
    return ("on (a uid of its tenant's own, no capabilities: signals, ptrace, /proc/<pid> "
            "beyond command lines and status, priorities and affinity of other tenants' "
            "processes and of the host's refused by the kernel's uid checks; no PID "
            "namespace nor Landlock scope)")


def private_umask() -> None:
    """(A worker holding its tenant's own uid) what it creates is its uid's alone: 0600
    files, 0700 folders, wherever it makes them (/tmp and /dev/shm included)."""
    os.umask(_PRIVATE_UMASK)


def files_by_uid(root: str, tmp: str, engine: Sequence[str], open_siblings: Sequence[str]) -> str:
    """(A worker holding its tenant's own uid, without Landlock nor a root of its own)
    whether its files are apart by its uid: "on (...)" or "unavailable (what does not
    hold)".  ``open_siblings``: what the host found beside its root that other uids may
    open by name (backends/local/confine/handover.py: a tenant's folder made before its first
    worker made it 0700)."""
    parent = os.path.dirname(os.path.realpath(root))
    wrong = [*_own_private(root, "its root"), *_own_private(tmp, "its temp dir"),
             *_listed(parent), *_writable(engine), *_unsticky(SHARED_WRITABLE)]
    if open_siblings:
        wrong.append(f"{parent} holds what every uid may open by name: "
                     f"{', '.join(open_siblings)} (chmod o-rwx; a tenant's root becomes its "
                     f"uid's, 0700, at its first worker)")
    if wrong:
        return f"unavailable (a uid of its tenant's own, but {'; '.join(wrong)})"
    return ("on (a uid of its tenant's own: its root and temp dir are its uid's, mode 0700, "
            "what it creates 0600 (umask 077); other tenants' roots closed to it by theirs; "
            f"{', '.join(SHARED_WRITABLE)} writable by every uid but sticky)")


def _own_private(path: str, what: str) -> list[str]:
    try:
        st = os.stat(path)
    except OSError as exc:
        return [f"{what} cannot be checked ({exc.strerror})"]
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        return [f"{what} {path} is uid {st.st_uid}'s, mode {stat.S_IMODE(st.st_mode):04o}, "
                f"not its own with mode 0700"]
    return []


def _listed(parent: str) -> list[str]:
    """The folder above its root lists the other tenants' folders to it."""
    if os.access(parent, os.R_OK):
        return [f"{parent}, the folder holding its root, lists the other tenants' folders to "
                f"every uid (chmod 0711 {parent}: others may pass, not list)"]
    return []


def _writable(paths: Iterable[str]) -> list[str]:
    """What of the engine and the Python installation it could change."""
    found = [p for p in paths if os.path.exists(p) and os.access(p, os.W_OK)]
    if found:
        return [f"it can write {', '.join(found)} (code the engine runs)"]
    return []


def _unsticky(paths: Iterable[str]) -> list[str]:
    """Shared places it may write where it could remove or replace another uid's files."""
    found = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if os.access(path, os.W_OK) and not st.st_mode & stat.S_ISVTX:
            found.append(path)
    if found:
        return [f"{', '.join(found)} writable by every uid without the sticky bit"]
    return []
