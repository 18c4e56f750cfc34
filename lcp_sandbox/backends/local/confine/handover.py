"""Host side of confinement: the worker's root, handed over before it starts.

A confined worker of a root host drops to an unprivileged uid (worker/confine/
privileges.py).  Before it starts, the host makes the confinement root and a
private temp dir (temp_dirs.py) that uid's: the worker never names a path the host
acts on.

Managing workers of another uid takes some of root's capabilities; a root host that
lacks one (a container that dropped it) refuses confined calls (503) naming it, before
anything runs, instead of starting a worker it could not stop or clean up after:

    CAP_KILL          the zygote (a root program the host starts: it holds the host's
                      set within its bounding set) signals and kills them: without it a
                      call past its timeout runs on
    CAP_CHOWN         their root and temp dir are given to their uid: else they cannot
                      enter them
    CAP_FOWNER        the mode of a root given to their uid is set (0700): else no worker
                      starts
    CAP_DAC_OVERRIDE  what they leave in their temp dirs (0700, their uid's) is removed:
                      else it stays behind
    CAP_SETUID, CAP_SETGID, CAP_SETPCAP   each worker takes its uid and empties its
                      bounding set: the "privileges" protection (confine="best-effort"
                      runs without it, as it runs without any protection missing)
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import select
import stat
import sys
import threading
from typing import Iterable, Optional

from .... import protocol as P
from ....core.outcomes import Refused, Unavailable
from ....core.policy import BEST_EFFORT, ENGINE_DIR, may_hand_over, python_paths
from ....core.policy import path_within as _within
from ....system import capabilities
from .temp_dirs import DIR_FLAGS, open_dir_path

#: What a root host does with each capability it needs for workers of another uid.
MANAGING = {"KILL": "to signal and kill them (a call past its timeout would run on)",
            "CHOWN": "to give them their root and temp dir (they could not enter them)",
            "FOWNER": "to set the mode of a root it gave them (no worker would start)",
            "DAC_OVERRIDE": "to remove what they leave in their temp dirs (it would stay "
                            "behind)"}
#: The ones a worker needs to take its uid and drop the rest (the "privileges" protection).
DROPPING = ("SETUID", "SETGID", "SETPCAP")


def check_capabilities(library: str, tool: str, uid: int, best_effort: bool,
                       mask: Optional[int] = None) -> None:
    """Before a confined worker of uid ``uid`` starts on a root host: 503 naming each
    capability the host lacks to manage it (MANAGING) or to let it drop to that uid
    (DROPPING: not with confine="best-effort").  The host hands over and cleans up with
    its own effective set; the zygote it starts kills and the workers drop with what an
    exec'd root gets (capabilities.of_children()).  ``mask``: one set for all (a test's;
    default: this process's, read once)."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return
    held = capabilities.effective() if mask is None else mask
    # the zygote kills, and workers drop: both hold what an exec'd root gets
    started = capabilities.of_children() if mask is None else mask
    managing = [name for name in MANAGING if name in capabilities.missing(
        (name,), started if name == "KILL" else held)]
    dropping = [] if best_effort else capabilities.missing(DROPPING, started)
    if not managing and not dropping:
        return
    said = []
    if dropping:
        said.append(f"its confinement is not all in force (privileges: unavailable: this "
                    f"root host lacks {_caps(dropping)}, which its workers need to take uid "
                    f"{uid} and drop every capability). With confine=\"best-effort\" it runs "
                    f"with what there is.")
    if managing:
        what = "; ".join(f"CAP_{name} {MANAGING[name]}" for name in managing)
        said.append(f"this root host lacks what it needs to manage workers that run as uid "
                    f"{uid}: {what}. Nothing was run.")
    fix = " ".join(f"--cap-add {name}" for name in dropping + managing)
    said.append(f"Add {_caps(dropping + managing)} to the container (docker run {fix}; "
                f"Kubernetes: securityContext.capabilities.add), or run the host as a "
                f"non-root user: its workers then keep its uid and need none of them.")
    raise Unavailable.not_run(library, tool, " ".join(said), "host_capabilities")


