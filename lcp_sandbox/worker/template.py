"""A library template: a process that imported one library, and forks its workers.

    zygote ──fork──► main(chan, conn)           setsid, die-with-zygote, every other fd closed
        conn ◄── INIT from the host (files, sys.path, the workers' environment and network;
                 nothing of a tenant: no configuration, no workspace, no handlers)
        environment; own network namespace if its workers have no network; CWD "/"
        confined (INIT.confine: the tenants' folder as its root, a temp-dir parent as its
                 temp dir): all of confine.prepare() but the limits, before the import:
                 Landlock's first layer, its workers' uid, no capabilities, seccomp; its
                 workers then stack their own layer (confine._stack).  No files: a "base",
                 confined and importing nothing (its workers import after their layer)
        import each file as sys.modules[PERSISTENT_PREFIX + stem]: no init_tools_library, no tool
        checks: a Python thread, a child process, a native thread (OpenBLAS's pool excepted),
                a descriptor or a shared writable mapping left by the import ─► refused
        per-tenant (INIT.confine["handoff"]): CAP_SETUID/SETGID kept behind a key, which
                 goes to the zygote on chan ("K" + key) before the import (confine/handoff.py)
        conn ──► READY({"template": "ok" | "refused: why"}); refused: exit
        then only:  chan "S" (the zygote wants a spare) ─► _spare()

    _spare():  template ─fork─► intermediate ─fork─► spare;  the intermediate exits at once,
               so the spare is re-parented to the zygote (a subreaper): the zygote reaps it,
               kills it and reports its end, exactly as for a plain worker.
    spare:     makes a socketpair (inbox, theirs) and sends ``theirs`` to the zygote over
               chan; the zygote learns its pid from SCM_CREDENTIALS (the kernel's word, not
               the template's).  Then it closes every descriptor but ``inbox`` (the template's
               channel included), reseeds, and waits.  The zygote sends the worker's [sock,
               log] into ``inbox`` (with the template's key, if it has one); from there on it
               is a worker like any other (adopt()).

The template ran the library's import: its memory is the library's, so it is as
untrusted as a worker.  That is why a tenant's descriptors never pass through it:
they go from the zygote into an inbox the spare created after the fork.

``TemplateHandle`` is the zygote's end of the channel (worker/zygote.py holds one per
template): it forks the template, asks it for spares and checks each registration.
"""
from __future__ import annotations

import array
import collections
import gc
import importlib.util
import io
import os
import signal
import socket
import struct
import sys
import threading
from typing import Callable, Iterable, Literal, Optional, Union, cast

from .. import protocol as P
from ..core.policy import refused
from ..system.proc import children
from .confine import environment_of, set_environment
from .environment import enter
from .library_code import run_file
from .rlimits import die_with_parent

_MAX_FD = 0x7FFFFFFF

# (pid, inbox): a worker-to-be waiting for its fds.
Spare = tuple[int, socket.socket]


def close_all_but(keep: Iterable[int]) -> None:
    """Close every descriptor of this process except 0, 1, 2 and ``keep``."""
    low = 0
    for fd in sorted({0, 1, 2, *keep}):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _MAX_FD)


#: The dispositions a fresh interpreter starts with where they are not the default: a write
#: to a pipe or socket whose reader is gone raises BrokenPipeError instead of killing the
#: process, a write past RLIMIT_FSIZE raises OSError, SIGINT raises KeyboardInterrupt.
PLAIN_SIGNALS: dict[int, Union[int, signal.Handlers, Callable[..., object]]] = {
    signal.SIGPIPE: signal.SIG_IGN, signal.SIGXFSZ: signal.SIG_IGN,
    signal.SIGINT: signal.default_int_handler}


def reset_signals() -> None:
    """Every signal as a plain interpreter has it (PLAIN_SIGNALS, else the default), whatever
    the zygote set for itself (SIGINT ignored, a SIGCHLD handler, its wake-up fd): a worker is
    a Python process like any other (tests/engine/test_process_state.py compares them)."""
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        want = PLAIN_SIGNALS.get(sig, signal.SIG_DFL)
        if signal.getsignal(sig) != want:
            signal.signal(sig, want)


def adopt(inbox: socket.socket, new_session: bool = False) -> None:
    """Wait for the worker's [sock, log] descriptors, then serve (never returns).

    A template's spare leaves the template's session only now: until the zygote
    registered it, that session is what keeps the zygote from taking it for an orphan."""
    # Now, while waiting: fds 1 and 2 are replaced below, the objects stay.
    try:
        cast(io.TextIOWrapper, sys.stdout).reconfigure(line_buffering=True)
        cast(io.TextIOWrapper, sys.stderr).reconfigure(line_buffering=True)
    except Exception:
        pass
    try:
        data, fds, _, _ = socket.recv_fds(inbox, 64, 2)
    except OSError:
        os._exit(0)
    if not data or len(fds) != 2:
        # The zygote is gone or closing.
        os._exit(0)
    inbox.close()
    # B"go" + a per-tenant template's key.
    if len(data) > 2:
        from .confine.handoff import RECEIVED
        RECEIVED[:] = [data[2:]]
    if new_session:
        # Out of the template's group: outlives it.
        os.setsid()
    sock_fd, log_fd = fds
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    from .loop import serve
    serve(socket.socket(fileno=sock_fd))


