"""The host's guard of processes: it decides, for workers that share one uid and have no
PID namespace nor Landlock scope of their own, each system call that names another
process (worker/confine/guard.py lists them and installs the filter).

    worker (after prepare(), before READY)         host
    guard filter, listener L ──"G" + L (SCM_RIGHTS)──► receive(): L is a seccomp listener?
    kill(self, 0) ── USER_NOTIF ──────────────────────► the guard's thread: the handshake,
                                                        from the worker's pid (the kernel's
                                                        word): L guards it; CONTINUE
    READY "processes: on (the host's guard ...)"  ───► vouched(): kept only if so, else
                                                        "unavailable (...)": 503
    a tool's kill(pid, sig)... ── USER_NOTIF ─────────► decide(): the target in the worker's
                                                        own tree? CONTINUE : EPERM

The guard trusts the worker for nothing but the descriptor: the worker's pid is the
zygote's, the caller's pid the kernel's, and the decision reads only the call's number
and its arguments' values (a pointer could change under the check; no call decided here
takes one).  A target is in the worker's tree when the chain of parents from it reaches
the worker, each parent started no later than its child (a reused pid started later),
the worker's start time the one recorded when it was guarded, and a pidfd the guard
opened of the target before the walk still names a live process after it.  A group
(kill(0), kill(-pgid), F_SETOWN to a group, priorities of a group) passes when every
process in it is in the tree; kill(-1) never does.  After deciding, the guard checks the
notification is still pending (SECCOMP_IOCTL_NOTIF_ID_VALID) and answers
SECCOMP_USER_NOTIF_FLAG_CONTINUE (Linux 5.5) or EPERM.

A template's listener (local/templates.py receives it the same way) answers for the template and
for each worker the zygote reported forking from it (Member.join(), from WorkerProcess before
its first call): a caller's tree is the first of those roots on its chain of parents; a spare
not yet a worker (re-parented to the zygote) has none, and is refused everything it names.

One thread serves every listener of the host (epoll); a listener is dropped when its
worker is reaped or when no process uses its filter any more (EPOLLHUP, Linux 5.8).
"""
from __future__ import annotations

import array
import errno
import fcntl
import logging
import os
import select
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from .... import protocol as P
from ....core.guarded_calls import GUARDED, HANDSHAKE, REPORT_START
from ....core.syscall_numbers import number

log = logging.getLogger("lcp_sandbox")
_RECV, _SEND = 0xC0502100, 0xC0182101
_ID_VALID = (0x40082102, 0x80082102)
_NOTIF = struct.Struct("<QIIiIQ6Q")
_RESP = struct.Struct("<QqiI")
_FLAG_CONTINUE = 1
_LISTENER_LINK = "anon_inode:seccomp notify"
_PRIO_PROCESS, _PRIO_PGRP = 0, 1
_IOPRIO_WHO_PROCESS, _IOPRIO_WHO_PGRP = 1, 2
_F_SETOWN = 8
_MAX_DEPTH = 4096


@dataclass
class Watch:
    """One listener, as the guard holds it: a fresh worker's, or a template's (whose
    workers, forked from it and adopted one by one, each have their own tree)."""
    fd: int
    # The process that installed it, from the zygote.
    pid: int
    # Its start time (clock ticks since boot)
    start: int
    # The handshake came from that pid.
    verified: bool = False
    # Notifications answered.
    answered: int = 0
    # Of which EPERM.
    refused: int = 0
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the roots of the trees it answers for: {pid: start time}; a caller's root is the
    #: first of them on its chain of parents (none: refused)
    roots: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.roots[self.pid] = self.start


@dataclass
class Member:
    """A worker forked from a template that holds a guard: its tree is a root of the
    template's Watch once the host knows its pid (join())."""
    watch: Watch
    pid: int = 0

    def join(self, pid: int) -> None:
        try:
            start = _stat(pid)[2]
        except OSError:
            return
        with self.watch.lock:
            self.watch.roots[pid] = start
        self.pid = pid

    def leave(self) -> None:
        with self.watch.lock:
            self.watch.roots.pop(self.pid, None)


