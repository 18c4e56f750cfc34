"""The host's handle on the zygote (worker/zygote.py): start it, ask it to fork,
kill and signal workers, learn how they ended.

    ZygoteClient() ── python -I -c _BOOT FD ──► zygote process, allowlisted environment
    fork(sock, log) ── FORK + fds ──────► ◄── FORKED(pid)   (a Forked future: nobody waits)
    fork(sock, log, template=tpid) ── TFORK: from a library's template (templates.py);
                                      Forked.templated: whether the template served it
    template(conn) ── TEMPLATE + fd ────► ◄── FORKED(template pid)
    kill / signal(pid) ── KILL / SIGNAL ─►
    reader thread ◄── EXITED(pid, status) ── wait_exit(), on_exit(pid, status)
                  ◄── KILL_FAILED(pid, errno, ended) ── logged; a live one's: kill_refused(pid),
                                                        wait_exit() gives up

    take() ── a worker forked ahead (FORK sent when nobody waited, then PRIME: the
              host's environment and sys.path, set while nobody waits): it holds its
              socket and log pipe and waits for an INIT, so an unconfined cold start
              sends INIT and the call to it at once, with no zygote in the way (a
              confined one forks: it never holds the host's environment)
    settle() ─ after that call: the reader thread forks the replacement a moment
              later (RESERVE_DELAY_S); waking the thread earlier would take the CPU
              and the GIL from the cold start itself.  after(fn): fn runs then too
              (templates.py makes a template there, not during the call that needed it)

Records are protocol/control.py's.
"""
from __future__ import annotations

import logging
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Callable, Optional

from ...core.policy import host_environment
from ...protocol import control
from ...protocol.control import EXITED, FORKED, KILL_FAILED, ZYGOTE_READY, pack, unpack
from ...protocol.framing import Connection, pair
from ...protocol.messages import PRIME, Prime
from ..boot import boot_argv, boot_environment

# Workers forked ahead, waiting for their INIT.
RESERVED = 1
# After a take(): its replacement does not compete with the new worker.
RESERVE_DELAY_S = 0.005

log = logging.getLogger("lcp_sandbox")

# boot.py
_ENTRY = "from lcp_sandbox.worker.zygote import main; main(int(sys.argv[1]))"


class ZygoteGone(Exception):
    pass


class Forked(Future[int]):
    """The zygote's answer to a request: the pid of what it forked."""

    def __init__(self) -> None:
        super().__init__()
        # TFORK: its template's spare served it (not a plain one)
        self.templated = False


#: A worker forked ahead: (its host socket, its log pipe's read end, its pid to come).
Reserved = tuple[socket.socket, int, Forked]


