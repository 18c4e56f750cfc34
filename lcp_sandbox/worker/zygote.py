"""The zygote: a lean, pre-started process that forks workers on request.

Forking the host would copy a big, multi-threaded process; starting a fresh
interpreter per library costs tens of milliseconds.  The zygote is started
once (a fresh interpreter), imports the engine, freezes its heap
(``gc.freeze()``, so children do not dirty inherited pages) and then only
forks.  It is the parent of every worker, so it is also the one that reaps
them, reports how they ended, and kills process trees.

    host (host/zygote.py)               zygote process (here)          worker
      FORK(req) + [sock, log fds] ──►  hand them to the spare ─────────► (forked earlier: setsid,
      ◄── FORKED(req, pid)             fork the next spare               die-with-parent) fds 1,2
                                                                         -> log pipe, serve()
      KILL(pid) ─────────────────────►  kill the worker's tree
      ◄── EXITED(pid, status)           SIGCHLD: reap; kill orphans left behind
      EOF (host gone or closing) ────►  kill every worker, exit

The control channel speaks protocol/control.py: fixed-size records on an
AF_UNIX SOCK_SEQPACKET pair, never pickled; workers are forked from the
zygote but never hold its channel.  This module is the zygote process: it
imports only what workers need (worker/, protocol/, core/), never the host.

The zygote is started as ``python -I``: no CWD, no PYTHONPATH, no user
site-packages on its ``sys.path``, and only an allowlisted environment.  The zygote is a
subreaper, so processes a tool started and orphaned come back to it and are
killed when their worker is gone.
"""
from __future__ import annotations

import gc
import os
import signal
import socket
import sys

from ..proc import children, process_tree, status_from_wait
from ..protocol.control import EXITED, FORK, FORKED, KILL, MAX_RECORD as _MAXMSG, READY, SIGNAL
from ..protocol.control import pack as _pack, unpack as _unpack


def _kill_tree(pid: int) -> None:
    kids = process_tree(pid)[1:]             # taken first: killing re-parents them
    try:
        os.killpg(pid, signal.SIGKILL)       # the worker leads its own process group
    except OSError:
        pass
    for k in kids:
        try:
            os.kill(k, signal.SIGKILL)
        except OSError:
            pass


def _reap(ctl: socket.socket, workers: set) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in workers:
            workers.discard(pid)
            code = status_from_wait(status)
            _kill_tree(pid)                  # its group may outlive it
            try:
                ctl.send(_pack(EXITED, pid, code))
            except OSError:
                pass
        _kill_orphans(workers)


def _kill_orphans(workers: set) -> None:
    # Any child of ours that is not a worker is a tool's orphan (we are a subreaper);
    # it is spared while it is still in a live worker's session.
    kids = children(os.getpid())
    for pid in kids:
        try:
            owner = os.getsid(pid)          # a worker leads its own session
        except OSError:
            owner = None
        if pid not in workers and owner not in workers:
            _kill_tree(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _spare(ctl: socket.socket, wake_r: int, wake_w: int, zygote_pid: int) -> tuple[int, socket.socket]:
    """Fork a worker-to-be now, so a request only has to hand it its fds.

    The child does its process setup at once and then waits for [sock, log] fds
    on a private socket; forking (about 2 ms for the zygote's address space) and
    setup are off the critical path of a cold call."""
    mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            mine.close()
            _child(ctl, wake_r, wake_w, its, zygote_pid)
        finally:
            os._exit(70)
    its.close()
    return pid, mine


def _child(ctl: socket.socket, wake_r: int, wake_w: int, inbox: socket.socket, zygote_pid: int) -> None:
    os.setsid()
    from .rlimits import die_with_parent
    die_with_parent()
    if os.getppid() != zygote_pid:
        os._exit(1)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    ctl.close()
    os.close(wake_r)
    os.close(wake_w)
    from .loop import rehearse
    try:
        rehearse()
    except Exception:
        pass                                     # only an optimization
    try:
        data, fds, _, _ = socket.recv_fds(inbox, 16, 2)
    except OSError:
        os._exit(0)
    if not data or len(fds) != 2:
        os._exit(0)                              # the zygote is gone or closing
    inbox.close()
    sock_fd, log_fd = fds
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    try:
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
    except Exception:
        pass
    from .loop import serve
    serve(socket.socket(fileno=sock_fd))


def main(fd: int) -> None:
    """Entry point of the zygote process (``python -I -c`` host/zygote.py's boot line)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .rlimits import become_subreaper
    become_subreaper()
    ctl = socket.socket(fileno=fd)
    # What every worker needs, imported once here and shared copy-on-write.
    import ctypes, inspect, importlib.util, json, pathlib, re, sqlite3, threading, traceback, typing  # noqa
    import msgpack  # noqa
    from . import loop, proxies, rlimits  # noqa
    from .confine import landlock, mounts, network, privileges, seccomp  # noqa
    from .. import protocol  # noqa
    from ..core import normalize, policy  # noqa
    import tempfile, fcntl, struct  # noqa
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    workers: set[int] = set()
    me = os.getpid()
    gc.collect()
    gc.freeze()
    spare_pid, spare_inbox = _spare(ctl, wake_r, wake_w, me)
    workers.add(spare_pid)
    ctl.send(_pack(READY, me))

    import select
    poller = select.poll()
    poller.register(ctl.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        for efd, _ in events:
            if efd == wake_r:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                _reap(ctl, workers)
                continue
            try:
                data, fds, _, _ = socket.recv_fds(ctl, _MAXMSG, 4)
            except OSError:
                data, fds = b"", []
            if not data:
                for pid in list(workers):
                    _kill_tree(pid)
                _kill_orphans(set())
                os._exit(0)
            try:
                msg = _unpack(data)
            except struct.error:
                msg = (0, 0, 0, 0)
            if msg[0] == FORK:
                # Hand the fds to the spare; if it died, fork one on the spot.
                try:
                    socket.send_fds(spare_inbox, [b"go"], fds)
                    pid = spare_pid
                except OSError:
                    spare_inbox.close()
                    pid, inbox = _spare(ctl, wake_r, wake_w, me)
                    workers.add(pid)
                    socket.send_fds(inbox, [b"go"], fds)
                    inbox.close()
                else:
                    spare_inbox.close()
                for f in fds:
                    os.close(f)
                ctl.send(_pack(FORKED, msg[1], pid))
                spare_pid, spare_inbox = _spare(ctl, wake_r, wake_w, me)   # for the next one
                workers.add(spare_pid)
            elif msg[0] == KILL:
                if msg[1] in workers:        # never signal a pid we already reaped
                    _kill_tree(msg[1])
            elif msg[0] == SIGNAL:
                if msg[1] in workers:
                    try:
                        os.kill(msg[1], msg[2])
                    except OSError:
                        pass
            for extra in fds if msg[0] != FORK else ():
                os.close(extra)

