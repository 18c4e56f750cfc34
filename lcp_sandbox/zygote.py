"""The zygote: a lean, pre-started process that forks workers on request.

Forking the host would copy a big, multi-threaded process; starting a fresh
interpreter per library costs tens of milliseconds.  The zygote is started
once (a fresh interpreter), imports the engine, freezes its heap
(``gc.freeze()``, so children do not dirty inherited pages) and then only
forks.  It is the parent of every worker, so it is also the one that reaps
them, reports how they ended, and kills process trees.

    host (Zygote)                       zygote process                 worker
      FORK(req) + [sock, log fds] ──►  hand them to the spare ─────────► (forked earlier: setsid,
      ◄── FORKED(req, pid)             fork the next spare               die-with-parent) fds 1,2
                                                                         -> log pipe, serve()
      KILL(pid) ─────────────────────►  kill the worker's tree
      ◄── EXITED(pid, status)           SIGCHLD: reap; kill orphans left behind
      EOF (host gone or closing) ────►  kill every worker, exit

The control channel is an AF_UNIX SOCK_SEQPACKET pair: one message per
datagram, file descriptors travel with SCM_RIGHTS.  This is a second, tiny
protocol of fixed-size records (a kind byte and three integers), never
pickled: workers are forked from the zygote but never hold its channel.

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
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Optional

FORK, KILL, SIGNAL, FORKED, EXITED, READY = 1, 2, 3, 4, 5, 6
_REC = struct.Struct("!Bqqq")      # kind, then up to three integers
_MAXMSG = 64


def _pack(kind: int, a: int = 0, b: int = 0, c: int = 0) -> bytes:
    return _REC.pack(kind, a, b, c)


def _unpack(data: bytes) -> tuple:
    return _REC.unpack(data)


# ---------------------------------------------------------------- zygote side
def _kill_tree(pid: int) -> None:
    from .limits import process_tree
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
            from .limits import status_from_wait
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
    from .limits import children
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
    from .limits import die_with_parent
    die_with_parent()
    if os.getppid() != zygote_pid:
        os._exit(1)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    ctl.close()
    os.close(wake_r)
    os.close(wake_w)
    from .worker import rehearse
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
    from .worker import serve
    serve(socket.socket(fileno=sock_fd))


def main(fd: int) -> None:
    """Entry point of the zygote process (``python -m lcp_sandbox.zygote FD``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .limits import become_subreaper
    become_subreaper()
    ctl = socket.socket(fileno=fd)
    # What every worker needs, imported once here and shared copy-on-write.
    import ctypes, inspect, importlib.util, json, pathlib, re, sqlite3, threading, traceback, typing  # noqa
    import msgpack  # noqa
    from . import confine, worker, normalize, proxies, protocol  # noqa
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


# ------------------------------------------------------------------ host side
_BOOT = ("import sys, importlib.util\n"
         "if importlib.util.find_spec('lcp_sandbox') is None: sys.path.append(sys.argv[2])\n"
         "from lcp_sandbox.zygote import main; main(int(sys.argv[1]))")


class ZygoteGone(Exception):
    pass


class Zygote:
    """The host's handle on a zygote process.  Thread-safe."""

    def __init__(self, on_exit: Optional[Callable[[int, int], None]] = None) -> None:
        host_end, zyg_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The zygote (and so the memory every worker starts from) never holds the
        # host's environment: workers get theirs in INIT, whole or filtered.
        from .confine import allowed_environment
        env = allowed_environment(dict(os.environ))
        env.update({k: os.environ[k] for k in ("LD_LIBRARY_PATH", "PYTHONHOME") if k in os.environ})
        # -I: neither the host's CWD nor PYTHONPATH nor user site-packages on sys.path.  The
        # package's own folder is appended only when the installation does not provide it.
        pkg_parent = str(Path(__file__).resolve().parent.parent)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOT, str(zyg_end.fileno()), pkg_parent],
            pass_fds=(zyg_end.fileno(),), stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        zyg_end.close()
        self.pid = self.proc.pid
        self._ctl = host_end
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pending: dict[int, Future] = {}
        self._exits: dict[int, int] = {}
        self._next = 0
        self._on_exit = on_exit
        self.alive = True
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, name="lcp-sandbox-zygote", daemon=True)
        self._reader.start()
        if not self._ready.wait(60) or not self.alive:
            self.close()
            raise ZygoteGone("the zygote process did not start")

    def _read(self) -> None:
        while True:
            try:
                data = self._ctl.recv(_MAXMSG)
            except OSError:
                data = b""
            if not data:
                break
            try:
                msg = _unpack(data)
            except struct.error:
                continue
            if msg[0] == READY:
                self._ready.set()
            elif msg[0] == FORKED:
                fut = self._pending.pop(msg[1], None)
                if fut:
                    fut.set_result(msg[2])
            elif msg[0] == EXITED:
                with self._cond:
                    self._exits[msg[1]] = msg[2]
                    if len(self._exits) > 10000:
                        self._exits.pop(next(iter(self._exits)))
                    self._cond.notify_all()
                if self._on_exit:
                    self._on_exit(msg[1], msg[2])
        with self._cond:
            self.alive = False
            self._cond.notify_all()
        self._ready.set()
        for fut in list(self._pending.values()):
            fut.set_exception(ZygoteGone("the zygote process is gone"))
        self._pending.clear()

    def fork(self, sock_fd: int, log_fd: int) -> Future:
        """Start a worker serving ``sock_fd``; the future's result is its pid.

        The fds are duplicated into the zygote as this returns, so the caller may
        close its copies and talk to the worker at once, before the pid is known."""
        fut: Future = Future()
        with self._send_lock:
            if not self.alive:
                raise ZygoteGone("the zygote process is gone")
            self._next += 1
            req = self._next
            self._pending[req] = fut
            try:
                socket.send_fds(self._ctl, [_pack(FORK, req)], [sock_fd, log_fd])
            except OSError as exc:
                self._pending.pop(req, None)
                raise ZygoteGone(f"the zygote process is gone ({exc})") from None
        return fut

    def _send(self, msg: tuple) -> None:
        with self._send_lock:
            try:
                self._ctl.send(_pack(*msg))
            except OSError:
                pass

    def kill(self, pid: int) -> None:
        """Kill a worker and its whole process tree (no-op if already reaped)."""
        self._send((KILL, pid))

    def signal(self, pid: int, sig: int) -> None:
        """Send ``sig`` to a live worker (no-op if already reaped, so never a reused pid)."""
        self._send((SIGNAL, pid, int(sig)))

    def wait_exit(self, pid: int, timeout: float) -> Optional[int]:
        """The worker's Popen-style return code once the zygote reaped it."""
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or not self.alive, timeout)
            return self._exits.pop(pid, None)

    def close(self, timeout: float = 5.0) -> None:
        """Kill every worker and stop the zygote."""
        try:
            self._ctl.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._ctl.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
