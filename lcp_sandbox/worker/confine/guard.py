"""The worker's half of the host's guard of processes (backends/local/confine/pid_guard.py).

Where all tenants share one uid and neither a PID namespace of its own nor Landlock ABI 6's
scope keeps a worker's signals in its own process tree (a Kubernetes "restricted" pod on a
node before Linux 6.12), the calls that name another process go to the host, which lets
through those whose target is in the worker's own tree:

    install()    one more seccomp filter (SECCOMP_FILTER_FLAG_NEW_LISTENER, Linux 5.0)
                 answering SECCOMP_RET_USER_NOTIF for the calls of GUARDED; its listener
                 descriptor is kept here until hand_over()
    hand_over()  (worker/loop.py, after prepare(), before READY) the listener goes to the
                 host over the worker's own channel (SCM_RIGHTS, one byte "G"; "N" without
                 one), the worker closes its copy (it could answer its own calls), then
                 signals itself with kill(self, 0): the host sees that first notification
                 come from the worker's pid, which proves the listener guards this process

A confined template in a default container installs it too, before its import (worker/
template.py hands the listener over the same way): the workers forked from it inherit its
filter, and the host answers for each of them as a tree of its own.

The filter holds on every thread (SECCOMP_FILTER_FLAG_TSYNC with _ESRCH, Linux 5.7; on an
older kernel only a process of one thread installs it) and is inherited by everything the
worker starts.  Another filter's EPERM wins over the notification (seccomp's precedence),
so the allowlist still refuses what it refuses; the calls on pid 0 (the caller itself)
are allowed here without asking the host.

    kill, tkill, rt_sigqueueinfo, pidfd_open         ask the host
    tgkill, rt_tgsigqueueinfo                        ask the host
    fcntl F_SETOWN (SIGIO to a pid or a group)       ask the host (0: allowed)
    fcntl F_SETOWN_EX (its target behind a pointer)  EPERM
    getpgid, getsid, sched_get{affinity,param,scheduler,attr}, sched_rr_get_interval
                                                     pid 0 allowed, else ask the host
    getpriority, ioprio_get                          "who" 0 allowed, else ask the host
    process_vm_readv/writev, kcmp, move_pages, migrate_pages, get_robust_list, ptrace
    (refused by the allowlist unless a library lifts them)             ask the host

Not here, and why: setpriority, sched_set*, ioprio_set and prlimit64 are the caller's own
only by the allowlist's argument rules; pidfd_send_signal acts on a pidfd, which comes
from pidfd_open (guarded), from clone (its own children) or from opening /proc/<pid>
(Landlock leaves only its own /proc/self); setpgid reaches only itself and its children.
"""
from __future__ import annotations

import array
import ctypes
import functools
import os
import socket
from typing import Optional

from ...core.guarded_calls import ASK, ASK_UNLESS_SELF, ASK_UNLESS_WHO_SELF, HANDSHAKE
from ...core.guarded_calls import REPORT as REPORT
from ..libc import libc as _libc
from .seccomp import ALLOW, EPERM, Row, install_listener, number_of, rows_for

_LD, _JEQ, _RET = 0x20, 0x15, 0x06
_RET_USER_NOTIF = 0x7FC00000
_F_SETOWN, _F_SETOWN_EX = 8, 15

#: The listener, between install() and hand_over().
_LISTENER: list[int] = []
#: Whether this process installed the guard's filter (a template's workers inherit both).
_INSTALLED: list[bool] = []


def _arg(i: int) -> int:
    return 16 + 8 * i


def _if_arg(i: int, value: int, then: int, otherwise: int) -> list[Row]:
    """Argument ``i`` (low 32 bits) is ``value``: ``then``, else ``otherwise``."""
    return [(_LD, 0, 0, _arg(i)), (_JEQ, 0, 1, value), (_RET, 0, 0, then),
            (_RET, 0, 0, otherwise)]


def _blocks() -> dict[str, list[Row]]:
    """What each guarded call answers, by name."""
    notify = [(_RET, 0, 0, _RET_USER_NOTIF)]
    blocks: dict[str, list[Row]] = {name: notify for name in ASK}
    blocks.update({name: _if_arg(0, 0, ALLOW, _RET_USER_NOTIF) for name in ASK_UNLESS_SELF})
    blocks.update({name: _if_arg(1, 0, ALLOW, _RET_USER_NOTIF)
                   for name in ASK_UNLESS_WHO_SELF})
    # PTRACE_TRACEME (0) names no other process
    blocks["ptrace"] = _if_arg(0, 0, ALLOW, _RET_USER_NOTIF)
    blocks["fcntl"] = [(_LD, 0, 0, _arg(1)), (_JEQ, 0, 4, _F_SETOWN), (_LD, 0, 0, _arg(2)),
                       (_JEQ, 0, 1, 0), (_RET, 0, 0, ALLOW), (_RET, 0, 0, _RET_USER_NOTIF),
                       (_JEQ, 0, 1, _F_SETOWN_EX), (_RET, 0, 0, EPERM),
                       (_RET, 0, 0, ALLOW)]
    return blocks


@functools.lru_cache(maxsize=4)
def _program(machine: str) -> tuple[Row, ...]:
    return tuple(rows_for(machine, _blocks()))


def prebuild() -> None:
    """Build the filter now (the zygote, before it forks: shared by every worker)."""
    if os.uname().machine in ("x86_64", "aarch64"):
        _program(os.uname().machine)


def install(machine: str) -> str:
    """Install the guard's filter; "" (its listener kept for hand_over()) or why not."""
    if machine not in ("x86_64", "aarch64"):
        return f"unavailable (no filter for the {machine} architecture)"
    got = install_listener(list(_program(machine)), machine)
    if isinstance(got, str):
        return got
    _LISTENER[:] = [got]
    _INSTALLED[:] = [True]
    return ""


def installed() -> bool:
    """Whether the guard's filter is on this process (installed here or inherited)."""
    return bool(_INSTALLED)


def hand_over(channel: socket.socket) -> None:
    """Send the listener to the host (or say there is none), close it here, and make the
    handshake call the host waits for."""
    if not _LISTENER:
        channel.sendall(b"N")
        return
    fd = _LISTENER.pop()
    try:
        channel.sendmsg([b"G"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                  array.array("i", [fd]))])
    finally:
        os.close(fd)
    handshake()


def handshake() -> Optional[int]:
    """kill(its own pid, 0) through the guard: the host answers it; the errno or None."""
    rc = _libc.syscall(ctypes.c_long(number_of(HANDSHAKE, os.uname().machine)),
                       ctypes.c_long(os.getpid()), ctypes.c_long(0))
    return ctypes.get_errno() if rc < 0 else None

