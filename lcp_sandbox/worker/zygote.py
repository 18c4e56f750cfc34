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
      TEMPLATE(req) + [conn] ────────►  fork a template: it imports one library and
      ◄── FORKED(req, template pid)     pre-forks spares of it (worker/template.py)
      TFORK(req, tpid) + [sock, log] ►  hand them to that template's spare (registered
      ◄── FORKED(req, pid, 1)           with its kernel-given pid); a plain one if none
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

import array
import collections
import gc
import os
import signal
import socket
import struct
import sys
import time
from typing import Optional

from ..system.proc import children, process_tree, status_from_wait
from ..protocol.control import (EXITED, FORK, FORKED, KILL, MAX_RECORD as _MAXMSG, READY, SIGNAL, TEMPLATE,
                                TFORK)
from ..protocol.control import pack as _pack, unpack as _unpack

PLAIN_SPARES = 2            # rehearsed spares in reserve: a burst of this many cold starts forks nothing
REFILL_DELAY_S = 0.005      # how long after a hand-out replacements are forked
ZYGOTE_REHEARSALS = 10      # dry runs of a worker's first session in the zygote itself


def _kill_tree(pid: int, keep: frozenset = frozenset()) -> None:
    """Kill ``pid``'s process group and descendants, except the registered workers in
    ``keep``: a dead template's group may still hold a spare just handed out as a
    worker (it leaves the group when it gets its descriptors)."""
    kids = process_tree(pid)[1:]             # taken first: killing re-parents them
    if not keep:
        try:
            os.killpg(pid, signal.SIGKILL)   # the worker leads its own process group
        except OSError:
            pass
    else:
        for k in children(os.getpid()):
            try:
                if k not in keep and os.getpgid(k) == pid:
                    os.kill(k, signal.SIGKILL)
            except OSError:
                pass
    for k in kids:
        if k in keep:
            continue
        try:
            os.kill(k, signal.SIGKILL)
        except OSError:
            pass


def _reap(ctl: socket.socket, workers: set, templates: frozenset = frozenset()) -> None:
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
            _kill_tree(pid, frozenset(workers) if pid in templates else frozenset())   # its group may outlive it
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
    from .template import adopt, close_all_but, reset_signals
    reset_signals()
    ctl.close()
    close_all_but((inbox.fileno(),))         # the wake pipe, templates' channels, other spares
    from .rehearsal import rehearse
    try:
        rehearse()
    except Exception:
        pass                                     # only an optimization
    adopt(inbox)


class _Template:
    """The zygote's record of a template process (worker/template.py)."""
    __slots__ = ("pid", "chan", "spare", "queue", "asked")

    def __init__(self, pid: int, chan: socket.socket) -> None:
        self.pid, self.chan = pid, chan
        self.spare: Optional[tuple] = None         # (pid, inbox) of its registered spare
        self.queue: collections.deque = collections.deque()   # (req, [sock, log]) waiting
        self.asked = False                        # a spare is on its way

    def ask(self, again: bool = False) -> None:
        if again or not self.asked:
            try:
                self.chan.send(b"S")
                self.asked = True
            except OSError:
                pass


def _make_template(conn_fd: int, zygote_pid: int) -> _Template:
    mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)    # a spare's pid, from the kernel
    pid = os.fork()
    if pid == 0:
        try:
            from .template import main as template_main
            template_main(its.fileno(), conn_fd, zygote_pid)
        finally:
            os._exit(70)
    its.close()
    return _Template(pid, mine)


def _from_template(tpl: _Template) -> Optional[tuple]:
    """A spare's registration: (pid, inbox) if the kernel vouches for it; None otherwise
    (the channel ended, or the template sent what it should not: it is killed)."""
    try:
        data, anc, _, _ = tpl.chan.recvmsg(16, socket.CMSG_SPACE(16) + socket.CMSG_SPACE(12))
    except OSError:
        data, anc = b"", []
    fds: list = []
    pid = 0
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(array.array("i", payload[:len(payload) - len(payload) % 4]))
        elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= 12:
            pid = struct.unpack("3i", payload[:12])[0]
    try:
        sid = os.getsid(pid) if pid > 0 else -1
    except OSError:
        sid = -1
    if data == b"W" and len(fds) == 1 and pid != tpl.pid and sid == tpl.pid:
        try:
            return pid, socket.socket(fileno=fds[0])
        except OSError:
            pass
    for fd in fds:
        os.close(fd)
    if data:
        _kill_tree(tpl.pid)                      # it broke the zygote's protocol
    return None