def check_reachable(library: str, tool: str, uid: int, gid: int,
                    read_paths: Iterable[str]) -> None:
    """Before a confined worker of ``uid``:``gid`` starts on a root host that can give it no
    mount namespace (a filter refuses namespaces: a container's default): 503 naming the
    first folder that uid may not pass on its way to the library's folder, the Python
    environment, the interpreter or the engine, and what to change.  Elsewhere the worker
    covers such a folder itself (worker/confine/mounts.py); here it would fail to import
    its library with a bare PermissionError."""
    why = reach_refusal(uid, gid, read_paths)
    if why:
        raise Unavailable.not_run(library, tool, why + " Nothing was run.", "unreachable")


def reach_refusal(uid: int, gid: int, read_paths: Iterable[str]) -> str:
    """unreachable(), asked only where it matters: a root host whose workers of another
    uid can make no mount namespace; "" elsewhere."""
    if (os.geteuid() != 0 or uid == 0 or not sys.platform.startswith("linux")
            or not _namespaces_refused()):
        return ""
    return unreachable(uid, gid, read_paths)


def unreachable(uid: int, gid: int, read_paths: Iterable[str]) -> str:
    """"" if ``uid``:``gid`` may pass every folder above the library's folder (the first of
    ``read_paths``), the other read paths, the Python environment, the interpreter and the
    engine; else which it cannot reach, the folder in its way and what to change."""
    read = list(read_paths)
    # (the library's folder first: the one a user most often places)
    named = {**{p: "the library's folder" for p in read[:1]},
             **{p: "a folder it reads" for p in read[1:]},
             **{p: "the Python environment" for p in python_paths()},
             os.path.dirname(os.path.realpath(sys.executable)): "the interpreter",
             ENGINE_DIR: "the sandbox engine"}
    for path, what in named.items():
        above = _closed_above(path, uid, gid)
        if above is None:
            continue
        st = os.stat(above)
        return (f"uid {uid} cannot reach {what} {path}: it may not pass through {above} "
                f"(mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid}'s), and on this host "
                f"(a filter refuses namespaces, as a container's default seccomp profile "
                f"does) a worker cannot be given a view past it. Let every uid pass that "
                f"folder (chmod o+x {above}), or put what the workers read below folders "
                f"every uid may pass (a checkout or a virtualenv under /srv or /opt, not "
                f"in /root).")
    return ""


def _closed_above(path: str, uid: int, gid: int) -> Optional[str]:
    """The first folder above ``path`` (real) that ``uid``:``gid``, with no other group,
    may not pass by its mode bits; None if there is none (or ``path`` is not there)."""
    real = os.path.realpath(path)
    parts = real.strip(os.sep).split(os.sep)
    for i in range(1, len(parts)):
        above = os.sep + os.sep.join(parts[:i])
        try:
            st = os.stat(above)
        except OSError:
            return None
        bit = (stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid
               else stat.S_IXOTH)
        if not st.st_mode & bit:
            return above if os.path.exists(real) else None
    return None


def _caps(names: list[str]) -> str:
    return ", ".join(f"CAP_{name}" for name in names)


def hand_over_root(init: P.Init, run_as: tuple[int, int], library: str, tool: str,
                   private: bool = False, nproc: Optional[int] = None) -> P.Init:
    """Before a confined worker starts: its root becomes ``run_as``'s (``private``: mode
    0700, a uid of the tenant's own, whose processes ``nproc`` caps); returns the INIT that
    says so.  A root host without the capabilities that takes refuses the call (503:
    check_capabilities()), a root that must not be handed over too (403); OSError when
    handing over fails."""
    confine = init.confine or {}
    root = confine["root"]
    check_capabilities(library, tool, run_as[0],
                       (init.limits or {}).get("confine") == BEST_EFFORT)
    check_reachable(library, tool, *run_as, confine.get("read_paths", ()))
    real = os.path.realpath(root)
    if not may_hand_over(real):
        # A confined tool could rewrite code that later runs unconfined (the zygote).
        raise Refused.not_run(library, tool, f"its confinement root {root!r} is or holds a system "
                              f"directory, the sandbox engine or the Python installation, which a "
                              f"confined tool must not be able to write. Use a workspace of its "
                              f"own.")
    # Its uid's alone (private): another tenant's uid cannot pass.
    hand_over(real, *run_as, mode=0o700 if private else None, checked=True)
    per_tenant: dict = {}
    if private:
        # confined.py
        per_tenant = {"per_tenant": True, "nproc": nproc}
        if files_rest_on_uids(init.disabled or ()):
            per_tenant["open_siblings"] = open_siblings(root)
    # The temp dir is the host's to make (local/templates.py, when it knows where) and to
    # remove: no path a worker names is ever deleted.
    return init._replace(confine={**confine, "run_as": run_as, **per_tenant})


