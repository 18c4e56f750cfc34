"""Pid 1 of a confined worker's PID namespace: a small init beside the worker (pid 2).

    zygote ──fork (CLONE_NEWPID)──► spare = pid 1 ──fork──► pid 2: the worker-to-be
                                      │ (this module)        (adopt(), serve(), the tool)
                                      │ forwards the host's soft interrupt to pid 2
                                      │ reaps every orphan of the namespace
                                      └ when pid 2 ends: its wait status on the zygote's
                                        status pipe, then exits (the kernel kills the rest)

Why not the worker as pid 1: the kernel ignores a signal an init has no handler for when
it comes from inside its namespace, its own included, so a tool's
``os.kill(os.getpid(), SIGSEGV)`` or ``signal.raise_signal(SIGTERM)`` would do nothing,
and an init that dies by a signal cannot be re-created with that signal.  With the worker
as pid 2, signals behave as for any process, and the zygote reports the worker's own end
(read from the pipe) when it reaps this init.  No tool code ever runs here: it is a fork
of the zygote's spare, holding only the status pipe.
"""
from __future__ import annotations

import os
import signal
import struct
from typing import NoReturn

from ..protocol import SOFT_TIMEOUT_SIGNAL

# The worker's raw wait status, on the status pipe.
STATUS = struct.Struct("=i")
#: Set in the worker (pid 2): it is in a PID namespace of its own, with this init.
IN_OWN_PIDNS: list[bool] = []


def split(status_w: int) -> None:
    """(In the spare, pid 1 of its new namespace) fork the worker-to-be, which returns;
    this process becomes the namespace's init and never returns."""
    worker = os.fork()
    if worker == 0:
        os.close(status_w)
        IN_OWN_PIDNS[:] = [True]
        return
    run(worker, status_w)


def run(worker: int, status_w: int) -> NoReturn:
    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(worker, signum)
        except OSError:
            pass
    for sig in (SOFT_TIMEOUT_SIGNAL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    # Nothing of the worker's: only the status pipe.
    os.closerange(0, status_w)
    os.closerange(status_w + 1, 0x7FFFFFFF)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)
        if pid == worker:
            try:
                os.write(status_w, STATUS.pack(status))
            finally:
                os._exit(0)


def worker_status(status_r: int) -> "int | None":
    """(In the zygote, having reaped an init) the worker's wait status it wrote, or None
    (the init was killed first: its own status stands)."""
    try:
        data = os.read(status_r, STATUS.size)
    except OSError:
        data = b""
    finally:
        os.close(status_r)
    return STATUS.unpack(data)[0] if len(data) == STATUS.size else None