def receive(sock: socket.socket, deadline: Optional[float], pid: int) -> Union[Watch, str]:
    """(WorkerProcess, before its READY) the worker's first byte: "G" with its listener,
    or "N" (none installed).  A Watch once the listener is checked and guarded, else why
    not.  Raises protocol.BadMessage on anything else."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    wait = None if deadline is None else max(0.0, deadline - time.monotonic())
    if not poller.poll(None if wait is None else int(wait * 1000) + 1):
        return "unavailable (the worker said nothing of the host's guard before its deadline)"
    data, fds = _recv_fds(sock)
    if data == b"N" and not fds:
        return "unavailable (the worker installed no guard)"
    if data != b"G" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        if not data:
            return "unavailable (the worker ended before it sent its guard)"
        raise P.BadMessage("it broke the protocol of the host's guard (its first byte)")
    return GUARD.watch(fds[0], pid)


def _recv_fds(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One byte and the descriptors that came with it, close-on-exec from the start
    (socket.recv_fds() drops its flags)."""
    fds = array.array("i")
    data, ancdata, _, _ = sock.recvmsg(1, socket.CMSG_LEN(2 * fds.itemsize),
                                       socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def vouched(report: dict, watch: Union[Watch, Member, str, bool, None]) -> dict:
    """The worker's READY report, its "processes" kept only if it names the host's guard
    and the host holds that worker's verified listener (or its template's, the worker one
    of its roots); else "unavailable (...)".  A listener the report does not rely on is
    let go."""
    claim = str(report.get("processes", ""))
    if not claim.startswith(REPORT_START):
        if isinstance(watch, Watch):
            GUARD.release(watch)
        return report
    if isinstance(watch, Member):
        if watch.pid and watch.pid in watch.watch.roots:
            watch = watch.watch
        else:
            watch = "the host does not know it as a worker of its template's guard"
    # (verified is enough: a worker that ended since, its listener closed, serves nothing)
    if isinstance(watch, Watch) and watch.verified:
        return report
    why = (watch if isinstance(watch, str) else
           "its listener's first call did not come from the worker itself"
           if isinstance(watch, Watch) else "the host offered none")
    return {**report, "processes": f"unavailable (the host's guard (seccomp user "
                                   f"notification) is not in force: {why})"}


def release(watch: Union[Watch, Member, str, bool, None]) -> None:
    """(WorkerProcess.reap) its listener closed, if it has one; a template's worker leaves
    the roots of its template's."""
    if isinstance(watch, Watch):
        GUARD.release(watch)
    elif isinstance(watch, Member):
        watch.leave()


def member_of(template: int) -> Optional[Member]:
    """A worker forked from template ``template`` (its pid, from the zygote): a Member of
    the template's guard, None when it holds none."""
    watch = GUARD.of(template)
    return None if watch is None else Member(watch)


class Guard:
    """The host's one thread over every worker's listener."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[int, Watch] = {}
        self._epoll: Optional[select.epoll] = None
        self._names: dict[int, str] = {}

    def watch(self, fd: int, pid: int) -> Union[Watch, str]:
        """Guard worker ``pid`` by listener ``fd`` (closed here when it is not one)."""
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            start = _stat(pid)[2]
        except OSError as exc:
            os.close(fd)
            return f"unavailable (its listener or its process cannot be read: {exc.strerror})"
        if link != _LISTENER_LINK:
            os.close(fd)
            return f"unavailable (what it sent is not a seccomp listener: {link})"
        watch = Watch(fd, pid, start)
        with self._lock:
            if self._epoll is None:
                self._start()
            assert self._epoll is not None
            self._watches[fd] = watch
            self._epoll.register(fd, select.EPOLLIN)
        return watch

    def of(self, pid: int) -> Optional[Watch]:
        """The verified listener process ``pid`` installed (a template's)."""
        with self._lock:
            found = [w for w in self._watches.values() if w.pid == pid and w.verified]
        return found[0] if found else None

    def release(self, watch: Watch) -> None:
        with self._lock:
            if watch.closed:
                return
            watch.closed = True
            self._watches.pop(watch.fd, None)
            if self._epoll is not None:
                try:
                    self._epoll.unregister(watch.fd)
                except (OSError, ValueError):
                    pass
        with watch.lock:
            os.close(watch.fd)

    def _start(self) -> None:
        machine = os.uname().machine
        for name in GUARDED:
            nr = number(name, machine)
            if nr is not None:
                self._names[nr] = name
        self._epoll = select.epoll()
        threading.Thread(target=self._serve, name="lcp-sandbox-pid-guard", daemon=True).start()

    def _serve(self) -> None:
        epoll = self._epoll
        assert epoll is not None
        while True:
            for fd, events in epoll.poll():
                with self._lock:
                    watch = self._watches.get(fd)
                if watch is None:
                    continue
                if events & select.EPOLLIN:
                    try:
                        self._answer(watch)
                    # Never the thread's end: log, go on.
                    except Exception:
                        log.exception("the host's guard of processes failed to answer")
                elif events & (select.EPOLLHUP | select.EPOLLERR):
                    self.release(watch)

    def _answer(self, watch: Watch) -> None:
        """Receive one notification of ``watch`` and answer it."""
        with watch.lock:
            # (an event of a descriptor number closed and reused since: RECV would block)
            if watch.closed or not _pending(watch.fd):
                return
            buf = bytearray(_NOTIF.size)
            try:
                fcntl.ioctl(watch.fd, _RECV, buf, True)
            except OSError:
                # ENOENT: the caller was interrupted; it asks again.
                return
            nid, caller, _, nr, _, _, *args = _NOTIF.unpack(buf)
            name = self._names.get(nr, "")
            handshake = (not watch.verified and name == HANDSHAKE and caller == watch.pid
                         and _pid(args[0]) == watch.pid and args[1] == 0)
            try:
                root = _root_of(caller, watch.roots)
                allow = handshake or root is not None and decide(name, args, caller, *root)
            except (OSError, ValueError, IndexError):
                # A process gone, or unreadable, mid-decision.
                allow = False
            if not _still_pending(watch.fd, nid):
                return
            # (verified before the answer: the worker's READY may be read the moment after)
            watch.verified = watch.verified or handshake
            if not (allow and _send(watch.fd, _RESP.pack(nid, 0, 0, _FLAG_CONTINUE))):
                # (refused, or a kernel before 5.5 that cannot let it through: EPERM)
                watch.verified = watch.verified and not handshake
                allow = False
                _send(watch.fd, _RESP.pack(nid, 0, -errno.EPERM, 0))
            watch.answered += 1
            watch.refused += not allow


GUARD = Guard()


def _pending(fd: int) -> bool:
    """A notification waits on listener ``fd`` (RECV would not block)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return any(events & select.POLLIN for _, events in poller.poll(0))


def _send(fd: int, resp: bytes) -> bool:
    """SECCOMP_IOCTL_NOTIF_SEND: whether the kernel took the answer."""
    try:
        fcntl.ioctl(fd, _SEND, bytearray(resp), True)
        return True
    except OSError:
        return False


def _still_pending(fd: int, nid: int) -> bool:
    """SECCOMP_IOCTL_NOTIF_ID_VALID: the call still waits (its caller was not interrupted)."""
    for request in _ID_VALID:
        try:
            fcntl.ioctl(fd, request, bytearray(struct.pack("<Q", nid)), True)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOTTY):
                return False
    return False


def _pid(value: int) -> int:
    """A pid_t argument: the low 32 bits, signed (what the kernel reads)."""
    low = value & 0xFFFFFFFF
    return low - (1 << 32) if low & 0x80000000 else low


# ------------------------------------------------------------ the decision
def decide(name: str, args: list[int], caller: int, root: int, root_start: int) -> bool:
    """Whether call ``name`` with ``args`` from thread ``caller`` (a process of worker
    ``root``'s tree) names only processes of that tree."""
    def tree(value: int) -> bool:
        return in_tree(_pid(value), root, root_start)

    def group(value: int) -> bool:
        return group_in_tree(_pid(value), root, root_start)

    first = _pid(args[0])
    rules: dict[str, Callable[[], bool]] = {
        "kill": lambda: (first > 0 and tree(args[0]) or first == 0 and
                         group(_stat(caller)[1]) or first < -1 and group(-first)),
        "rt_sigqueueinfo": lambda: first > 0 and tree(args[0]),
        "pidfd_open": lambda: first > 0 and tree(args[0]),
        "tkill": lambda: first > 0 and tree(args[0]),
        "tgkill": lambda: first > 0 and _pid(args[1]) > 0 and tree(args[1]),
        "rt_tgsigqueueinfo": lambda: first > 0 and _pid(args[1]) > 0 and tree(args[1]),
        "kcmp": lambda: tree(args[0]) and tree(args[1]),
        "ptrace": lambda: tree(args[1]),
        "getpriority": lambda: _who(args, _PRIO_PROCESS, _PRIO_PGRP, tree, group),
        "ioprio_get": lambda: _who(args, _IOPRIO_WHO_PROCESS, _IOPRIO_WHO_PGRP, tree, group),
        "fcntl": lambda: (_pid(args[1]) == _F_SETOWN and
                          (tree(args[2]) if _pid(args[2]) > 0 else group(-_pid(args[2])))),
    }
    rule = rules.get(name)
    if rule is not None:
        return bool(rule())
    # the calls on one pid, argument 0 (0, the caller itself, the filter allowed already)
    return bool(name) and first > 0 and tree(args[0])


def _who(args: list[int], process: int, pgrp: int, tree: Callable[[int], bool],
         group: Callable[[int], bool]) -> bool:
    """getpriority/ioprio_get: (which, who)."""
    which = _pid(args[0])
    return (which == process and tree(args[1])) or (which == pgrp and group(args[1]))


def in_tree(pid: int, root: int, root_start: int) -> bool:
    """Whether process (or thread) ``pid`` belongs to the tree of ``root`` (started at
    ``root_start``): its chain of parents reaches the root, no parent started after its
    child, and the process walked is still the one a pidfd opened before names."""
    if pid <= 0:
        return False
    try:
        tgid = _tgid(pid)
        pidfd = os.pidfd_open(tgid)
    except OSError:
        return False
    try:
        if not _chain_reaches(tgid, root, root_start):
            return False
        signal.pidfd_send_signal(pidfd, 0)
        return True
    except PermissionError:
        return True
    except OSError:
        return False
    finally:
        os.close(pidfd)


def _root_of(caller: int, roots: dict[int, int]) -> Optional[tuple[int, int]]:
    """The first of ``roots`` ({pid: start time}) on the chain of parents of thread
    ``caller``: (pid, start time), or None."""
    pid, below = _tgid(caller), None
    for _ in range(_MAX_DEPTH):
        ppid, _, start = _stat(pid)
        if below is not None and start > below:
            # A parent started after its child: a reused pid.
            return None
        if roots.get(pid) == start:
            return pid, start
        if ppid <= 1:
            return None
        pid, below = ppid, start
    return None


def _chain_reaches(pid: int, root: int, root_start: int) -> bool:
    ppid, _, start = _stat(pid)
    for _ in range(_MAX_DEPTH):
        if pid == root:
            return start == root_start
        if ppid <= 1:
            return False
        parent_ppid, _, parent_start = _stat(ppid)
        if parent_start > start:
            return False
        pid, ppid, start = ppid, parent_ppid, parent_start
    return False


def group_in_tree(pgrp: int, root: int, root_start: int) -> bool:
    """Whether process group ``pgrp`` has members and all are in ``root``'s tree."""
    if pgrp <= 0:
        return False
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if _stat(int(entry))[1] == pgrp:
                    members.append(int(entry))
            except OSError:
                continue
    return bool(members) and all(in_tree(p, root, root_start) for p in members)


def _stat(pid: int) -> tuple[int, int, int]:
    """(ppid, pgrp, start time) of ``pid`` from /proc (OSError when it is gone)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[1]), int(fields[2]), int(fields[19])


def _tgid(pid: int) -> int:
    """The process that thread ``pid`` belongs to."""
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Tgid:"):
                return int(line.split()[1])
    raise ProcessLookupError(pid)