class ZygoteClient:
    """The host's handle on a zygote process.  Thread-safe."""

    def __init__(self, on_exit: Optional[Callable[[int, int], None]] = None) -> None:
        host_end, zyg_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The zygote (and so the memory every worker starts from) never holds the
        # host's environment: workers get theirs in INIT, whole or filtered.  It runs
        # the host's own copy of the engine, and adds no folder to sys.path (boot.py).
        self.proc = subprocess.Popen(
            boot_argv(_ENTRY, str(zyg_end.fileno())), pass_fds=(zyg_end.fileno(),),
            stdin=subprocess.DEVNULL, env=boot_environment(), start_new_session=True)
        zyg_end.close()
        self.pid = self.proc.pid
        self._ctl = host_end
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pending: dict[int, Forked] = {}
        self._exits: dict[int, int] = {}
        # KILL_FAILED: the errno each worker's last kill was refused with
        self._refused: dict[int, int] = {}
        self._next = 0
        self._on_exit = on_exit
        self.alive = True
        self._reserved: list[Reserved] = []
        # When the reader forks one ahead (0: not owed)
        self._due = 0.0
        # A take() whose replacement settle() asks for.
        self.owed = False
        # after(): run with the replacement.
        self._after: list[Callable[[], None]] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._started = threading.Event()
        self._reader = threading.Thread(target=self._read, name="lcp-sandbox-zygote", daemon=True)
        self._reader.start()
        if not self._started.wait(60) or not self.alive:
            self.close()
            raise ZygoteGone("the zygote process did not start")
        self._owe(0.0)

    def _owe(self, delay: float = RESERVE_DELAY_S) -> None:
        self.owed = False
        self._due = self._due or time.monotonic() + delay
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _read(self) -> None:
        """The reader thread: the zygote's records; forks what is owed when it is due."""
        ctl_fd = self._ctl.fileno()
        poller = select.poll()
        poller.register(ctl_fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            due = self._due
            wait = None if not due else max(0, int((due - time.monotonic()) * 1000) + 1)
            events = poller.poll(wait)
            if due and time.monotonic() >= due:
                self._due = 0.0
                while len(self._reserved) < RESERVED and self.alive and self._reserve():
                    pass
                with self._send_lock:
                    after, self._after = self._after, []
                for fn in after:
                    fn()
            if any(fd == self._wake_r for fd, _ in events):
                try:
                    os.read(self._wake_r, 4096)
                except OSError:
                    break
            if not any(fd == ctl_fd for fd, _ in events):
                continue
            try:
                data = self._ctl.recv(control.MAX_RECORD)
            except OSError:
                data = b""
            if not data:
                break
            try:
                kind, a, b, c = unpack(data)
            except struct.error:
                continue
            self._record(kind, a, b, c)
        with self._cond:
            self.alive = False
            self._cond.notify_all()
        self._started.set()
        # They died with the zygote.
        self._drop_reserved()
        for fut in list(self._pending.values()):
            fut.set_exception(ZygoteGone("the zygote process is gone"))
        self._pending.clear()

    def _record(self, kind: int, a: int, b: int, c: int) -> None:
        if kind == ZYGOTE_READY:
            self._started.set()
        # Request, pid, from its template.
        elif kind == FORKED:
            fut = self._pending.pop(a, None)
            if fut:
                fut.templated = bool(c)
                fut.set_result(b)
        # Pid, status.
        elif kind == EXITED:
            with self._cond:
                self._exits[a] = b
                self._refused.pop(a, None)
                if len(self._exits) > 10000:
                    self._exits.pop(next(iter(self._exits)))
                self._cond.notify_all()
            if self._on_exit:
                self._on_exit(a, b)
        # Pid, errno, after it ended.
        elif kind == KILL_FAILED:
            why = os.strerror(b) if 0 < b < 4096 else f"errno {b}"
            if c:
                log.warning("worker %d ended; the processes it left could not be killed (%s) "
                            "and live on", a, why)
                return
            with self._cond:
                self._refused[a] = b
                self._cond.notify_all()
            log.warning("the zygote could not kill worker %d (%s): it lives on", a, why)

    def fork(self, sock_fd: int, log_fd: int, template: int = 0, pidns: bool = False) -> Forked:
        """Start a worker serving ``sock_fd``; the future's result is its pid.

        ``template``: the pid of a library template to fork it from (the future's
        ``templated`` says whether it was; a plain spare serves when the template is gone).
        ``pidns``: (a confined worker) pid 1 of a PID namespace of its own, when the
        zygote can make one (its ZYGOTE_READY says).
        The fds are duplicated into the zygote as this returns, so the caller may
        close its copies and talk to the worker at once, before the pid is known."""
        if template:
            return self._request(control.TFORK, [sock_fd, log_fd], template)
        return self._request(control.FORK, [sock_fd, log_fd], control.FORK_PIDNS if pidns else 0)

    def _reserve(self) -> bool:
        try:
            host_sock, worker_sock = pair()
        except OSError:
            return False
        try:
            log_r, log_w = os.pipe()
        except OSError:
            host_sock.close()
            worker_sock.close()
            return False
        try:
            fut = self.fork(worker_sock.fileno(), log_w)
            # Its environment and sys.path now, while nobody waits (a fresh process pays
            # for each putenv); only an unconfined INIT takes it (take()).
            Connection(host_sock).send(PRIME, Prime(host_environment(), list(sys.path)))
        except (ZygoteGone, OSError):
            host_sock.close()
            os.close(log_r)
            return False
        finally:
            worker_sock.close()
            os.close(log_w)
        with self._send_lock:
            self._reserved.append((host_sock, log_r, fut))
        return True

    def take(self) -> Optional[Reserved]:
        """A reserved worker, (host socket, log read end, forked future), or None.
        Its replacement is owed: call settle() once the call it serves is answered."""
        with self._send_lock:
            got = self._reserved.pop() if self._reserved and self.alive else None
        self.owed = True
        if got is not None:
            sock, log_r, fut = got
            if not fut.done() or (fut.exception() is None and fut.result() not in self._exits):
                return got
            # It died waiting (or the zygote did)
            sock.close()
            os.close(log_r)
        return None

    def after(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (on the reader thread: it must not block) once the call being
        served is answered: settle() is owed."""
        with self._send_lock:
            self._after.append(fn)
        self.owed = True

    def settle(self) -> None:
        """Fork what take() used, a moment from now (no-op when nothing is owed)."""
        if self.owed:
            self._owe()

    def template(self, conn_fd: int) -> Forked:
        """Start a template process reading its INIT from ``conn_fd``; the future's
        result is its pid."""
        return self._request(control.TEMPLATE, [conn_fd])

    def _request(self, kind: int, fds: list[int], arg: int = 0) -> Forked:
        fut = Forked()
        with self._send_lock:
            if not self.alive:
                raise ZygoteGone("the zygote process is gone")
            self._next += 1
            req = self._next
            self._pending[req] = fut
            try:
                socket.send_fds(self._ctl, [pack(kind, req, arg)], fds)
            except OSError as exc:
                self._pending.pop(req, None)
                raise ZygoteGone(f"the zygote process is gone ({exc})") from None
        return fut

    def _send(self, kind: int, pid: int, arg: int = 0) -> None:
        with self._send_lock:
            try:
                self._ctl.send(pack(kind, pid, arg))
            except OSError:
                pass

    def kill(self, pid: int) -> None:
        """Kill a worker and its whole process tree (no-op if already reaped).  Asynchronous:
        wait_exit() says it ended, kill_refused() that the kill was refused."""
        with self._cond:
            self._refused.pop(pid, None)
        self._send(control.KILL, pid)

    def kill_refused(self, pid: int) -> Optional[str]:
        """Why the zygote's last kill of ``pid`` was refused (None: it was not)."""
        code = self._refused.get(pid)
        if code is None:
            return None
        return os.strerror(code) if 0 < code < 4096 else f"errno {code}"

    def signal(self, pid: int, sig: int) -> None:
        """Send ``sig`` to a live worker (no-op if already reaped, so never a reused pid)."""
        self._send(control.SIGNAL, pid, int(sig))

    def reaped(self, pid: int) -> bool:
        """Whether the zygote said ``pid`` ended (never waits)."""
        return pid in self._exits

    def wait_exit(self, pid: int, timeout: float) -> Optional[int]:
        """The worker's Popen-style return code once the zygote reaped it; None at the
        timeout, or at once when the zygote said its kill was refused (it lives on)."""
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or pid in self._refused
                                or not self.alive, timeout)
            status = self._exits.pop(pid, None)
            if status is not None:
                self._refused.pop(pid, None)
            return status

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
        self._reader.join(timeout)
        self._drop_reserved()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def _drop_reserved(self) -> None:
        with self._send_lock:
            reserved, self._reserved = self._reserved, []
        for sock, log_r, _ in reserved:
            sock.close()
            os.close(log_r)