def main(fd: int) -> None:
    """Entry point of the zygote process (``python -I -c`` host/zygote.py's boot line)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .rlimits import become_subreaper
    become_subreaper()
    ctl = socket.socket(fileno=fd)
    # What every worker needs, imported once here and shared copy-on-write.
    import ctypes, inspect, importlib.util, json, pathlib, re, sqlite3, threading, traceback, typing  # noqa
    import msgpack  # noqa
    from . import loop, proxies, rehearsal, rlimits, template  # noqa
    from .confine import landlock, mounts, network, privileges, seccomp  # noqa
    from .. import protocol  # noqa
    from ..core import normalize, policy  # noqa
    import tempfile, fcntl, struct  # noqa
    seccomp.prebuild()                       # the confined workers' filters, packed once
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    workers: set[int] = set()
    templates: dict[int, _Template] = {}          # by the fd of its channel
    me = os.getpid()
    # A worker's first session, run here until CPython has specialized its code (3.11
    # rewrites bytecode in place as it warms up): a spare then writes fewer shared pages.
    for _ in range(ZYGOTE_REHEARSALS):
        rehearsal.rehearse()
    signal.signal(protocol.SOFT_TIMEOUT_SIGNAL, signal.SIG_DFL)    # (the rehearsal's handler)
    gc.collect()
    gc.freeze()
    spares: collections.deque = collections.deque()      # (pid, inbox), oldest first
    refill = [0.0]               # when to fork replacements (monotonic; 0: nothing owed)

    def fork_spare() -> tuple:
        got = _spare(ctl, wake_r, wake_w, me)
        workers.add(got[0])
        return got

    spares.append(fork_spare())
    ctl.send(_pack(READY, me))

    import select
    poller = select.poll()
    poller.register(ctl.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)

    def owe() -> None:
        # Replacements are forked a moment after a hand-out, not at once: forking copies
        # the zygote's page tables and the new spare rehearses, CPU a worker just
        # handed its descriptors needs for its first call.
        refill[0] = refill[0] or time.monotonic() + REFILL_DELAY_S

    def plain(req: int, fds: list, kind: int = 0) -> None:
        # Hand the fds to a spare; if none is left (or it died), fork one on the spot.
        while True:
            pid, inbox = spares.popleft() if spares else fork_spare()
            try:
                socket.send_fds(inbox, [b"go"], fds)
                break
            except OSError:
                pass
            finally:
                inbox.close()
        for f in fds:
            os.close(f)
        ctl.send(_pack(FORKED, req, pid, kind))
        owe()

    owe()                                        # the rest of the reserve
    def handed(tpl: _Template, req: int, fds: list, pid: int, inbox: socket.socket) -> None:
        try:
            socket.send_fds(inbox, [b"go"], fds)
            ok = True
        except OSError:
            ok = False                           # it died meanwhile: a plain spare serves
        inbox.close()
        if ok:
            for f in fds:
                os.close(f)
            ctl.send(_pack(FORKED, req, pid, 1))
        else:
            plain(req, fds)
        owe()                                    # its next spare, asked for when quiet

    def template_gone(tpl: _Template) -> None:
        if templates.pop(tpl.chan.fileno(), None) is None:
            return
        poller.unregister(tpl.chan.fileno())
        tpl.chan.close()
        if tpl.spare:
            tpl.spare[1].close()
        while tpl.queue:
            plain(*tpl.queue.popleft())

    while True:
        wait = -1
        if refill[0]:
            wait = max(0, int((refill[0] - time.monotonic()) * 1000) + 1)
        try:
            events = poller.poll(wait)
        except InterruptedError:
            continue
        if refill[0] and time.monotonic() >= refill[0]:
            refill[0] = 0.0
            while len(spares) < PLAIN_SPARES:
                spares.append(fork_spare())
            for tpl in templates.values():
                if tpl.spare is None and not tpl.queue:
                    tpl.ask()
        for efd, _ in events:
            if efd == wake_r:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                _reap(ctl, workers, frozenset(t.pid for t in templates.values()))
                for tpl in [t for t in templates.values() if t.pid not in workers]:
                    template_gone(tpl)
                continue
            if efd in templates:
                tpl = templates[efd]
                got = _from_template(tpl)
                if got is None:
                    template_gone(tpl)
                    continue
                workers.add(got[0])
                tpl.asked = False
                if tpl.queue:
                    handed(tpl, *tpl.queue.popleft(), *got)
                else:
                    tpl.spare = got
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
            if msg[0] == FORK and len(fds) == 2:
                plain(msg[1], fds)
                fds = []
            elif msg[0] == TFORK and len(fds) == 2:
                _reap(ctl, workers, frozenset(t.pid for t in templates.values()))   # a template that just
                # died must not hand out its spare
                tpl = next((t for t in templates.values() if t.pid == msg[2] and t.pid in workers), None)
                if tpl is None:
                    plain(msg[1], fds)               # it is gone: a fresh worker imports itself
                elif tpl.spare:
                    got, tpl.spare = tpl.spare, None
                    handed(tpl, msg[1], fds, *got)
                else:
                    tpl.queue.append((msg[1], fds))
                    tpl.ask(again=len(tpl.queue) > 1)   # the spare asked for may have died
                fds = []
            elif msg[0] == TEMPLATE and len(fds) == 1:
                tpl = _make_template(fds[0], me)
                workers.add(tpl.pid)
                templates[tpl.chan.fileno()] = tpl
                poller.register(tpl.chan.fileno(), select.POLLIN)
                ctl.send(_pack(FORKED, msg[1], tpl.pid))
                tpl.ask()
            elif msg[0] == KILL:
                if msg[1] in workers:        # never signal a pid we already reaped
                    _kill_tree(msg[1])
            elif msg[0] == SIGNAL:
                if msg[1] in workers:
                    try:
                        os.kill(msg[1], msg[2])
                    except OSError:
                        pass
            for extra in fds:
                os.close(extra)
