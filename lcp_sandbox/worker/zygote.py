"""The zygote: a lean, pre-started process that forks workers on request.

Forking the host would copy a big, multi-threaded process; starting a fresh
interpreter per library costs tens of milliseconds.  The zygote is started
once (a fresh interpreter), imports the engine, freezes its heap
(``gc.freeze()``, so children do not dirty inherited pages) and then only
forks.  It is the parent of every worker, so it is also the one that reaps
them, reports how they ended, and kills process trees.

The host's end of its channel is backends/local/zygote_client.py:

    host                                zygote process (here)          worker
      FORK(req) + [sock, log fds] ──►  hand them to the spare ─────────► (forked earlier: setsid,
      ◄── FORKED(req, pid)             fork the next spare               die-with-parent) fds 1,2
                                                                         -> log pipe, serve()
      TEMPLATE(req) + [conn] ────────►  fork a template: it imports one library and
      ◄── FORKED(req, template pid)     pre-forks spares of it (worker/template.py's
                                        TemplateHandle: the zygote's end of its channel)
      TFORK(req, tpid) + [sock, log] ►  hand them to that template's spare (registered
      ◄── FORKED(req, pid, 1)           with its kernel-given pid); a plain one if none
      KILL(pid) ─────────────────────►  kill the worker's tree
      ◄── KILL_FAILED(pid, errno, ended)  a kill of its tree was refused (what it could
                                        not kill lives on): at KILL, or (ended: 1) once
                                        it ended, before its EXITED
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

import collections
import errno
import gc
import os
import select
import signal
import socket
import struct
import time
from typing import Callable

from ..protocol.control import (
    EXITED,
    FORK,
    FORK_PIDNS,
    FORKED,
    KILL,
    KILL_FAILED,
    MAX_RECORD,
    SIGNAL,
    TEMPLATE,
    TFORK,
    ZYGOTE_READY,
    pack,
    unpack,
)
from ..system.proc import children, process_tree, status_from_wait
from .pidns_init import worker_status
from .spares import STATUS_PIPES, fork_spare
from .template import Spare, TemplateHandle

# Rehearsed spares in reserve (a burst of this many forks none)
PLAIN_SPARES = 2
# How long after a hand-out replacements are forked.
REFILL_DELAY_S = 0.005
# Dry runs of a worker's first session in the zygote itself.
ZYGOTE_REHEARSALS = 10


def _kill_tree(pid: int, keep: frozenset = frozenset()) -> int:
    """Kill ``pid``'s process group and descendants, except the registered workers in
    ``keep``: a dead template's group may still hold a spare just handed out as a
    worker (it leaves the group when it gets its descriptors).  Returns the errno of the
    first kill refused (EPERM: no CAP_KILL over their uid), 0 when none was (a process
    already gone is no refusal)."""
    refused = 0
    # Taken first: killing re-parents them.
    kids = process_tree(pid)[1:]
    if not keep:
        # the worker leads its own process group
        refused = _sigkill(os.killpg, pid)
    else:
        for k in children(os.getpid()):
            try:
                in_group = k not in keep and os.getpgid(k) == pid
            except OSError:
                continue
            if in_group:
                refused = refused or _sigkill(os.kill, k)
    for k in kids:
        if k not in keep:
            refused = refused or _sigkill(os.kill, k)
    return refused


def _sigkill(send: Callable[[int, int], None], target: int) -> int:
    """SIGKILL by ``send`` (os.kill or os.killpg): 0, or the errno it was refused with."""
    try:
        send(target, signal.SIGKILL)
    except ProcessLookupError:
        return 0
    except OSError as exc:
        return exc.errno or errno.EPERM
    return 0


def _kill_orphans(workers: set) -> None:
    # Any child of ours that is not a worker is a tool's orphan (we are a subreaper);
    # it is spared while it is still in a live worker's session.
    kids = children(os.getpid())
    for pid in kids:
        try:
            # A worker leads its own session.
            owner = os.getsid(pid)
        except OSError:
            owner = None
        if pid not in workers and owner not in workers:
            _kill_tree(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def main(fd: int) -> None:
    """Entry point of the zygote process (``python -I -c``: the boot line of
    backends/local/zygote_client.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .rlimits import become_subreaper
    become_subreaper()
    ctl = socket.socket(fileno=fd)
    # What every worker needs, imported once here and shared copy-on-write.
    import msgpack  # noqa
    from .. import protocol  # noqa
    from ..core import normalize, policy  # noqa
    from . import ahead, loop, proxies, rehearsal, rlimits, template  # noqa
    ahead.import_ahead()
    from .confine import guard, landlock, mounts, network, privileges, seccomp  # noqa
    # The confined workers' filters, packed once.
    seccomp.prebuild()
    guard.prebuild()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    # A worker's first session, run here until CPython has specialized its code (3.11
    # rewrites bytecode in place as it warms up): a spare then writes fewer shared pages.
    for _ in range(ZYGOTE_REHEARSALS):
        rehearsal.rehearse()
    # The rehearsal's handler.
    signal.signal(protocol.SOFT_TIMEOUT_SIGNAL, signal.SIG_DFL)
    gc.collect()
    gc.freeze()
    Zygote(ctl, wake_r, wake_w).run()


class Zygote:
    """The zygote's loop: one method per thing that happens.

        start()       fork the first spare, ZYGOTE_READY to the host, the rest of the reserve owed
        run()         poll the control channel, the wake pipe (SIGCHLD) and the templates'
                      channels; fork what is owed when it is due
        control()     a record from the host: fork() / tfork() / template() / kill() /
                      signal(); EOF: exit()
        reaped()      SIGCHLD: reap, EXITED to the host, a dead template forgotten
        registered()  a template's spare registered (or the template gone)
    """

    def __init__(self, ctl: socket.socket, wake_r: int, wake_w: int) -> None:
        self.ctl, self.wake_r, self.wake_w = ctl, wake_r, wake_w
        self.me = os.getpid()
        # Every child we forked and did not reap.
        self.workers: set[int] = set()
        # By the fd of its channel.
        self.templates: dict[int, TemplateHandle] = {}
        # Oldest first.
        self.spares: collections.deque[Spare] = collections.deque()
        # Spares that are pid 1 of a PID namespace of their own (confined workers), kept
        # once one was asked for; the zygote's own namespace, to come back to after each.
        self.ns_spares: collections.deque[Spare] = collections.deque()
        self.ns_wanted = False
        self.own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        # When to fork replacements (monotonic; 0: nothing owed)
        self.refill_at = 0.0
        self.poller = select.poll()

    # ------------------------------------------------------------ the loop
    def run(self) -> None:
        self.start()
        self.poller.register(self.ctl.fileno(), select.POLLIN)
        self.poller.register(self.wake_r, select.POLLIN)
        while True:
            wait = -1
            if self.refill_at:
                wait = max(0, int((self.refill_at - time.monotonic()) * 1000) + 1)
            try:
                events = self.poller.poll(wait)
            except InterruptedError:
                continue
            if self.refill_at and time.monotonic() >= self.refill_at:
                self.refill()
            for efd, _ in events:
                if efd == self.wake_r:
                    self.reaped()
                elif efd in self.templates:
                    self.registered(self.templates[efd])
                else:
                    self.control()

    def start(self) -> None:
        self.spares.append(self.fork_spare())
        self.tell(pack(ZYGOTE_READY, self.me))
        # The rest of the reserve.
        self.owe()

    def control(self) -> None:
        """One record from the host (and the descriptors it came with)."""
        try:
            data, fds, _, _ = socket.recv_fds(self.ctl, MAX_RECORD, 4)
        except OSError:
            data, fds = b"", []
        if not data:
            self.exit()
        try:
            kind, a, b, _ = unpack(data)
        except struct.error:
            kind = a = b = 0
        if kind == FORK and len(fds) == 2:
            self.fork(a, fds, pidns=bool(b & FORK_PIDNS))
            return
        if kind == TFORK and len(fds) == 2:
            self.tfork(a, b, fds)
            return
        if kind == TEMPLATE and len(fds) == 1:
            self.template(a, fds[0])
        elif kind == KILL:
            self.kill(a)
        elif kind == SIGNAL:
            self.signal(a, b)
        for extra in fds:
            os.close(extra)

    # ------------------------------------------------------------ the host's requests
    def fork(self, req: int, fds: list[int], templated: int = 0, pidns: bool = False) -> None:
        """FORK: hand the fds to a spare (``pidns``: one in a PID namespace of its own); if
        none is left (or it died), fork one on the spot."""
        self.ns_wanted = self.ns_wanted or pidns
        spares = self.ns_spares if pidns else self.spares
        while True:
            pid, inbox = spares.popleft() if spares else self.fork_spare(pidns)
            try:
                socket.send_fds(inbox, [b"go"], fds)
                break
            except OSError:
                pass
            finally:
                inbox.close()
        for f in fds:
            os.close(f)
        self.tell(pack(FORKED, req, pid, templated))
        self.owe()

    def tfork(self, req: int, template_pid: int, fds: list[int]) -> None:
        """TFORK: the fds to that template's spare (waiting for one); a plain spare
        when the template is gone (a fresh worker imports the library itself)."""
        # A template that just died must not.
        self.reap()
        # Hand out its spare.
        tpl = next((t for t in self.templates.values()
                    if t.pid == template_pid and t.pid in self.workers), None)
        if tpl is None:
            self.fork(req, fds)
        elif tpl.spare:
            got, tpl.spare = tpl.spare, None
            self.handed(req, fds, got, tpl.key)
        else:
            tpl.queue.append((req, fds))
            # The spare asked for may have died.
            tpl.ask(again=len(tpl.queue) > 1)

    def template(self, req: int, conn_fd: int) -> None:
        """TEMPLATE: fork a template process on the connection ``conn_fd``."""
        tpl = TemplateHandle.fork(conn_fd, self.me)
        self.workers.add(tpl.pid)
        self.templates[tpl.chan.fileno()] = tpl
        self.poller.register(tpl.chan.fileno(), select.POLLIN)
        self.tell(pack(FORKED, req, tpl.pid))
        tpl.ask()

    def kill(self, pid: int) -> None:
        """KILL: a worker's tree; never a pid we already reaped.  A kill refused is told
        (KILL_FAILED): the host must not count the worker as stopped."""
        if pid in self.workers:
            refused = _kill_tree(pid)
            if refused:
                self.tell(pack(KILL_FAILED, pid, refused))

    def signal(self, pid: int, sig: int) -> None:
        """SIGNAL: one live worker (never a pid we already reaped)."""
        if pid in self.workers:
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def tell(self, record: bytes) -> None:
        """A record to the host; a host that is gone (its end closed while it closed the
        supervisor) ends the zygote as EOF does, without a traceback."""
        try:
            self.ctl.send(record)
        except OSError:
            self.exit()

    def exit(self) -> None:
        """EOF on the control channel: the host is gone or closing; every worker dies."""
        for pid in list(self.workers):
            _kill_tree(pid)
        _kill_orphans(set())
        os._exit(0)

    # ------------------------------------------------------------ spares and templates
    def fork_spare(self, pidns: bool = False) -> Spare:
        got = fork_spare(self.ctl, self.wake_r, self.wake_w, self.me,
                     self.own_pidns if pidns else -1)
        self.workers.add(got[0])
        return got

    def owe(self) -> None:
        """Replacements are forked a moment after a hand-out, not at once: forking copies
        the zygote's page tables and the new spare rehearses, CPU a worker just handed
        its descriptors needs for its first call."""
        self.refill_at = self.refill_at or time.monotonic() + REFILL_DELAY_S

    def refill(self) -> None:
        self.refill_at = 0.0
        while len(self.spares) < PLAIN_SPARES:
            self.spares.append(self.fork_spare())
        if self.ns_wanted and not self.ns_spares:
            self.ns_spares.append(self.fork_spare(pidns=True))
        for tpl in self.templates.values():
            if tpl.spare is None and not tpl.queue:
                tpl.ask()

    def handed(self, req: int, fds: list[int], spare: Spare, key: bytes) -> None:
        """The fds to a template's spare (with its key, per-tenant); FORKED says it came
        from the template."""
        pid, inbox = spare
        try:
            socket.send_fds(inbox, [b"go" + key], fds)
            ok = True
        except OSError:
            # It died meanwhile: a plain spare serves.
            ok = False
        inbox.close()
        if ok:
            for f in fds:
                os.close(f)
            self.tell(pack(FORKED, req, pid, 1))
        else:
            self.fork(req, fds)
        # Its next spare, asked for when quiet.
        self.owe()

    def registered(self, tpl: TemplateHandle) -> None:
        """A template's channel is readable: its spare registered, or it ended."""
        got = tpl.registration()
        # Its key (confine/handoff.py)
        if got is True:
            return
        if got is None:
            if tpl.broke:
                # It broke the zygote's protocol.
                _kill_tree(tpl.pid)
            self.template_gone(tpl)
            return
        self.workers.add(got[0])
        tpl.asked = False
        if tpl.queue:
            req, fds = tpl.queue.popleft()
            self.handed(req, fds, got, tpl.key)
        else:
            tpl.spare = got

    def template_gone(self, tpl: TemplateHandle) -> None:
        if self.templates.pop(tpl.chan.fileno(), None) is None:
            return
        self.poller.unregister(tpl.chan.fileno())
        tpl.chan.close()
        if tpl.spare:
            tpl.spare[1].close()
        while tpl.queue:
            self.fork(*tpl.queue.popleft())

    # ------------------------------------------------------------ ends
    def reaped(self) -> None:
        """SIGCHLD woke us: reap; a template that died is forgotten."""
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass
        self.reap()
        for tpl in [t for t in self.templates.values() if t.pid not in self.workers]:
            self.template_gone(tpl)

    def reap(self) -> None:
        """Reap every child that ended: EXITED for a worker, its tree killed; orphans too."""
        templates = frozenset(t.pid for t in self.templates.values())
        workers = self.workers
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in workers:
                workers.discard(pid)
                status_r = STATUS_PIPES.pop(pid, -1)
                own = worker_status(status_r) if status_r >= 0 else None
                # The init of a worker's PID namespace.
                if own is not None:
                    status = own
                code = status_from_wait(status)
                # its group may outlive it (a template's: its spares handed out are kept)
                refused = _kill_tree(pid, frozenset(workers) if pid in templates
                                     else frozenset())
                try:
                    # what it left behind and could not be killed lives on: the host says so
                    if refused:
                        self.ctl.send(pack(KILL_FAILED, pid, refused, 1))
                    self.ctl.send(pack(EXITED, pid, code))
                except OSError:
                    pass
            _kill_orphans(workers)