# ------------------------------------------------------------ the template process
def main(chan_fd: int, conn_fd: int, zygote_pid: int) -> None:
    os.setsid()
    die_with_parent()
    if os.getppid() != zygote_pid:
        os._exit(1)
    reset_signals()
    close_all_but((chan_fd, conn_fd))
    chan = socket.socket(fileno=chan_fd)
    conn = P.Connection(socket.socket(fileno=conn_fd))
    try:
        kind, payload = conn.recv_frame()
        init = cast(P.Init, P.loads_from_host(kind, payload))
    except Exception:
        os._exit(0)
    verdict = _import(init, chan_fd, conn.sock)
    try:
        conn.send_encoded(P.Encoder(repr).encode(P.READY, [{"template": verdict}]))
    except OSError:
        os._exit(0)
    conn.close()
    if verdict != "ok":
        os._exit(0)
    gc.collect()
    # Workers share the imported pages.
    gc.freeze()
    while True:
        try:
            data = chan.recv(16)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            os._exit(0)
        if data == b"S":
            _spare(chan, zygote_pid)


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _import(init: P.Init, chan_fd: int, channel: socket.socket) -> str:
    """Import the library's files as a worker would; "ok" or "refused: why"."""
    from .loop import PERSISTENT_PREFIX, PRELOADED
    # Confined: narrowed first (_confined)
    if init.confine is not None:
        why = _confined(init, chan_fd, channel)
        if why:
            return why
    else:
        set_environment(environment_of(init))
    if init.confine is None and not init.limits.get("network", True) \
            and "netns" not in (init.disabled or ()):
        from .confine.network import isolate_network
        state = isolate_network()
        if not state.startswith("on"):
            return f"refused: no network namespace for the import ({state})"
    if init.sys_path:
        sys.path[:] = init.sys_path
    os.chdir("/")
    before = _fds()
    try:
        enter(init.environment)
        for i, path in enumerate(init.files):
            name = PERSISTENT_PREFIX + os.path.splitext(os.path.basename(path))[0]
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                return f"refused: cannot import {path}"
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            run_file(mod, spec.loader, path, init.code, i)
            PRELOADED.add(name)
    except BaseException as exc:
        return f"refused: the import raised {type(exc).__name__}: {exc}"[:300]
    return _leftovers(before)


def _confined(init: P.Init, chan_fd: int, channel: socket.socket) -> str:
    """A confined template applies, before it imports anything, all that does not
    depend on a tenant (confine.prepare(shared=True)): the clean environment, its own
    network namespace with the network off, a first Landlock layer (write: beneath the
    tenants' folder and its workers' temp-dir parent, which INIT names as its root and
    temp dir), its workers' uid, no capabilities, the system call filter.  "" or why
    its workers must start otherwise.  The host's guard, where it holds processes, gets
    its listener on ``channel`` (confine/guard.py) before anything is imported."""
    from .confine import prepare
    from .confine.guard import hand_over
    from .confine.handoff import send_key
    report = prepare(init, shared=True)
    conf = init.confine or {}
    if conf.get("pid_guard"):
        hand_over(channel)
    if not report.get("privileges", "").startswith("uid "):
        return f"refused: its privileges were not dropped ({report.get('privileges')})"
    missing = refused(report, init.limits, True)
    # Fail closed: import nothing.
    if missing:
        return "refused: not in force: " + ", ".join(f"{k} ({v})" for k, v in missing)
    if conf.get("handoff") and not (report.get("handoff") == "on" and send_key(chan_fd)):
        return "refused: its privileges were not dropped (no key for its workers' uids)"
    if not os.access(conf["root"], os.X_OK):
        # A fresh worker would get the folder covered (mounts.py); one forked from here
        # could not reach its root.
        return f"refused: uid {os.getuid()} cannot pass through the tenants' folder"
    return ""


def _leftovers(before: set[str]) -> str:
    """What the import left running or open that forked workers would share."""
    if threading.active_count() > 1:
        return "refused: started a thread at import"
    if children(os.getpid()):
        return "refused: started a child process at import"
    native = len(os.listdir("/proc/self/task")) - 1
    maps = open("/proc/self/maps").read()
    # OpenBLAS (numpy) starts its pool at load and manages it across fork (pthread_atfork:
    # stopped around fork(), restarted in the child on first use); any other native thread
    # may hold a lock a forked child would never see released.
    if native and not ("openblas" in maps.lower() and native < (os.cpu_count() or 1)):
        return f"refused: started {native} native thread(s) at import"
    extra = _fds() - before
    if extra:
        return f"refused: left {len(extra)} descriptor(s) open at import"
    for line in maps.splitlines():
        perms = line.split(None, 2)[1]
        if perms[1] == "w" and perms[3] == "s":
            return "refused: left a shared writable mapping at import"
    return "ok"


