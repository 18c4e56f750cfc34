"""Library templates, host side: which worker starts from which template.

    start(zygote, slot, init, pump, deadline)
        why_not(limits, init)?  ─► WorkerProcess.start() as before; slot.attach(proc, "fresh (why)")
        key = files (path, mtime, size), sys.path, environment, network, the library's
              own environment (a template per environment: it imports over it)
        the library's first worker ─► fresh, from the zygote's rehearsed spare (the fastest
                               cold start; a library one tenant uses gets no template)
        its second, no template ─► a thread makes it: INIT (nothing of a tenant) into a
                               socketpair, TEMPLATE to the zygote, its READY {"template":
                               verdict}; this worker waits for it (within its deadline)
        (an older version of the library's files: its template is retired first)
        verdict "ok"     ─► WorkerProcess.start(template=pid); slot.attach(proc, "template", tpl)
                            (the template gone meanwhile: slot.started_fresh(...) when forked)
        verdict refused  ─► fresh, with the reason; remembered until the file changes
    confined (Supervisor(tenants_root=T), a root beneath T; confine/confined.py decides):
        the library's confined template, when made ─► "template"
        else (its first worker, a library not trusted at import, code registered at
        run time) the base of its key, when made ─► "base (why)"; else "fresh (why)"
        what was missing is made after the call that needed it answered (ZygoteClient.after);
        a later worker of the library waits for its template while it is made
        its temp dir is made in the template's temp-dir parent (removed with the
        template once no worker of it lives, or at close()): the one made there ahead
        (temp_dirs.MadeAhead), whose successor is made once the call is answered
    exited(pid)     a template died: forgotten (the next worker makes a new one)
    released(tpl)   a worker of it ended;  tick(now) retires templates with no worker
                    for idle_timeout_s (least recently used first) and says when it is
                    next due; on_idle(at) is told when a template may be retired

An unconfined template imports with its workers' environment and network.  A confined
one first applies everything of its workers' confinement that does not depend on a
tenant (a Landlock layer that writes beneath T), then imports: only what the host trusts
at import (confine/confined.py).  See worker/template.py for the template process.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Optional, Union, cast

from ... import protocol as P
from ...core.limits import Limits
from ...system.proc import tree_memory
from .confine import confined, pid_guard
from .confine.temp_dirs import MadeAhead, private_tmpdir, remove_tmpdir
from .output import OutputPump
from .process import WorkerProcess
from .slot import Slot
from .zygote_client import Forked, ZygoteClient

#: What makes a template: the library, its files (path, mtime, size), sys.path, environment...
TemplateKey = tuple[Any, ...]


class _Template:
    __slots__ = ("key", "library", "pid", "state", "workers", "idle_since", "ready", "begun",
                 "init", "tmp_parent", "ahead", "live", "guard")

    def __init__(self, key: TemplateKey, library: str, init: P.Init) -> None:
        self.key, self.library = key, library
        self.pid = 0
        self.state = "starting"
        self.workers = 0
        self.idle_since = time.monotonic()
        self.ready = threading.Event()
        # _make() runs (or ran)
        self.begun = False
        # What it is made with (nothing of a tenant)
        self.init = init
        # Confined: its workers' temp dirs are in it.
        self.tmp_parent: Optional[str] = None
        # Confined: a temp dir made there ahead, for its next worker
        self.ahead: Optional[MadeAhead] = None
        # Still listed (else: gone, workers may live)
        self.live = True
        # the host's guard of its processes and its workers' (confine/pid_guard.py), if it holds one
        self.guard: Union[pid_guard.Watch, str, None] = None


class Templates:
    def __init__(self, idle_timeout_s: Optional[float],
                 tenants_root: Optional[str] = None) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.tenants_root = os.path.realpath(tenants_root) if tenants_root else None
        self._lock = threading.Lock()
        self._by_key: dict[TemplateKey, _Template] = {}
        # Keys whose first worker has started.
        self._seen: set[TemplateKey] = set()
        # Confined, no longer listed, workers live.
        self._gone: set[_Template] = set()
        # close() ran: a template made meanwhile drops its temp-dir parent itself
        self._closed = False
        # tick(at) may retire one.
        self.on_idle: Callable[[float], None] = lambda at: None

    def _idle_from(self, tpl: _Template, since: float) -> None:
        tpl.idle_since = since
        if self.idle_timeout_s is not None:
            self.on_idle(since + self.idle_timeout_s)

    @staticmethod
    def why_not(limits: Limits, init: P.Init) -> str:
        """Why an unconfined worker of this library imports fresh ("" when a template may
        serve it)."""
        if limits.template is False:
            return "templates off for this library"
        if not init.files:
            return "code registered at run time"
        return ""

    @staticmethod
    def key(init: P.Init) -> TemplateKey:
        files = []
        for f in init.files:
            st = os.stat(f)
            files.append((f, st.st_mtime_ns, st.st_size))
        lim = init.limits
        return (init.library, tuple(files), tuple(init.sys_path or ()),
                tuple(sorted((init.env or {}).items())),
                tuple(sorted((lim.get("env") or {}).items())), bool(lim.get("network", True)),
                (init.environment or {}).get("key"))

    def start(self, zygote: ZygoteClient, slot: Slot, init: P.Init, pump: OutputPump,
              deadline: Optional[float]) -> WorkerProcess:
        """Start ``slot``'s worker, from the library's template when one may serve it
        (confined: from a confined template or its base, see confine/confined.py), and attach it
        to the slot.  A confined worker's temp dir is made here."""
        if init.confine is not None:
            return self._start_confined(zygote, slot, init, pump, deadline)
        why = self.why_not(slot.limits, init)
        tpl = None
        if not why:
            try:
                tpl = self._template(zygote, init, deadline)
                why = "first worker of the library: no template yet" if tpl is None else \
                    "" if tpl.state == "ok" else tpl.state
            except OSError as exc:
                why = f"template not made: {exc}"
        if why or tpl is None or not self._claim(tpl):
            return self._attach(slot, WorkerProcess.start(zygote, init, pump, slot.library.name,
                                                          slot.limits.log_bytes_per_s),
                                f"fresh ({why or 'its template was gone'})", None)
        return self._fork(zygote, slot, init, pump, tpl, "template")

    def _start_confined(self, zygote: ZygoteClient, slot: Slot, init: P.Init, pump: OutputPump,
                        deadline: Optional[float]) -> WorkerProcess:
        why = confined.why_fresh(self.tenants_root, slot.limits, init)
        tpl, start = None, ""
        if not why:
            try:
                tpl, start, why = self._confined(zygote, slot.limits, init, deadline)
            except OSError as exc:
                why = f"template not made: {exc}"
        run_as = (init.confine or {})["run_as"]
        ahead = tpl.ahead if tpl else None
        try:
            init = init._replace(tmpdir=ahead.take(run_as) if ahead else private_tmpdir(
                run_as, tpl.tmp_parent if tpl else None))
        except BaseException:
            # (claimed by _confined(): given back)
            self.released(tpl)
            raise
        if tpl is not None:
            if ahead:
                zygote.after(ahead.make)
            return self._fork(zygote, slot, init, pump, tpl, start)
        try:
            proc = WorkerProcess.start(zygote, init, pump, slot.library.name,
                                       slot.limits.log_bytes_per_s)
        except BaseException:
            if init.tmpdir:
                remove_tmpdir(init.tmpdir, f"a worker of {slot.library.name}")
            raise
        return self._attach(slot, proc, f"fresh ({why})", None)

    def _confined(self, zygote: ZygoteClient, limits: Limits, init: P.Init,
                  deadline: Optional[float]) -> tuple[Optional[_Template], str, str]:
        """(the confined template to fork from and the start it makes, or None and why
        not).  Its library's when the library may be imported there and the template
        is made; else its base's, when made.  What is missing is made once the call
        that needed it is answered (ZygoteClient.after): never during that call."""
        root = cast(str, self.tenants_root)
        why = confined.untrusted(limits, init, root)
        if not why:
            tpl = self._shared(zygote, confined.key(init, root, True), init, True, deadline)
            if tpl is not None and tpl.state == "ok" and self._claim(tpl):
                return tpl, "template", ""
            why = "first worker of the library: no template yet" if tpl is None else \
                "its template was gone" if tpl.state == "ok" else tpl.state
        base = self._shared(zygote, confined.key(init, root, False), init, False, None)
        if base is not None and base.state == "ok" and self._claim(base):
            return base, f"base ({why})", ""
        return None, "", why + ("; no base yet" if base is None or base.state == "starting" else
                                f"; base {base.state}")

    def _shared(self, zygote: ZygoteClient, key: TemplateKey, init: P.Init, library: bool,
                deadline: Optional[float]) -> Optional[_Template]:
        """The confined template of ``key``: None when it is new (made after this call);
        while it is being made, waited for within ``deadline`` (a library's) or not (a
        base: its worker goes on without)."""
        with self._lock:
            tpl = self._by_key.get(key)
            stale = [] if tpl is not None or not library else self._stale(key, init.library)
            if tpl is None:
                tpl = self._by_key[key] = _Template(
                    key, key[0], confined.template_init(init, cast(str, self.tenants_root),
                                                        library))
                new = True
            else:
                new = False
        self._kill_templates(zygote, stale)
        if new:
            zygote.after(lambda: self._begin(zygote, tpl))
            return None
        if not library and not tpl.begun:
            # Its zygote was replaced.
            zygote.after(lambda: self._begin(zygote, tpl))
        if library and not tpl.ready.is_set():
            # Not made yet: now, and waited for.
            self._begin(zygote, tpl)
            tpl.ready.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return tpl if tpl.ready.is_set() else None

    def _claim(self, tpl: _Template) -> bool:
        """One more worker forks from ``tpl`` (False: it is gone meanwhile)."""
        with self._lock:
            if tpl.live and tpl.state == "ok":
                tpl.workers += 1
                return True
        return False

    def _fork(self, zygote: ZygoteClient, slot: Slot, init: P.Init, pump: OutputPump,
              tpl: _Template, start: str) -> WorkerProcess:
        """A worker forked from ``tpl`` (claimed): attached to the slot as ``start``."""
        try:
            proc = WorkerProcess.start(zygote, init, pump, slot.library.name,
                                       slot.limits.log_bytes_per_s, template=tpl.pid)
        except BaseException:
            if init.tmpdir:
                remove_tmpdir(init.tmpdir, f"a worker of {slot.library.name}")
            self.released(tpl)
            raise
        self._attach(slot, proc, start, tpl)

        def served(fut: Future[int]) -> None:
            if fut.exception() is None and isinstance(fut, Forked) and not fut.templated:
                slot.started_fresh("its template was gone")
        proc.forked.add_done_callback(served)
        return proc

    @staticmethod
    def _attach(slot: Slot, proc: WorkerProcess, start: str,
                tpl: Optional[_Template]) -> WorkerProcess:
        slot.attach(proc, start, tpl)
        return proc

    def _stale(self, key: TemplateKey, library: str) -> list[_Template]:
        """(Holding the lock) the templates of an older version of the library's files,
        taken off the list."""
        stale = []
        for other in list(self._by_key.values()):
            if other.library == library and other.key[1] != key[1] and \
                    [f[0] for f in other.key[1]] == [f[0] for f in key[1]]:
                # The file changed.
                stale.append(self._by_key.pop(other.key))
        return stale

    def _template(self, zygote: ZygoteClient, init: P.Init,
                  deadline: Optional[float]) -> Optional[_Template]:
        """The library's template, waiting while it is made; None for the library's
        first worker."""
        key = self.key(init)
        with self._lock:
            if key not in self._seen:
                if len(self._seen) > 10000:
                    self._seen.clear()
                self._seen.add(key)
                return None
            tpl = self._by_key.get(key)
            stale = [] if tpl is not None else self._stale(key, init.library)
            if tpl is None:
                # Nothing of a tenant: no configuration (it may lend host objects), no
                # handlers, no workspace.  The environment and sys.path are its workers'.
                tpl = self._by_key[key] = _Template(key, init.library, init._replace(
                    configs={}, handlers=0, confine=None, tmpdir=None))
        self._kill_templates(zygote, stale)
        # Made by a thread: a caller whose deadline passes goes fresh.
        self._begin(zygote, tpl)
        tpl.ready.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return tpl

    def _begin(self, zygote: ZygoteClient, tpl: _Template) -> None:
        """Make ``tpl`` now, unless that began already (or it was retired meanwhile)."""
        with self._lock:
            if tpl.begun or not tpl.live:
                tpl.ready.set()
                return
            tpl.begun = True
        threading.Thread(target=self._make, args=(zygote, tpl, time.monotonic() + 120.0),
                         name="lcp-sandbox-template", daemon=True).start()

    def _make(self, zygote: ZygoteClient, tpl: _Template, deadline: Optional[float]) -> None:
        host_sock, its_sock = P.pair()
        conn = P.Connection(host_sock)
        try:
            init = tpl.init
            # Its import's temp dir, its workers' parent.
            if init.confine is not None:
                tpl.tmp_parent = confined.tmp_parent(tuple(init.confine["run_as"]),
                                                     bool(init.confine.get("handoff")))
                init = init._replace(tmpdir=tpl.tmp_parent, confine={**init.confine,
                                                                     "pid_guard": True})
            conn.send(P.INIT, init)
            fut = zygote.template(its_sock.fileno())
            its_sock.close()
            tpl.pid = fut.result(30.0)
            # Its first byte: the guard's listener.
            if init.confine is not None:
                tpl.guard = pid_guard.receive(conn.sock, deadline, tpl.pid)
            kind, payload = conn.recv_frame(deadline, {P.READY: P.READY_CAP})
            ready = cast(P.Ready, P.parse_from_worker(kind, payload, conn.decoder))
            # Str: the codec checked it.
            verdict = ready.report.get("template", "")
            if verdict != "ok" and not verdict.startswith("refused: "):
                verdict = "refused: it answered out of protocol"
            tpl.state = verdict
            if tpl.tmp_parent and verdict == "ok":
                tpl.ahead = MadeAhead(tpl.tmp_parent)
                tpl.ahead.make()
        except TimeoutError:
            tpl.state = "refused: its import took over 120 s"
        # EOF, a protocol violation, the zygote gone.
        except Exception as exc:
            tpl.state = f"refused: it ended before it was ready ({type(exc).__name__})"
        finally:
            its_sock.close()
            conn.close()
            tpl.ready.set()
        with self._lock:
            closed = self._closed
        if closed:
            # (close() did not see the parent this thread was making)
            self._drop_parent(tpl)
        if tpl.state == "ok":
            # Its first worker may have gone fresh.
            self._idle_from(tpl, tpl.idle_since)
            return
        if tpl.pid:
            zygote.kill(tpl.pid)
        pid_guard.release(tpl.guard)
        if not any(w in tpl.state for w in ("the import", "thread", "descriptor", "process",
                                            "mapping", "pass through", "privileges",
                                            "not in force")):
            # Not the library's doing: try again next time.
            self._forget(tpl)
        else:
            # Kept as the record: no worker uses it.
            self._drop_parent(tpl)
    def _forget(self, tpl: _Template) -> None:
        with self._lock:
            if self._by_key.get(tpl.key) is tpl:
                del self._by_key[tpl.key]
            tpl.live = False
        self._drop_parent(tpl)

    @staticmethod
    def _drop_parent(tpl: _Template) -> None:
        """Remove a confined template's temp-dir parent (no worker of it lives)."""
        parent, tpl.tmp_parent = tpl.tmp_parent, None
        if tpl.ahead:
            tpl.ahead.close()
        pid_guard.release(tpl.guard)
        if parent:
            remove_tmpdir(parent, f"the template of {tpl.library}")

    def _unlisted(self, tpls: list[_Template]) -> list[_Template]:
        """(Holding the lock) ``tpls`` are off the list: those whose temp-dir parent can
        go now (the others' goes with their last worker)."""
        done = []
        for tpl in tpls:
            tpl.live = False
            if tpl.workers:
                self._gone.add(tpl)
            else:
                done.append(tpl)
        return done

    def _kill_templates(self, zygote: ZygoteClient, tpls: list[_Template]) -> None:
        with self._lock:
            done = self._unlisted(tpls)
        for tpl in tpls:
            if tpl.pid:
                zygote.kill(tpl.pid)
        for tpl in done:
            self._drop_parent(tpl)

    def exited(self, pid: int) -> None:
        """A process ended: if it was a ready template, the next worker makes a new one."""
        with self._lock:
            dead = [t for t in self._by_key.values() if t.pid == pid and t.state == "ok"]
            for tpl in dead:
                del self._by_key[tpl.key]
                tpl.state = "dead"
            done = self._unlisted(dead)
        for tpl in done:
            self._drop_parent(tpl)

    def released(self, tpl: Optional[_Template]) -> None:
        """A worker started from ``tpl`` ended."""
        if tpl is None:
            return
        with self._lock:
            tpl.workers = max(0, tpl.workers - 1)
            if tpl.workers:
                return
            if tpl.live:
                self._idle_from(tpl, time.monotonic())
                return
            self._gone.discard(tpl)
        self._drop_parent(tpl)

    def tick(self, now: float, zygote: Optional[ZygoteClient]) -> Optional[float]:
        """Retire the templates no worker has used for idle_timeout_s (oldest first);
        when the next may be (None: no template is idle)."""
        idle_s = self.idle_timeout_s
        if idle_s is None or zygote is None:
            return None
        with self._lock:
            unused = [t for t in self._by_key.values() if t.state == "ok" and t.workers == 0]
            idle = sorted((t for t in unused if now - t.idle_since >= idle_s),
                          key=lambda t: t.idle_since)
            for tpl in idle:
                del self._by_key[tpl.key]
        self._kill_templates(zygote, idle)
        return min((t.idle_since + idle_s for t in unused if t not in idle), default=None)

    def ready(self) -> int:
        """How many templates are ready to fork workers (no /proc read)."""
        with self._lock:
            return sum(1 for t in self._by_key.values() if t.state == "ok")

    def stats(self) -> list[dict[str, Any]]:
        with self._lock:
            tpls = list(self._by_key.values())
        out = []
        for t in tpls:
            rss, uss = tree_memory(t.pid) if t.state == "ok" else (0, 0)
            out.append({"library": t.library, "pid": t.pid or None, "state": t.state,
                        "workers": t.workers, "rss": rss, "uss": uss,
                        "confined": t.init.confine is not None})
        return out

    def close(self) -> None:
        """(The supervisor closed: every worker is gone) remove the temp-dir parents."""
        with self._lock:
            self._closed = True
            tpls = [*self._by_key.values(), *self._gone]
            self._gone.clear()
        for tpl in tpls:
            self._drop_parent(tpl)