def files_rest_on_uids(disabled: Iterable[str]) -> bool:
    """Whether this host's confined workers keep their files apart by their uids alone
    (worker/confine/apart.py): no Landlock, and a filter refuses namespaces, so no root of
    their own either.  ``disabled``: a test's switches (lcp_sandbox.testing)."""
    if not sys.platform.startswith("linux"):
        return False
    return ("landlock" in disabled or _kernel_without_landlock()) and _namespaces_refused()


@functools.lru_cache(maxsize=1)
def _kernel_without_landlock() -> bool:
    """landlock_create_ruleset(NULL, 0, VERSION) fails (as the worker's own asking would:
    worker/confine/landlock.py): no Landlock in this kernel, or a filter hides it."""
    return _libc().syscall(ctypes.c_long(_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
                           ctypes.c_uint32(1)) < 1


@functools.lru_cache(maxsize=1)
def _namespaces_refused() -> bool:
    """unshare(0), a no-op, is refused: a filter refuses namespaces to this host, and so
    to its workers (as worker/confine/apart.namespaces_refused() finds in a worker)."""
    return _libc().unshare(0) != 0


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


#: landlock_create_ruleset: the same number on every Linux architecture.
_LANDLOCK_CREATE_RULESET = 444


#: How many of the names open_siblings() found are said (the count is always said).
_SIBLINGS_SHOWN = 5


def open_siblings(root: str) -> list[str]:
    """What lies beside ``root`` (a tenant's root, in the folder of the tenants' roots)
    that another uid may open by name: a folder it may enter, a file it may read or write
    (symlinks aside: their targets' own modes hold).  Where files rest on the uids alone,
    another tenant's worker could open them: that worker's filesystem protection is then
    not in force (apart.files_by_uid()).  At most _SIBLINGS_SHOWN names, then a count."""
    path = os.path.realpath(root)
    found: list[str] = []
    try:
        with os.scandir(os.path.dirname(path)) as entries:
            for entry in entries:
                if entry.path == path:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISLNK(st.st_mode) and st.st_mode & stat.S_IRWXO:
                    found.append(entry.name)
    except OSError:
        return []
    shown = sorted(found)[:_SIBLINGS_SHOWN]
    return shown + ([f"{len(found) - len(shown)} more"] if len(found) > len(shown) else [])


# Directory levels handed over below a root.
_MAX_DEPTH = 64


class _Level:
    """A directory of the walk: its open descriptor, its path, its subdirectories to visit."""
    __slots__ = ("fd", "where", "pending")

    def __init__(self, fd: int, where: str) -> None:
        self.fd, self.where = fd, where
        self.pending: list[tuple[str, int]] = []


def hand_over(path: str, uid: int, gid: int, mode: Optional[int] = None,
              checked: bool = False) -> None:
    """Make ``path`` (a confinement root) and what it holds owned by ``uid``:``gid``, and
    set the root's ``mode`` (through its descriptor, as the rest: a folder above it may be
    a worker's, which could swap the root for a link).

    Host side, before a confined worker that will run as that uid starts; unless this
    process is root, only the mode is set.  What already lives there may be hostile (a worker
    of the same tenant may be running), so every directory is opened relative to
    its parent with O_NOFOLLOW and checked to be the entry that was listed, and
    only directories and regular files change owner, each through its own open
    descriptor.  Left alone: symlinks, devices, sockets, fifos, a regular file with
    more than one link (it may be a hard link to a file outside the root), other
    file systems mounted inside, entries deeper than 64 levels, and whatever
    vanishes or changes meanwhile.  Raises PermissionError for a root that is or
    holds a system directory or the Python installation."""
    owner = os.geteuid() == 0
    if not owner and mode is None:
        return
    # (checked: a real path the caller found may_hand_over(), just now)
    path = path if checked else os.path.realpath(path)
    if not checked and not may_hand_over(path):
        raise PermissionError(f"refusing to hand {path!r} to uid {uid}: it is or holds a system "
                              "directory or the Python installation; give the worker a root of "
                              "its own")
    # A worker's start (checked) or a mode asked must not go on without it.
    top = _open_root(path, refuse=checked or mode is not None)
    if top is None:
        return
    # Depth first, holding one descriptor per level.
    stack = [_Level(top, path)]
    try:
        if mode is not None:
            os.fchmod(top, mode)
        if not owner:
            return
        # Bind mounts of the same file system too.
        mounts = _mount_points_below(path)
        dev = os.fstat(top).st_dev
        stack[-1].pending = _hand_over_dir(top, path, dev, mounts, uid, gid, 0)
        while stack:
            level = stack[-1]
            if not level.pending:
                os.close(stack.pop().fd)
                continue
            name, ino = level.pending.pop()
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=level.fd)
            except OSError:
                continue
            below = _Level(sub, os.path.join(level.where, name))
            stack.append(below)
            try:
                st = os.fstat(sub)
            except OSError:
                continue
            # Else replaced since it was listed.
            if st.st_ino == ino and st.st_dev == dev:
                below.pending = _hand_over_dir(sub, below.where, dev, mounts, uid, gid,
                                               len(stack) - 1)
    finally:
        for level in stack:
            os.close(level.fd)


