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

from .libc import libc
from .pidns_init import split
from .template import Spare, adopt, close_all_but, reset_signals

_CLONE_NEWPID = 0x20000000


def fork_spare(ctl: socket.socket, wake_r: int, wake_w: int, zygote_pid: int,
               own_pidns: int = -1) -> Spare:
    """Fork a worker-to-be now, so a request only has to hand it its fds.

    The child does its process setup at once and then waits for [sock, log] fds
    on a private socket; forking (about 2 ms for the zygote's address space) and
    setup are off the critical path of a cold call.  With ``own_pidns`` (the zygote's
    own PID namespace, open), the child is pid 1 of a new PID namespace: unshare()
    moves only the next child there, and setns() back to our own namespace undoes it
    for the children after it (a second unshare would fail with EINVAL)."""
    mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    moved = own_pidns >= 0 and libc.unshare(_CLONE_NEWPID) == 0
    status_r, status_w = os.pipe() if moved else (-1, -1)      # (pidns_init.py)
    pid = -1
    try:
        pid = os.fork()
    finally:
        if moved and pid != 0 and libc.setns(own_pidns, _CLONE_NEWPID) != 0:
            os._exit(70)      # every later child would share that namespace: never
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


#: (In the zygote) the status pipe of each spare or worker that is the init of a PID
#: namespace of its own, by its pid: the worker's own end is read there when it is reaped.
STATUS_PIPES: dict[int, int] = {}


def _child(ctl: socket.socket, wake_r: int, wake_w: int, inbox: socket.socket,
           zygote_pid: int, status_w: int = -1) -> None:
    os.setsid()
    from .rlimits import die_with_parent
    die_with_parent()
    if os.getppid() != (0 if status_w >= 0 else zygote_pid):   # (pid 1: its parent is
        os._exit(1)                                             # outside its namespace)
    reset_signals()
    ctl.close()
    close_all_but((inbox.fileno(), status_w) if status_w >= 0 else (inbox.fileno(),))
    if status_w >= 0:                        # pid 1 of its own namespace: the worker is pid 2
        split(status_w)
    from .rehearsal import rehearse
    try:
        rehearse()
    except Exception:
        pass                                     # only an optimization
    adopt(inbox)
