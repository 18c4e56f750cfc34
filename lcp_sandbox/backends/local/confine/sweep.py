"""What a uid leaves behind, found and removed before that uid serves another tenant.

    sweep(uid, keep)   remove what ``uid`` left wherever a worker of it could leave
                       something, then look again: what remains (Left)
    look(uid, keep)    the same look, removing nothing

Where a uid can leave something, and what is done with it (docs/security.md, "What a
tenant can leave behind"):

    processes      /proc/<pid>/status: a real, effective, saved or file-system uid or gid
                   that is it: SIGKILLed through a pidfd held while its ids are read (a
                   pid reused meanwhile is not signalled), waited for; a few rounds
    files          core/shared_places.py's folders and the host's temp dir (the workers'
                   private temp dirs): what the uid owns is removed, walked by descriptors
                   (each folder opened without following a link, each entry unlinked by
                   its folder's descriptor); a folder is entered only where the uid could
                   have entered it, and of one it could not write only the folders are
                   looked at (it made no file there); what another uid owns is left, and
                   remains when it lies in a folder of the uid's (the folder stays)
    ``keep``       folders only looked in (the tenants' folder: a tenant's root is deleted
                   by Supervisor.remove_tenant, or kept on purpose by the host)
    System V IPC   /proc/sysvipc/{shm,sem,msg}: owner or creator the uid: IPC_RMID by id
                   (as root, else as the uid itself: root in a container has no
                   CAP_SYS_ADMIN)
    keyrings       /proc/key-users: a uid with keys remains (no process of the host may
                   remove another uid's keys; the system call filter refuses keyrings to
                   workers, only a library allowed dangerous calls could make one)
    sockets        /proc/net/{tcp,tcp6,udp,udp6}: a socket of the uid still there once its
                   processes are gone is held by another process: it remains

What remains is ``held`` (a process not gone yet, a file in ``keep``: look again later)
or ``stuck`` (removed and still there, or past WALK_BUDGET entries: the uid is retired,
never given again: fail closed).
"""
from __future__ import annotations

import ctypes
import errno
import os
import select
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ....core.shared_places import SHARED_WRITABLE

#: Entries one walk reads at most in the folders it walks: past it the uid is stuck.
WALK_BUDGET = 200_000
#: Rounds of SIGKILL to the uid's processes (a fork between two looks is killed next round).
KILL_ROUNDS = 5
#: How long one round waits for the processes it killed.
KILL_WAIT_S = 2.0
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_IPC_RMID = 0
_IPC_KINDS = {"shm": "-m", "sem": "-s", "msg": "-q"}


@dataclass
class Left:
    """What of a uid remains: ``held`` (look again later) and ``stuck`` (retire it)."""
    held: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.held or self.stuck)

    def why(self) -> str:
        found = [*self.stuck, *self.held]
        return "; ".join(found[:3]) + (f"; {len(found) - 3} more" if len(found) > 3 else "")


class _Budget(Exception):
    """The walk passed WALK_BUDGET entries."""


def places() -> list[str]:
    """The folders every uid may write (core/shared_places.py) and the host's temp dir,
    each once, as the host resolves them (/var/lock is a link to /run/lock)."""
    found: list[str] = []
    for path in (*SHARED_WRITABLE, tempfile.gettempdir()):
        real = os.path.realpath(path)
        if real not in found and os.path.isdir(real):
            found.append(real)
    return found


def sweep(uid: int, keep: Iterable[str] = ()) -> Left:
    """Remove what ``uid`` left (its processes first: nothing of it runs while the rest
    goes), then look again: what remains."""
    _kill(uid)
    _remove_ipc(uid)
    budget = [WALK_BUDGET]
    try:
        for place in places():
            _walk(place, uid, True, budget, _kept(keep))
    except _Budget:
        # (look() says so)
        pass
    return look(uid, keep)


def look(uid: int, keep: Iterable[str] = ()) -> Left:
    """What of ``uid`` there is, removing nothing."""
    left = Left()
    left.held += _processes(uid)
    left.stuck += _ipc_of(uid) + _keys_of(uid) + _sockets_of(uid)
    budget = [WALK_BUDGET]
    kept = _kept(keep)
    try:
        for place in places():
            left.stuck += _walk(place, uid, False, budget, kept)
        for place in keep:
            left.held += _walk(os.path.realpath(place), uid, False, budget, set(), True)
    except _Budget:
        left.stuck.append(f"the walk passed {WALK_BUDGET} entries")
    return left


