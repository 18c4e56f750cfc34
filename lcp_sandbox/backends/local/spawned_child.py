"""One spawned process of the spawn start path: what a worker's parent is, off the zygote.

    Child (one per process: what WorkerProcess, the slot and the watchdog ask of a parent)
      up()      (a spare) whether it said BOOTED, its first byte on the channel; anything
                else, or its end, and it is killed, never handed out (spawn.py)
      signal()  the soft interrupt: a control record on its stdin, the number of the call
                to interrupt (worker/spawned.py: a thread raises it in the tool's thread)
      kill()    its tree: psutil's descendants, its process group (POSIX), its Job
                Object (Windows); its control pipe closed
      its threads: output (its log pipe to logging, rate-limited as output.py does) and
                its waiter (at its end its process group is killed before it is reaped,
                so neither an orphan of it nor a reused pid is left; then on_exit)

A worker's channel is a socketpair end: inherited through ``pass_fds`` on POSIX
(macOS too); on Windows its ``socket.share()`` bytes go first on the control pipe
(written to the documented API, untested on this project's machines).  Host death:
the control pipe's only writer is the host, so a host killed by SIGKILL closes it and
every worker kills its own tree (worker/spawned.py).
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import Any, Callable, Optional

import psutil

from ... import protocol as P
from ..boot import boot_argv, boot_environment
from .output import Stream
from .process import WorkerProcess

# Its second argument: "ahead" (a spare of the kind's first SPARES, which imports the
# modules tools commonly import while no call waits) or "lean" (a spare a start waits for,
# or one of a burst's grown reserve: a burst is short of CPU, and a library imports what
# it needs anyway).
_ENTRY = "from lcp_sandbox.worker.spawned import main; main(*sys.argv[1].split())"
_POSIX = os.name == "posix"
# worker/spawned.py's CONTROL record: the call's number, little-endian.
CONTROL_SIZE = 4


def kill_tree(pid: int) -> Optional[str]:
    """Kill ``pid``, its descendants and (POSIX) its process group; why a kill was
    refused (EPERM: no CAP_KILL over their uid), None when none was."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        kids = []
    refused: Optional[str] = None
    if _POSIX:
        try:
            # It leads its own group.
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except OSError as exc:
            refused = exc.strerror
    for proc in kids:
        try:
            proc.kill()
        except psutil.AccessDenied:
            refused = refused or "Operation not permitted"
        except psutil.Error:
            pass
    try:
        os.kill(pid, signal.SIGKILL if _POSIX else signal.SIGTERM)
    except ProcessLookupError:
        pass
    except OSError as exc:
        refused = refused or exc.strerror
    return refused


class Child:
    """One spawned process: its channel, its control pipe, its output and its end."""

    def __init__(self, confined: bool, on_exit: Callable[[int, int], None], ahead: bool) -> None:
        host_sock, its_sock = P.portable_pair()
        self.confined = confined
        self.alive = True
        # kill(): why the last one was refused.
        self.refused: Optional[str] = None
        # The worker it became.
        self.proc: Optional[WorkerProcess] = None
        # Its output until it is handed out.
        self.stream = Stream("spare", 64 * 1024)
        self.status: Optional[int] = None
        # Its BOOTED byte was read.
        self.booted = False
        # Windows: its Job Object (winjob.py)
        self.job: Any = None
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._on_exit = on_exit
        try:
            self.popen = subprocess.Popen(
                boot_argv(_ENTRY, (str(its_sock.fileno()) if _POSIX else "share")
                          + (" ahead" if ahead else " lean")),
                pass_fds=(its_sock.fileno(),) if _POSIX else (), env=boot_environment()
                if confined else dict(os.environ), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=_POSIX,
                creationflags=getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0))
            # Untested on these machines.
            if not _POSIX:
                from .winjob import share_socket
                self.job = share_socket(self.popen, its_sock)
        except BaseException:
            host_sock.close()
            raise
        finally:
            its_sock.close()
        self.pid = self.popen.pid
        self.conn = P.PortableConnection(host_sock)
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self._control = self.popen.stdin.fileno()
        self._output = threading.Thread(target=self._pump, name=f"lcp-sandbox-output-{self.pid}",
                                        daemon=True)
        self._output.start()
        threading.Thread(target=self._wait, name=f"lcp-sandbox-waiter-{self.pid}",
                         daemon=True).start()

    # ------------------------------------------------------------ what a parent does
    def signal(self, pid: int, sig: int) -> None:
        """Interrupt the call in flight, as its soft timeout would."""
        proc = self.proc
        if proc is None or self.status is not None:
            return
        # The worker's number of that call.
        seq = (proc.calls + 1) & 0xFFFFFFFF
        try:
            os.write(self._control, seq.to_bytes(CONTROL_SIZE, "little"))
        except OSError:
            pass

    def kill(self, pid: int = 0) -> None:
        """Kill its whole tree (no-op once it was reaped: never a reused pid)."""
        with self._lock:
            if self.status is None:
                if self.job is not None:
                    self.job.kill()
                self.refused = kill_tree(self.pid)
        self._close_control()

    def kill_refused(self, pid: int = 0) -> Optional[str]:
        """Why its last kill was refused (None: it was not, or it ended since)."""
        return None if self._ended.is_set() else self.refused

    def reaped(self, pid: int = 0) -> bool:
        return self._ended.is_set()

    def wait_exit(self, pid: int, timeout: float) -> Optional[int]:
        """Its Popen-style return code once it was reaped (None: not within ``timeout``)."""
        self._ended.wait(timeout)
        return self.status

    def up(self) -> Optional[bool]:
        """(a spare, under the spawner's lock) True once it said BOOTED; None: it ended or
        sent anything else (then it is killed), never to be handed out."""
        if not self.booted:
            try:
                said = self.conn.sock.recv(len(P.BOOTED))
            except BlockingIOError:
                return False
            except OSError:
                said = b""
            if said != P.BOOTED:
                self.kill()
                return None
            self.booted = True
        return True

    # ------------------------------------------------------------ its threads
    def _pump(self) -> None:
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                break
            self.stream.feed(data)
        self.stream.close()
        self.popen.stdout.close()

    def _wait(self) -> None:
        # Ended, not reaped yet: its group's pid is still its own.
        if hasattr(os, "waitid"):
            try:
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
            except OSError:
                pass
            with self._lock:
                try:
                    # What its tools left behind.
                    os.killpg(self.pid, signal.SIGKILL)
                except OSError:
                    pass
        status = self.popen.wait()
        # What it printed last is logged before its end is told.
        self._output.join(1.0)
        with self._lock:
            self.status = status
        self._close_control()
        if self.job is not None:
            self.job.close()
        self._ended.set()
        self._on_exit(self.pid, status)

    def _close_control(self) -> None:
        try:
            assert self.popen.stdin is not None
            self.popen.stdin.close()
        except (OSError, ValueError):
            pass
