"""Reaching the allowed paths when a folder above them is private to root."""
from __future__ import annotations

import ctypes
import os
import stat
from typing import Iterable, Optional, Sequence

from ...core.policy import DEFAULT_RUN_AS, SYSTEM_READ_PATHS, run_as_ids
from ...core.policy import path_within as _within
from ..libc import libc as _libc

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_SLAVE = 2, 4, 8, 4096, 16384, 1 << 19


def _searchable(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether ``uid``:``gid`` (no other groups) may pass through a directory (mode bits)."""
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def make_reachable(paths: Iterable[str], run_as: Optional[Sequence[int]] = None) -> str:
    """Let the worker's uid-to-be reach ``paths`` when a directory above them is
    private to root (a Python installed in root's home directory, pytest's 0700 temp
    folders): in an own mount namespace, that directory is covered by a small
    read-only-for-others tmpfs holding only the way down to each path, each path
    bound there as it is.  Nothing changes for the host.  A path's own permissions
    still apply.

    Called as root, before Landlock (whose rules are then taken on the paths as the
    worker sees them) and before dropping privileges.  Returns "" when nothing was
    needed, else a report."""
    if os.geteuid() != 0:
        return ""
    try:
        uid, gid = run_as_ids(DEFAULT_RUN_AS if run_as is None else run_as)
    except ValueError:
        return ""
    covers = _private_ancestors(paths, uid, gid)
    if not covers:
        return ""
    if _libc.unshare(_CLONE_NEWNS) != 0:
        return (f"unreachable by uid {uid}: below {', '.join(covers)} "
                f"(unshare: {os.strerror(ctypes.get_errno())})")
    # Mounts made here must never propagate to the host; the host's later mounts still arrive.
    if _libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        return (f"unreachable by uid {uid}: below {', '.join(covers)} "
                f"(mount: {os.strerror(ctypes.get_errno())})")
    failed: list[str] = []
    for above, below in covers.items():
        _cover(above, below, failed)
    shown = ", ".join(covers)
    if failed:
        return f"own mount namespace, {shown} covered; failed: {', '.join(failed)}"
    return f"{shown} covered (own mount namespace: only the allowed paths below, for uid {uid})"


def _private_ancestors(paths: Iterable[str], uid: int, gid: int) -> dict[str, list[str]]:
    """Private ancestor -> the paths below it that ``uid``:``gid`` cannot reach (the
    first directory on each path's way down it may not pass)."""
    covers: dict[str, list[str]] = {}
    for path in sorted({os.path.realpath(p) for p in paths if p}):
        parts = path.strip(os.sep).split(os.sep)
        for i in range(1, len(parts)):
            above = os.sep + os.sep.join(parts[:i])
            try:
                st = os.stat(above)
            except OSError:
                break
            if not _searchable(st, uid, gid):
                if (above not in (*SYSTEM_READ_PATHS, "/dev", "/proc", "/sys")
                        and os.path.exists(path)):
                    listed = covers.setdefault(above, [])
                    if not any(_within(path, p) for p in listed):   # else it comes along
                        listed.append(path)
                break
    return covers


def _cover(above: str, below: list[str], failed: list[str]) -> None:
    """Cover ``above`` with a tmpfs holding only the way down to each path of
    ``below``, each bound there as it is; what failed goes to ``failed``."""
    fds = []
    try:
        for path in below:                # opened in this namespace, before the cover hides them
            fds.append((path, os.open(path, os.O_PATH | os.O_CLOEXEC)))
        if _libc.mount(b"tmpfs", above.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                       b"mode=0755,size=64k,nr_inodes=256") != 0:
            failed.append(f"{above} ({os.strerror(ctypes.get_errno())})")
            return
        for path, fd in fds:
            rel = os.path.relpath(path, above)
            os.makedirs(os.path.join(above, os.path.dirname(rel)), mode=0o755, exist_ok=True)
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.mkdir(path, 0o755)
            else:
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
            if _libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None,
                           _MS_BIND | _MS_REC, None) != 0:
                failed.append(f"{path} ({os.strerror(ctypes.get_errno())})")
    except OSError as exc:
        failed.append(f"{above} ({exc})")
    finally:
        for _, fd in fds:
            os.close(fd)


def own_proc() -> str:
    """In a worker that is pid 1 of its own PID namespace (the zygote forked it so): an own
    mount namespace with a /proc of that namespace, so /proc shows its own tree only.
    "" when it is not pid 1; else the report ("own PID namespace..." or why not)."""
    if os.getpid() != 1:
        return ""
    if _libc.unshare(_CLONE_NEWNS) != 0:
        return f"own PID namespace, but no mount namespace ({os.strerror(ctypes.get_errno())})"
    if _libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) != 0 or _libc.mount(
            b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) != 0:
        return f"own PID namespace, but the host's /proc ({os.strerror(ctypes.get_errno())})"
    return "own PID namespace: pid 1, /proc shows its own tree only"
