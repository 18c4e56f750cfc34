"""Mounts of a confined worker: its own root (a PID namespace's worker), or reaching the
allowed paths when a folder above them is private to root (own_root(), make_reachable())."""
from __future__ import annotations

import ctypes
import os
import stat
from typing import Iterable, Optional, Sequence

from ...core.policy import DEFAULT_RUN_AS, SWITCHED_OFF, SYSTEM_READ_PATHS, run_as_ids
from ...core.policy import path_within as _within
from ...core.syscall_numbers import number as syscall_number
from ..libc import libc as _libc
from ..pidns_init import IN_OWN_PIDNS

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_SLAVE = 2, 4, 8, 4096, 16384, 1 << 19
_MS_RDONLY, _MS_REMOUNT, _MNT_DETACH = 1, 32, 2


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
                    # Else it comes along.
                    if not any(_within(path, p) for p in listed):
                        listed.append(path)
                break
    return covers


def _cover(above: str, below: list[str], failed: list[str]) -> None:
    """Cover ``above`` with a tmpfs holding only the way down to each path of
    ``below``, each bound there as it is; what failed goes to ``failed``."""
    fds = []
    try:
        # Opened in this namespace, before the cover hides them.
        for path in below:
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


def own_root(read_write: Sequence[str], read_only: Sequence[str],
             devices: Sequence[str], build: bool = True) -> tuple[str, str]:
    """(A worker in a PID namespace of its own: the zygote forked it so) a mount
    namespace of its own whose root is a tmpfs holding only the allowed paths, each bound
    at its own place (``read_only`` read-only, ``read_write`` as they are), the
    ``devices``, and a /proc of its PID namespace: another tenant's folder, the host's
    /tmp or /home do not exist for it, whatever the kernel (no Landlock needed).

    Called as root, before Landlock and the privilege drop.  Returns (the PID namespace's
    report, the root's report): ("", "") when it is in no namespace of its own; a report
    that does not start with "own" says what failed.  ``build`` False (a test's switch):
    the own /proc only, no own root."""
    if not IN_OWN_PIDNS:
        return "", ""
    if _libc.unshare(_CLONE_NEWNS) != 0:
        return f"own PID namespace, but no mount namespace ({_errno()})", ""
    if _libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        return f"own PID namespace, but the host's /proc ({_errno()})", ""
    if not build:
        return _mount_proc(b"/proc"), SWITCHED_OFF
    # In its private temp dir.
    new = os.path.join(read_write[-1], ".root")
    try:
        tmp = _build_root(new, read_write, read_only, devices)
        _pivot(new)
    # A half-built root is never entered.
    except OSError as exc:
        proc = _mount_proc(b"/proc")
        return proc, f"no own root ({exc})"
    shown = len(read_write) + len(read_only)
    return PROC_OWN, f"own root (a tmpfs with only the {shown} allowed paths bound{tmp})"


#: own_root()'s report of a PID namespace with its own /proc.
PROC_OWN = "own PID namespace: pid 2 beside a small init, /proc shows its own tree only"


def _errno() -> str:
    return os.strerror(ctypes.get_errno())


def _mount_proc(target: bytes) -> str:
    if _libc.mount(b"proc", target, b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) != 0:
        return f"own PID namespace, but the host's /proc ({_errno()})"
    return PROC_OWN


def _mount(source: Optional[str], target: str, fstype: Optional[bytes], flags: int,
           data: Optional[bytes] = None) -> None:
    src = None if source is None else source.encode()
    if _libc.mount(src, target.encode(), fstype, flags, data) != 0:
        raise OSError(ctypes.get_errno(), f"mount {source or fstype!r} on {target}: {_errno()}")


def _build_root(new: str, read_write: Sequence[str], read_only: Sequence[str],
                devices: Sequence[str]) -> str:
    """The tmpfs at ``new`` with the allowed paths bound in it (OSError: what failed).
    Returns what its /tmp is, for the report."""
    os.mkdir(new, 0o700)
    _mount("tmpfs", new, b"tmpfs", _MS_NOSUID | _MS_NODEV,
           b"mode=0755,size=1m,nr_inodes=4096")
    tmp = os.path.realpath(read_write[-1])
    wanted = {os.path.realpath(p): False for p in read_only if not p.startswith("/proc")}
    wanted.update({os.path.realpath(p): True for p in read_write})
    bound: list[str] = []
    # Ancestors first.
    for path in sorted(wanted, key=lambda p: (p.count(os.sep), p)):
        if not os.path.exists(path):
            # A missing path grants nothing.
            continue
        above = next((b for b in bound if _within(path, b)), None)
        if above is not None and not wanted[path] >= wanted[above]:
            # Comes along with its bound ancestor.
            continue
        # (the temp dir holds the new root's tmpfs: bound without it)
        _bind(path, new + path, writable=wanted[path], inside=above is not None,
              recursive=path != tmp)
        bound.append(path)
    # Merged-/usr links.
    for link in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(link) and not os.path.lexists(new + link):
            os.symlink(os.readlink(link), new + link)
    os.makedirs(new + "/dev", 0o755, exist_ok=True)
    for dev in devices:
        if os.path.exists(dev):
            _bind(dev, new + dev, writable=True, inside=False, flags=0)
    shown = ", /tmp holds only the way to allowed paths"
    # Its temp dir is its /tmp too.
    if not os.path.lexists(new + "/tmp"):
        _bind(read_write[-1], new + "/tmp", writable=True, inside=False, recursive=False)
        shown = ", its temp dir as /tmp"
    os.makedirs(new + "/proc", 0o555, exist_ok=True)
    if _mount_proc((new + "/proc").encode()) != PROC_OWN:
        raise OSError(ctypes.get_errno(), f"proc on {new}/proc: {_errno()}")
    # The tmpfs itself read-only: its folders may be the worker's own (a user namespace's
    # worker made them), and nothing but the binds in it is for writing.
    _mount(None, new, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    return shown


def _bind(path: str, target: str, writable: bool, inside: bool,
          flags: int = _MS_NOSUID | _MS_NODEV, recursive: bool = True) -> None:
    """Bind ``path`` at ``target`` (its mount point made first unless it lies in a bound
    ancestor), read-only unless ``writable``, with the mounts below it if ``recursive``."""
    if not inside:
        if os.path.isdir(path):
            os.makedirs(target, 0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(path, target, None, _MS_BIND | (_MS_REC if recursive else 0))
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | flags | _kept(target)
           | (0 if writable else _MS_RDONLY))


# statvfs flags -> the mount flags a remount must keep (in a user namespace the host's
# mount flags are locked: a remount that drops one is refused)
_KEPT = ((os.ST_RDONLY, _MS_RDONLY), (os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV),
         (os.ST_NOEXEC, _MS_NOEXEC), (os.ST_NOATIME, 1024), (os.ST_NODIRATIME, 2048),
         (os.ST_RELATIME, 1 << 21))


def _kept(target: str) -> int:
    flags = os.statvfs(target).f_flag
    return sum(ms for st, ms in _KEPT if flags & st)


def _pivot(new: str) -> None:
    """Make ``new`` this process's root; the old one is detached (gone for it)."""
    number = syscall_number("pivot_root", os.uname().machine)
    if number is None:
        raise OSError(0, f"no pivot_root number for {os.uname().machine}")
    os.chdir(new)
    # The old root stacked on the new.
    if _libc.syscall(number, b".", b".") != 0:
        raise OSError(ctypes.get_errno(), f"pivot_root: {_errno()}")
    if _libc.umount2(b".", _MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), f"umount of the old root: {_errno()}")
    os.chdir("/")