# ---------------------------------------------------------------- processes
def _ids(pid: int) -> Optional[tuple[set[int], bool]]:
    """(the uids and gids of ``pid``, whether it is a zombie); None: it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read(8192)
    except OSError:
        return None
    ids: set[int] = set()
    zombie = False
    for line in text.split(b"\n"):
        if line.startswith((b"Uid:", b"Gid:")):
            ids.update(int(v) for v in line.split()[1:])
        elif line.startswith(b"State:"):
            zombie = b"Z" in line.split()[1:2]
    return ids, zombie


def _pids_of(uid: int) -> list[int]:
    """The live processes (not zombies) with ``uid`` among their uids or gids."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            got = _ids(int(entry.name))
            if got is not None and uid in got[0] and not got[1]:
                found.append(int(entry.name))
    return found


def _kill(uid: int) -> list[str]:
    """SIGKILL every process of ``uid``, a few rounds; the pids still there."""
    for _ in range(KILL_ROUNDS):
        pids = _pids_of(uid)
        if not pids:
            return []
        fds = []
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            got = _ids(pid)
            # (the pidfd holds the pid: the ids read now are of the process it names)
            if got is not None and uid in got[0]:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except OSError:
                    pass
            fds.append(fd)
        _wait_readable(fds, KILL_WAIT_S)
    return _processes(uid)


def _processes(uid: int) -> list[str]:
    return [f"process {pid} runs as it" for pid in _pids_of(uid)]


def _wait_readable(fds: list[int], timeout: float) -> None:
    """Wait (at most ``timeout``) for every pidfd to say its process ended; close them."""
    deadline = time.monotonic() + timeout
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        waiting = set(fds)
        while waiting:
            rest = deadline - time.monotonic()
            if rest <= 0:
                break
            for fd, _ in poller.poll(rest * 1000):
                waiting.discard(fd)
                poller.unregister(fd)
    finally:
        for fd in fds:
            os.close(fd)


# ---------------------------------------------------------------- files
def _kept(keep: Iterable[str]) -> set[tuple[int, int]]:
    """(device, inode) of the folders in ``keep``: a walk of a shared place skips them (a
    tenants' folder in /tmp is the host's, looked at on its own)."""
    found = set()
    for path in keep:
        try:
            st = os.stat(path)
        except OSError:
            continue
        found.add((st.st_dev, st.st_ino))
    return found


def _walk(place: str, uid: int, remove: bool, budget: list[int],
          kept: set[tuple[int, int]], every_file: bool = False) -> list[str]:
    """What ``uid`` owns (or its gid, the same number) under ``place``, but in ``kept``:
    with ``remove``, what it owns is removed first, and the list says what could not be.
    ``every_file``: files in folders the uid could not write are looked at too."""
    try:
        fd = os.open(place, _DIR)
    except OSError:
        return []
    try:
        return _clear(fd, place, _Walk(uid, remove, budget, kept, every_file), os.fstat(fd))
    finally:
        os.close(fd)


@dataclass
class _Walk:
    """What one walk looks for, and its budget (entries left)."""
    uid: int
    remove: bool
    budget: list[int]
    kept: set[tuple[int, int]]
    every_file: bool


def _clear(dfd: int, where: str, walk: _Walk, folder: os.stat_result) -> list[str]:
    """_walk() of the folder ``dfd`` (``folder``: its stat).  In a folder the uid could
    not write, only folders are looked at (the uid could have made no file there; a
    folder deeper may be one it could write)."""
    left: list[str] = []
    its_own = folder.st_uid == walk.uid
    writable = walk.every_file or _writable(folder, walk.uid)
    try:
        entries = list(os.scandir(dfd))
    except OSError:
        return left
    for entry in entries:
        walk.budget[0] -= 1
        if walk.budget[0] < 0:
            raise _Budget()
        if not writable and not entry.is_dir(follow_symlinks=False):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in walk.kept:
            left += _entry(dfd, entry.name, st, os.path.join(where, entry.name), walk, its_own)
    return left


def _entry(dfd: int, name: str, st: os.stat_result, path: str, walk: _Walk,
           its_own: bool) -> list[str]:
    """One entry of a folder walked: what of the uid's stays there."""
    uid, remove = walk.uid, walk.remove
    mine = st.st_uid == uid
    if not stat.S_ISDIR(st.st_mode):
        if mine and remove and _unlink(dfd, name):
            return []
        return [f"{path} is its"] if mine or st.st_gid == uid else []
    inside = _enter(dfd, name, st, path, walk) if _enterable(st, uid) else []
    if mine:
        if remove and not inside and _rmdir(dfd, name):
            return []
        return [*inside, f"{path} is its"]
    if remove and its_own and st.st_uid == 0 and not inside and _rmdir(dfd, name):
        # an empty folder of root's in one of the uid's folders (a fresh worker's own
        # root's mount point, ".root", made before it took its uid): it holds nothing
        return []
    return [*inside, *([f"{path} is its group's"] if st.st_gid == uid else [])]