def _open_root(path: str, refuse: bool) -> Optional[int]:
    """hand_over()'s descriptor on ``path``; None when it is gone or a link appeared on
    the way (nothing is handed over), PermissionError then instead if ``refuse``."""
    try:
        return open_dir_path(path)
    except OSError as exc:
        if refuse:
            raise PermissionError(f"the confinement root {path} was replaced (by a link) or is "
                                  f"gone since it was checked: not handed over ({exc.strerror})"
                                  ) from None
        return None


class _MountTable:
    """This process's mount points, read from /proc/self/mountinfo again only when the
    kernel says the table changed: a poll() of the open file reports POLLPRI after any
    mount or unmount in the namespace (a hand-over per new tenant read the whole table
    each time, a tenth of a millisecond)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd = -1
        self._points: list[str] = []

    def points(self) -> list[str]:
        with self._lock:
            if self._fd < 0 or self._changed():
                self._points = self._read()
            return self._points

    def _changed(self) -> bool:
        poller = select.poll()
        poller.register(self._fd, select.POLLPRI | select.POLLERR)
        return bool(poller.poll(0))

    def _read(self) -> list[str]:
        try:
            if self._fd < 0:
                self._fd = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
                # Poll once: from now on it tells changes.
                self._changed()
            os.lseek(self._fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(self._fd, 1 << 16):
                chunks.append(chunk)
            out = []
            for line in b"".join(chunks).splitlines():
                raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), line.split()[4])
                out.append(os.fsdecode(raw))
            return out
        except (OSError, IndexError):
            if self._fd >= 0:
                os.close(self._fd)
            # Read again next time.
            self._fd = -1
            return []


_MOUNTS = _MountTable()


def _mount_points_below(path: str) -> set[str]:
    return {point for point in _MOUNTS.points() if point != path and _within(point, path)}


def _hand_over_dir(fd: int, where: str, dev: int, mounts: set[str], uid: int, gid: int,
                   depth: int) -> list[tuple[str, int]]:
    """Chown an open directory and its regular files; return its subdirectories to visit."""
    try:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.chown(fd, uid, gid)
        with os.scandir(fd) as it:
            entries = [e.name for e in it]
    except OSError:
        return []
    subdirs = []
    for name in entries:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if st.st_dev != dev or (mounts and os.path.join(where, name) in mounts):
            continue
        if stat.S_ISDIR(st.st_mode):
            if depth < _MAX_DEPTH:
                subdirs.append((name, st.st_ino))
        elif stat.S_ISREG(st.st_mode) and (st.st_uid, st.st_gid) != (uid, gid) and st.st_nlink == 1:
            # O_NONBLOCK: if a fifo took its place, opening does not wait for a writer.
            try:
                f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                            | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                continue
            try:
                now = os.fstat(f)
                if now.st_ino == st.st_ino and stat.S_ISREG(now.st_mode) and now.st_nlink == 1:
                    os.chown(f, uid, gid)
            except OSError:
                pass
            finally:
                os.close(f)
    return subdirs
