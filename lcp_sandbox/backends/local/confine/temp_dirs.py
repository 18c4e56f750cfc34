"""The confined workers' temp dirs, host side: made, given to a worker's uid, removed.

    made_dir(prefix, parent)        a new folder, made through a descriptor of ``parent``
    give_made_dir(path, ids, mode)  given to a uid (a root host), through a descriptor
    private_tmpdir(run_as, parent)  both: a worker's TMPDIR, its uid's
    MadeAhead(parent)               one made while no call waits, given when a worker
                                    of that parent starts (a new tenant's first call
                                    then makes none)
    remove_tmpdir(path, whose)      removed with all it holds, or a warning says what stayed
    Leaving()                       the temp dirs of workers let go while they still ran:
                                    each removed once its worker is gone, never before

The folder a template's workers' temp dirs are made in is that template's uid's
(confined.tmp_parent()), and with it of its workers where they share that uid: a worker
there could swap a path the host is about to act on for a link (inotify names a new
folder at once).  So nothing here acts on a path by name after it was made: each level is
opened without following a link (open_dir_path()), and a folder found replaced is not
used (PermissionError, "was replaced").
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Optional

from ....core.policy import DEFAULT_RUN_AS, run_as_ids

log = logging.getLogger("lcp_sandbox")

#: The workers' temp dirs (and their templates' folders of them) start so.
TMP_PREFIX = "lcp-sandbox-"
#: Opens a directory, never through a link.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The same, to name it only (for *at() calls): search permission is enough (Linux's
#: O_PATH; elsewhere, where no worker is confined, read permission as well).
PATH_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def private_tmpdir(run_as: Optional[tuple[int, int]] = None, parent: Optional[str] = None) -> str:
    """The worker's TMPDIR, created now (as the host's user) in ``parent`` (default: the
    system's) and, on a root host, given to ``run_as``, the uid the worker drops to
    (give_made_dir(): PermissionError if it was replaced meanwhile)."""
    tmp = made_dir(TMP_PREFIX, parent)
    ids = _ids(run_as)
    if ids is not None:
        give_made_dir(tmp, ids)
    return tmp


def _ids(run_as: Optional[tuple[int, int]]) -> Optional[tuple[int, int]]:
    """The (uid, gid) a temp dir goes to: None where the host is not root (it keeps the
    host's), or for a bad ``run_as`` (drop_privileges() reports it)."""
    if os.geteuid() != 0:
        return None
    try:
        return run_as_ids(DEFAULT_RUN_AS if run_as is None else run_as)
    except ValueError:
        return None


def made_dir(prefix: str, parent: Optional[str] = None) -> str:
    """A new folder (mode 0700, a random name after ``prefix``) in ``parent``, a path
    without links (default: the system's temp dir, resolved).  Made through a descriptor
    of ``parent`` opened a level at a time without following a link: a ``parent`` a worker
    swapped for one is refused (PermissionError), and nothing is made where it points."""
    where = parent or os.path.realpath(tempfile.gettempdir())
    pfd = _open_unreplaced(where, PATH_FLAGS)
    try:
        for _ in range(100):
            name = prefix + os.urandom(6).hex()
            try:
                os.mkdir(name, 0o700, dir_fd=pfd)
                return os.path.join(where, name)
            except FileExistsError:
                continue
        raise FileExistsError(f"no new name for a folder in {where} after 100 tries")
    finally:
        os.close(pfd)


def give_made_dir(path: str, ids: Optional[tuple[int, int]], mode: Optional[int] = None) -> None:
    """Give ``path``, a folder this process just made (made_dir()), to ``ids`` (a root
    host; None: keep its owner) and set its ``mode``, through a descriptor opened without
    following a link; PermissionError when what is there now is not a folder of this
    process's uid (nothing is changed)."""
    fd = _open_unreplaced(path)
    try:
        _give(fd, path, ids, mode)
    finally:
        os.close(fd)


def _give(fd: int, path: str, ids: Optional[tuple[int, int]], mode: Optional[int] = None) -> None:
    if os.fstat(fd).st_uid != os.geteuid():
        raise _replaced(path)
    if ids is not None and os.geteuid() == 0:
        os.fchown(fd, *ids)
    if mode is not None:
        os.fchmod(fd, mode)


class MadeAhead:
    """One temp dir made ahead in ``parent`` (a template's folder of its workers' temp
    dirs), held by its descriptor, the host's until take() gives it to a worker's uid.

    make() runs once a call is answered (ZygoteClient.after), never on a call's way, and
    never raises; take() gives the one made (else makes one, as private_tmpdir()); close()
    forgets it (it goes with ``parent``, which the template's end removes)."""

    def __init__(self, parent: str) -> None:
        self.parent = parent
        self._lock = threading.Lock()
        self._made: Optional[tuple[str, int]] = None
        self._closed = False

    def make(self) -> None:
        with self._lock:
            if self._made is not None or self._closed:
                return
            try:
                path = made_dir(TMP_PREFIX, self.parent)
                self._made = (path, _open_unreplaced(path))
            except OSError as exc:
                # The template's end removed its folder meanwhile; or the folder is gone
                log.debug("no temp dir made ahead in %s: %s", self.parent, exc)

    @property
    def path(self) -> Optional[str]:
        """The temp dir made ahead, if one is."""
        made = self._made
        return made[0] if made else None

    def take(self, run_as: Optional[tuple[int, int]]) -> str:
        """A temp dir for a worker that drops to ``run_as``: the one made ahead, given to
        it through its descriptor if its path still names it (else PermissionError: it
        was replaced), or a new one."""
        with self._lock:
            made, self._made = self._made, None
        if made is None:
            return private_tmpdir(run_as, self.parent)
        path, fd = made
        try:
            held, named = os.fstat(fd), os.stat(path, follow_symlinks=False)
            if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
                raise _replaced(path)
            _give(fd, path, _ids(run_as))
        finally:
            os.close(fd)
        return path

    def close(self) -> None:
        with self._lock:
            self._closed = True
            made, self._made = self._made, None
        if made is not None:
            os.close(made[1])


def remove_tmpdir(path: str, whose: str) -> None:
    """Remove a temp dir the host made for ``whose`` (a worker, a template) with all it
    holds; what cannot be removed is logged as a warning, with how much is left and why
    (a root host without CAP_DAC_OVERRIDE cannot enter what its workers' uid owns)."""
    failed: list[str] = []

    def note(function: object, where: str, exc: BaseException) -> None:
        if not isinstance(exc, FileNotFoundError):
            failed.append(f"{where}: {getattr(exc, 'strerror', None) or exc}")

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=note)
    else:
        shutil.rmtree(path, onerror=lambda function, where, info: note(function, where, info[1]))
    if failed:
        log.warning("the temp dir %s of %s is left behind, not all removed (%s%s)", path, whose,
                    "; ".join(failed[:3]), f"; {len(failed) - 3} more" if len(failed) > 3 else "")


def open_dir_path(path: str, flags: int = DIR_FLAGS) -> int:
    """An fd on the directory ``path`` (absolute, no symlinks), opened with ``flags`` one
    component at a time without following symlinks: a component swapped for a link fails
    (ELOOP, or ENOTDIR for the last).  The folders above are opened as paths only, so a
    folder others may pass but not list (0711) is no obstacle."""
    parts = [part for part in path.strip(os.sep).split(os.sep) if part]
    fd = os.open("/", (PATH_FLAGS if parts else flags) & ~os.O_NOFOLLOW)
    try:
        for i, part in enumerate(parts):
            nxt = os.open(part, flags if i == len(parts) - 1 else PATH_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_unreplaced(path: str, flags: int = DIR_FLAGS) -> int:
    """open_dir_path(), where a link or a missing folder on the way means a worker
    replaced what the host made: PermissionError saying so."""
    try:
        return open_dir_path(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
            raise _replaced(path) from None
        raise


def _replaced(path: str) -> PermissionError:
    return PermissionError(f"{path} was replaced (by a link, or a folder not the host's) "
                           "before its worker got it: not used")


class _Pending:
    __slots__ = ("path", "whose", "worker", "taken", "done")

    def __init__(self, path: str, whose: str, worker: Any) -> None:
        self.path, self.whose, self.worker = path, whose, worker
        self.taken = False
        self.done = threading.Event()


class Leaving:
    """The temp dirs of workers let go while they still ran (asked to stop, or killed):
    each is removed once its worker is gone, by whichever thread learns that first, and
    once.  A worker still ending (an atexit handler) or still starting (a fresh one makes
    its own root's mount point there, as root) could add to its folder while it is
    removed, which would then stay behind.  A worker is a backends/local/process.py
    WorkerProcess: its pid, its parent (the zygote's client) and its exit status.

        when_gone(worker, whose, ended)  its temp dir removed now if it is gone (``ended``:
                                     the caller reaped it), else at gone()
        gone(pid, wait)              its worker is gone (the zygote said so): removed now
                                     (``wait``: if another thread removes it, wait for that)
        wait_gone(worker, timeout)   wait for its end (killed if it lingers), then gone()
        end(idle, running)           (closing) the idle get a second to exit, the rest are
                                     killed, and their ends waited for (the zygote's own end
                                     kills them without waiting)
        close()                      (every worker is gone) remove what is left
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}

    def when_gone(self, worker: Any, whose: str, ended: bool = False) -> None:
        pid, parent, path = worker.known_pid, worker.zygote, worker.tmpdir
        if not ended and worker.exit_status is None and pid is not None and parent.alive \
                and not parent.reaped(pid):
            with self._lock:
                self._pending[pid] = _Pending(path, whose, worker)
            # (its end may have been told meanwhile)
            if parent.reaped(pid) or not parent.alive:
                self.gone(pid)
            return
        remove_tmpdir(path, whose)

    def gone(self, pid: int, wait: bool = False) -> None:
        with self._lock:
            entry = self._pending.get(pid)
            if entry is None:
                return
            mine, entry.taken = not entry.taken, True
        if not mine:
            if wait:
                entry.done.wait(60.0)
            return
        try:
            remove_tmpdir(entry.path, entry.whose)
        finally:
            with self._lock:
                self._pending.pop(pid, None)
            entry.done.set()

    def wait_gone(self, worker: Any, timeout: float) -> None:
        parent = worker.zygote
        status = parent.wait_exit(worker.pid, timeout)
        if status is None:
            worker.kill()
            status = parent.wait_exit(worker.pid, timeout)
        if status is not None:
            self.gone(worker.pid, wait=True)

    def end(self, idle: list[Any], running: list[Any]) -> None:
        deadline = time.monotonic() + 1.0
        for worker in idle:
            if worker.known_pid is not None:
                worker.zygote.wait_exit(worker.pid, max(0.0, deadline - time.monotonic()))
        with self._lock:
            held = [e.worker for e in self._pending.values()]
        live = [w for w in (*held, *running) if w.known_pid is not None and w.zygote.alive
                and w.exit_status is None and not w.zygote.reaped(w.pid)]
        for worker in live:
            worker.zygote.kill(worker.pid)
        deadline = time.monotonic() + 5.0
        for worker in live:
            worker.zygote.wait_exit(worker.pid, max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        with self._lock:
            pids = list(self._pending)
        for pid in pids:
            self.gone(pid, wait=True)
