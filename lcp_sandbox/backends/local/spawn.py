"""The spawn start path: a fresh interpreter per worker, with only what every OS has.

    Spawner (the Supervisor's in place of the zygote: start_method="spawn", the default
    off Linux)
      start(slot, init, deadline, tool)
          confinement this system cannot give ─► 503 naming it (platforms.py), unless
                                                 the host said confine="best-effort"
          a spare of the same kind (spawned ahead: interpreter up, engine imported,
          waiting for its INIT), else one spawned now; INIT held, to go out with the
          first call in one send ─► WorkerProcess (its Child as parent), slot "spawn"
          Two kinds, never mixed: unconfined spares start with the host's environment
          (parity), confined ones with the allowlisted part only (boot.py), so a
          confined worker's process never held the host's secrets.
      settle()  after the call a spare served: its replacement is spawned a moment
                later, by the spawner's thread (it would take the new worker's CPU)
      the reserve: SPARES per kind; a start that finds none doubles that kind's reserve
                (up to SPARES_MAX), spawned by the thread once its call is answered
                (settle()), so a burst of new libraries waits for a whole interpreter a
                few times, not every other call; after SHRINK_AFTER_S without a hand-out
                it is SPARES again (the extra spares killed: one wake-up, not a timer)
      close()   every child's tree killed

    Child (one per process: what WorkerProcess, the slot and the watchdog ask of a parent)
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
import time
from concurrent.futures import Future
from typing import Any, Callable, Optional

import psutil

from ... import protocol as P
from ...core.outcomes import Unavailable
from ..boot import boot_argv, boot_environment
from .output import Stream
from .platforms import refusal
from .process import WorkerProcess
from .slot import Slot

# Workers spawned ahead, per kind (unconfined, confined)
SPARES = 1
# The most a burst of new libraries grows a kind's reserve to.
SPARES_MAX = 8
# Without a hand-out for this long, a grown reserve is SPARES again.
SHRINK_AFTER_S = 60.0
# After a hand-out: its replacement does not compete with the new worker.
RESERVE_DELAY_S = 0.005
# Its second argument: "ahead" (a spare of the kind's first SPARES, which imports the
# modules tools commonly import while no call waits) or "lean" (a start a call waits for,
# or a spare of a burst's grown reserve: a burst is short of CPU, and a library imports
# what it needs anyway).
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


def _known(pid: int) -> Future[int]:
    fut: Future[int] = Future()
    fut.set_result(pid)
    return fut


class Spawner:
    """The spares and children of one Supervisor on the spawn path.  Thread-safe."""

    def __init__(self, on_exit: Callable[[int, int], None]) -> None:
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._spares: dict[bool, list[Child]] = {False: [], True: []}
        # The kinds kept in reserve (confined: once asked for)
        self._kinds = {False}
        # Spares wanted, per kind.
        self._reserve = {False: SPARES, True: SPARES}
        # The last hand-out (a grown reserve shrinks after)
        self._handed = time.monotonic()
        # Starts that found no spare of their kind.
        self.misses = 0
        self._children: dict[int, Child] = {}
        # When the thread spawns what is missing (0: not owed)
        self._due = time.monotonic()
        # A spare was handed out: settle() owes its replacement.
        self.owed = False
        self.alive = True
        self._thread = threading.Thread(target=self._run, name="lcp-sandbox-spawner", daemon=True)
        self._thread.start()

    def start(self, slot: Slot, init: P.Init, deadline: Optional[float],
              tool: str) -> WorkerProcess:
        """Start ``slot``'s worker and attach it to the slot (503: confinement this
        system cannot give; OSError: it could not be spawned)."""
        confined = init.confine is not None
        why = refusal(confined, slot.limits.network, slot.limits.confine)
        if why:
            raise Unavailable.not_run(slot.library.name, tool, why, "no_start")
        child = self._take(confined) or self._spawn(confined, ahead=False)
        conn = child.conn
        try:
            try:
                # Sent with the call: the worker wakes once.
                conn.hold(P.INIT, init)
            except P.PayloadError:
                conn.send(P.INIT, init, deadline)
        except BaseException:
            child.kill()
            raise
        child.stream = Stream(slot.library.name, slot.limits.log_bytes_per_s)
        if child.job is not None:
            child.job.limit_memory(slot.limits.memory_mb)
        proc = WorkerProcess(_known(child.pid), child, conn, init.tmpdir, "spawn")
        child.proc = proc
        slot.attach(proc, "spawn")
        return proc

    def _spawn(self, confined: bool, ahead: bool) -> Child:
        child = Child(confined, self._ended, ahead)
        with self._lock:
            if not self.alive:
                child.kill()
                raise OSError("the supervisor is closing")
            self._children[child.pid] = child
        return child

    def _ended(self, pid: int, status: int) -> None:
        with self._lock:
            child = self._children.pop(pid, None)
            if child is not None and child in self._spares[child.confined]:
                self._spares[child.confined].remove(child)
        self._on_exit(pid, status)

    def _take(self, confined: bool) -> Optional[Child]:
        with self._cond:
            self._kinds.add(confined)
            self.owed = True
            self._handed = time.monotonic()
            spares = self._spares[confined]
            while spares:
                child = spares.pop(0)
                if not child.reaped():
                    return child
            # None left: calls come faster than one spare is replaced.  A larger reserve,
            # spawned after this start's call (settle()): spawned now, beside the interpreter
            # this start waits for, they would take its CPU.
            self.misses += 1
            self._reserve[confined] = min(SPARES_MAX, 2 * self._reserve[confined])
        return None

    def settle(self) -> None:
        """Spawn what the last hand-outs used, a moment from now."""
        if self.owed:
            with self._cond:
                self.owed = False
                self._due = self._due or time.monotonic() + RESERVE_DELAY_S
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self.alive and (not self._due or self._due > time.monotonic()):
                    if self._shrink():
                        continue
                    self._cond.wait(self._wait_s())
                if not self.alive:
                    return
                self._due = 0.0
                missing = [(k, n < SPARES) for k in self._kinds
                           for n in range(len(self._spares[k]), self._reserve[k])]
            for confined, ahead in missing:
                try:
                    child = self._spawn(confined, ahead)
                except OSError:
                    continue
                with self._lock:
                    self._spares[confined].append(child)

    def _wait_s(self) -> Optional[float]:
        """(holding the lock) How long the thread may sleep: until what is owed is due, or
        until a grown reserve shrinks; None: until notified."""
        now = time.monotonic()
        waits = [self._due - now] if self._due else []
        if max(self._reserve.values()) > SPARES:
            waits.append(self._handed + SHRINK_AFTER_S - now)
        return max(0.0, min(waits)) if waits else None

    def _shrink(self) -> bool:
        """(holding the lock) After SHRINK_AFTER_S without a hand-out, a grown reserve is
        SPARES again and its extra spares are killed; True when it shrank."""
        if (max(self._reserve.values()) <= SPARES
                or time.monotonic() - self._handed < SHRINK_AFTER_S):
            return False
        for kind, spares in self._spares.items():
            self._reserve[kind] = SPARES
            while len(spares) > SPARES:
                spares.pop().kill()
        return True

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"spares": sum(len(s) for s in self._spares.values()),
                    "children": len(self._children),
                    "reserve": {"unconfined": self._reserve[False],
                                "confined": self._reserve[True]},
                    "misses": self.misses}

    def close(self, timeout: float = 5.0) -> None:
        """Kill every child's tree and stop the spawner's thread."""
        with self._cond:
            self.alive = False
            self._cond.notify()
            children = list(self._children.values())
        for child in children:
            child.kill()
        for child in children:
            child.wait_exit(child.pid, timeout)
        self._thread.join(timeout)