def _spare(chan: socket.socket, zygote_pid: int) -> None:
    r, w = os.pipe()
    pid = os.fork()
    # The intermediate.
    if pid == 0:
        try:
            me = os.getpid()
            if os.fork() == 0:
                try:
                    os.close(w)
                    _spare_child(chan, r, me, zygote_pid)
                finally:
                    os._exit(70)
        finally:
            os._exit(0)
    os.close(r)
    os.close(w)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _spare_child(chan: socket.socket, r: int, intermediate: int, zygote_pid: int) -> None:
    # EOF: the intermediate is exiting.
    while True:
        try:
            if not os.read(r, 1):
                break
        except InterruptedError:
            continue
    os.close(r)
    # It closed its files before it was gone: the re-parenting follows within moments.
    while os.getppid() == intermediate:
        os.sched_yield()
    die_with_parent()
    if os.getppid() != zygote_pid:
        os._exit(1)
    from .confine import SHARED
    from .confine.handoff import rehearse_take
    from .rehearsal import rehearse
    try:
        rehearse()
        # A spare of a per-tenant template takes its tenant's uid first.
        if SHARED.get("handoff"):
            rehearse_take()
    except Exception:
        # Only an optimization.
        pass
    inbox, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        socket.send_fds(chan, [b"W"], [theirs.fileno()])
    except OSError:
        os._exit(0)
    theirs.close()
    chan.detach()
    from .confine import ready_layer
    # A confined one: its ruleset.
    close_all_but((inbox.fileno(), *ready_layer()))
    # Stdin: nothing the import left there.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    # random reseeds itself at fork (CPython's at-fork hook); numpy's global RandomState does not.
    nprand = sys.modules.get("numpy.random")
    if nprand is not None:
        try:
            nprand.seed()
        except Exception:
            pass
    adopt(inbox, new_session=True)


# ------------------------------------------------------------ the zygote's end
class TemplateHandle:
    """The zygote's handle on a template process: its channel, its spare, the worker
    requests (TFORK) that wait for one.  Both ends of that channel live in this
    module: "S" asks for a spare (main()), "W" + its inbox registers one (_spare_child)."""
    __slots__ = ("pid", "chan", "spare", "queue", "asked", "broke", "key")

    def __init__(self, pid: int, chan: socket.socket) -> None:
        self.pid, self.chan = pid, chan
        # A per-tenant template's, for its spares.
        self.key = b""
        # Its registered spare.
        self.spare: Optional[Spare] = None
        self.queue: collections.deque[tuple[int, list[int]]] = collections.deque()
        # A spare is on its way.
        self.asked = False
        # It sent what it should not: kill it.
        self.broke = False

    @classmethod
    def fork(cls, conn_fd: int, zygote_pid: int) -> "TemplateHandle":
        """(In the zygote) fork a template that reads its INIT from ``conn_fd``."""
        mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # A spare's pid: the kernel's.
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        pid = os.fork()
        if pid == 0:
            try:
                main(its.fileno(), conn_fd, zygote_pid)
            finally:
                os._exit(70)
        its.close()
        return cls(pid, mine)

    def ask(self, again: bool = False) -> None:
        if again or not self.asked:
            try:
                self.chan.send(b"S")
                self.asked = True
            except OSError:
                pass

    def registration(self) -> Union[Spare, None, Literal[True]]:
        """A spare's registration: (pid, inbox) if the kernel vouches for it; True for
        the key of a per-tenant template (once, before any spare); None when the channel
        ended, or when the template sent what it should not (``broke``)."""
        try:
            data, anc, _, _ = self.chan.recvmsg(32, socket.CMSG_SPACE(16) + socket.CMSG_SPACE(12))
        except OSError:
            data, anc = b"", []
        rights = any(kind == socket.SCM_RIGHTS for _, kind, _ in anc)
        if data[:1] == b"K" and len(data) == 17 and not rights and not self.key:
            # Sent before the import: a second breaks.
            self.key = data[1:]
            return True
        fds: list[int] = []
        pid = 0
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", payload[:len(payload) - len(payload) % 4]))
            elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS \
                    and len(payload) >= 12:
                pid = struct.unpack("3i", payload[:12])[0]
        try:
            sid = os.getsid(pid) if pid > 0 else -1
        except OSError:
            sid = -1
        if data == b"W" and len(fds) == 1 and pid != self.pid and sid == self.pid:
            try:
                return pid, socket.socket(fileno=fds[0])
            except OSError:
                pass
        for fd in fds:
            os.close(fd)
        self.broke = bool(data)
        return None
