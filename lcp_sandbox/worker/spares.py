"""Spares: worker processes the zygote forks ahead, waiting for a worker's descriptors.

    fork_spare()      fork one now (a confined worker's: in a PID namespace of its own,
                      pidns_init.py) so that a request only hands it its fds
    _child()          the spare's own setup: its session, die with the zygote, every other
                      descriptor closed, a rehearsal of a worker's first session; then it
                      waits for its descriptors (template.adopt())

The zygote (zygote.py) keeps them, hands them out and reaps them; for a spare in a PID
namespace of its own it keeps the read end of its status pipe (STATUS_PIPES), where the
namespace's init writes how the worker ended.
"""
from __future__ import annotations

import os
import socket
import struct
from typing import Optional

from .libc import libc
from .pidns_init import split
from .template import Spare, adopt, close_all_but, reset_signals

_CLONE_NEWPID, _CLONE_NEWUSER = 0x20000000, 0x10000000


def fork_spare(ctl: socket.socket, wake_r: int, wake_w: int, zygote_pid: int,
               own_pidns: int = -1) -> Spare:
    """Fork a worker-to-be now, so a request only has to hand it its fds.

    The child does its process setup at once and then waits for [sock, log] fds
    on a private socket; forking (about 2 ms for the zygote's address space) and
    setup are off the critical path of a cold call.  With ``own_pidns`` (the zygote's
    own PID namespace, open), the child is pid 1 of a new PID namespace: unshare()
    moves only the next child there, and setns() back to our own namespace undoes it
    for the children after it (a second unshare would fail with EINVAL)."""
    moved = own_pidns >= 0 and libc.unshare(_CLONE_NEWPID) == 0
    if own_pidns >= 0 and not moved and not USERNS_REFUSED:
        got = _through_a_user_namespace(ctl, wake_r, wake_w, zygote_pid)
        if got is not None:
            return got
    mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # pidns_init.py
    status_r, status_w = os.pipe() if moved else (-1, -1)
    pid = -1
    try:
        pid = os.fork()
    finally:
        if moved and pid != 0 and libc.setns(own_pidns, _CLONE_NEWPID) != 0:
            # Every later child would share that namespace: never.
            os._exit(70)
    if pid == 0:
        try:
            mine.close()
            _child(ctl, wake_r, wake_w, its, zygote_pid, status_w)
        finally:
            os._exit(70)
    its.close()
    if moved:
        os.close(status_w)
        STATUS_PIPES[pid] = status_r
    return pid, mine


def _through_a_user_namespace(ctl: socket.socket, wake_r: int, wake_w: int,
                              zygote_pid: int) -> Optional[Spare]:
    """(A host without CAP_SYS_ADMIN: not root, or a container's root) the same spare, pid 1
    of a PID namespace of its own, made through a user namespace: a helper child unshares
    one, the zygote writes its id maps (the host's uid to itself; a root host, every uid to
    itself, so the worker can still become its run_as), the helper unshares the PID
    namespace, forks the spare and exits, and the spare comes back to the zygote (a
    subreaper).  The spare's capabilities hold inside its user namespace only, enough for
    its own mounts, and go with the rest (confine/privileges.py).  None when the system
    refuses a user namespace (the worker then says what is missing)."""
    if libc.unshare(0) != 0:
        # A system call filter refuses unshare itself (a default container's: Docker's
        # profile answers EPERM whatever the flags): no helper forked per spare to learn it.
        USERNS_REFUSED.append(True)
        return None
    mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    status_r, status_w = os.pipe()
    # Helper -> zygote: "unshared", then the pid.
    up_r, up_w = os.pipe()
    # Zygote -> helper: its maps are written.
    go_r, go_w = os.pipe()
    # Zygote -> spare: the helper is reaped.
    reaped_r, reaped_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        try:
            for fd in (status_r, up_r, go_w, reaped_w):
                os.close(fd)
            mine.close()
            _helper(ctl, wake_r, wake_w, its, zygote_pid, status_w, up_w, go_r, reaped_r)
        finally:
            os._exit(70)
    its.close()
    for fd in (status_w, up_w, go_r, reaped_r):
        os.close(fd)
    try:
        if os.read(up_r, 1) == b"u" and _write_maps(helper):
            os.write(go_w, b"g")
    except OSError:
        pass
    os.close(go_w)
    data = b""
    while chunk := os.read(up_r, 4):
        data += chunk
    os.close(up_r)
    os.waitpid(helper, 0)
    # (the spare is the zygote's child now: it may arm its.
    if len(data) == 4:
        # Parent-death signal)
        os.write(reaped_w, b"r")
    os.close(reaped_w)
    if len(data) != 4:
        mine.close()
        os.close(status_r)
        return None
    pid = struct.unpack("=i", data)[0]
    STATUS_PIPES[pid] = status_r
    return pid, mine


def _write_maps(pid: int) -> bool:
    """The id maps of the user namespace process ``pid`` just made (we made its parent)."""
    uid, gid = os.geteuid(), os.getegid()
    maps = ((("uid_map", "0 0 4294967295"), ("gid_map", "0 0 4294967295")) if uid == 0 else
            (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")))
    try:
        for name, text in maps:
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(text)
    except OSError:
        return False
    return True


def _helper(ctl: socket.socket, wake_r: int, wake_w: int, inbox: socket.socket,
            zygote_pid: int, status_w: int, up_w: int, go_r: int, reaped_r: int) -> None:
    if libc.unshare(_CLONE_NEWUSER) != 0:
        return
    os.write(up_w, b"u")
    if os.read(go_r, 1) != b"g" or libc.unshare(_CLONE_NEWPID) != 0:
        return
    pid = os.fork()
    # Pid 1: on once the zygote reaped the helper.  (Not at the.
    if pid == 0:
        # Helper's exit: its descriptors close before it is gone, and a.
        try:
            # Parent-death signal armed then would come at once.)
            os.close(up_w)
            os.close(go_r)
            if os.read(reaped_r, 1) != b"r":
                os._exit(1)
            os.close(reaped_r)
            _child(ctl, wake_r, wake_w, inbox, zygote_pid, status_w)
        finally:
            os._exit(70)
    os.write(up_w, struct.pack("=i", pid))


#: (In the zygote) not empty once unshare(2) was refused whatever its flags: spares are then
#: forked without a PID namespace of their own (their workers say what holds instead).
USERNS_REFUSED: list[bool] = []

#: (In the zygote) the status pipe of each spare or worker that is the init of a PID
#: namespace of its own, by its pid: the worker's own end is read there when it is reaped.
STATUS_PIPES: dict[int, int] = {}


def _child(ctl: socket.socket, wake_r: int, wake_w: int, inbox: socket.socket,
           zygote_pid: int, status_w: int = -1) -> None:
    os.setsid()
    from .rlimits import die_with_parent
    die_with_parent()
    # (pid 1: its parent is.
    if os.getppid() != (0 if status_w >= 0 else zygote_pid):
        # Outside its namespace)
        os._exit(1)
    reset_signals()
    ctl.close()
    close_all_but((inbox.fileno(), status_w) if status_w >= 0 else (inbox.fileno(),))
    # Pid 1 of its own namespace: the worker is pid 2.
    if status_w >= 0:
        split(status_w)
    from .rehearsal import rehearse
    try:
        rehearse()
    except Exception:
        # Only an optimization.
        pass
    adopt(inbox)