def _enter(dfd: int, name: str, st: os.stat_result, path: str, walk: _Walk) -> list[str]:
    """_clear() of the folder ``name`` of ``dfd``, opened without following a link and
    only if it is still the folder ``st`` describes."""
    try:
        sub = os.open(name, _DIR, dir_fd=dfd)
    except OSError:
        return []
    try:
        now = os.fstat(sub)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return []
        return _clear(sub, path, walk, now)
    finally:
        os.close(sub)


def _writable(st: os.stat_result, uid: int) -> bool:
    """Whether a process of ``uid`` (no capabilities) could add to this folder."""
    mode = st.st_mode
    return bool(st.st_uid == uid or mode & stat.S_IWOTH and mode & stat.S_IXOTH or
                st.st_gid == uid and mode & stat.S_IWGRP and mode & stat.S_IXGRP)


def _enterable(st: os.stat_result, uid: int) -> bool:
    """Whether a process of ``uid`` (no capabilities) could have entered this folder."""
    mode = st.st_mode
    return bool(st.st_uid == uid or mode & stat.S_IXOTH or
                (st.st_gid == uid and mode & stat.S_IXGRP))


def _unlink(dfd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=dfd)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _rmdir(dfd: int, name: str) -> bool:
    try:
        os.rmdir(name, dir_fd=dfd)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


# ---------------------------------------------------------------- System V IPC
def _ipc_table(kind: str) -> list[dict[str, str]]:
    """The rows of /proc/sysvipc/<kind> as {column: value}."""
    try:
        with open(f"/proc/sysvipc/{kind}", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    if not lines:
        return []
    head = lines[0].split()
    return [dict(zip(head, line.split(), strict=False)) for line in lines[1:] if line.strip()]


def _ipc_ids(uid: int) -> dict[str, list[int]]:
    """{kind: ids} of the System V objects ``uid`` owns or created."""
    found: dict[str, list[int]] = {}
    for kind in _IPC_KINDS:
        id_column = {"shm": "shmid", "sem": "semid", "msg": "msqid"}[kind]
        for row in _ipc_table(kind):
            owners = {row.get(k) for k in ("uid", "gid", "cuid", "cgid")}
            if str(uid) in owners and row.get(id_column, "").isdigit():
                found.setdefault(kind, []).append(int(row[id_column]))
    return found


def _ipc_of(uid: int) -> list[str]:
    return [f"System V {kind} {i} is its" for kind, ids in _ipc_ids(uid).items() for i in ids]


def _remove_ipc(uid: int) -> None:
    """IPC_RMID of each object of ``uid``: as root, else (EPERM: no CAP_SYS_ADMIN, as root
    in a container) by ipcrm run as the uid itself, which owns them."""
    libc = ctypes.CDLL(None, use_errno=True)
    calls = {"shm": lambda i: libc.shmctl(i, _IPC_RMID, None),
             "sem": lambda i: libc.semctl(i, 0, _IPC_RMID),
             "msg": lambda i: libc.msgctl(i, _IPC_RMID, None)}
    refused: list[str] = []
    for kind, ids in _ipc_ids(uid).items():
        for i in ids:
            if calls[kind](i) != 0 and ctypes.get_errno() == errno.EPERM:
                refused += [_IPC_KINDS[kind], str(i)]
    if refused:
        try:
            subprocess.run(["ipcrm", *refused], user=uid, group=uid, extra_groups=[],
                           capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            pass


# ---------------------------------------------------------------- keys, sockets
def _keys_of(uid: int) -> list[str]:
    """/proc/key-users: ``uid`` holds keys (its user keyrings outlive its processes)."""
    try:
        with open("/proc/key-users", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        who, _, rest = line.partition(":")
        if who.strip() == str(uid):
            nkeys = rest.split()[1].split("/")[0] if len(rest.split()) > 1 else "0"
            if nkeys != "0":
                return [f"{nkeys} kernel keys are its (/proc/key-users)"]
    return []


def _sockets_of(uid: int) -> list[str]:
    """Sockets of ``uid`` in this network namespace's TCP and UDP tables (the uid column;
    a socket in TIME_WAIT has none)."""
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/net/{table}", encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[7] == str(uid) and cols[9] != "0":
                found.append(f"a {table} socket ({cols[1]}) is its")
    return found
