"""Library templates, host side: which worker starts from which template.

    start(zygote, slot, init, pump, deadline)
        why_not(limits, init)?  ─► WorkerProcess.start() as before; slot.attach(proc, "fresh (why)")
        key = files (path, mtime, size), sys.path, environment, network
        the library's first worker ─► fresh, from the zygote's rehearsed spare (the fastest
                               cold start; a library one tenant uses gets no template)
        its second, no template ─► a thread makes it: INIT (nothing of a tenant) into a
                               socketpair, TEMPLATE to the zygote, its READY {"template":
                               verdict}; this worker waits for it (within its deadline)
        (an older version of the library's files: its template is retired first)
        verdict "ok"     ─► WorkerProcess.start(template=pid); slot.attach(proc, "template", key)
                            (the template gone meanwhile: slot.started_fresh(...) when forked)
        verdict refused  ─► fresh, with the reason; remembered until the file changes
    exited(pid)     a template died: forgotten (the next worker makes a new one)
    released(key)   a worker of it ended;  tick(now) retires templates with no worker
                    for idle_timeout_s (least recently used first) and says when it is
                    next due; on_idle(at) is told when a template may be retired

A template is made only for workers that are not confined: Landlock rules and a
dropped uid can only narrow, so a template shared by tenants would either reach
every tenant's workspace at import (weaker than a confined worker's import) or
forbid its workers their own.  See worker/template.py for the template process.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Optional, cast

from ... import protocol as P
from ...core.limits import Limits
from ...system.proc import tree_memory
from .output import OutputPump
from .process import WorkerProcess
from .slot import Slot
from .zygote import Forked, Zygote

#: What makes a template: the library, its files (path, mtime, size), sys.path, environment...
TemplateKey = tuple[Any, ...]


class _Template:
    __slots__ = ("key", "library", "pid", "state", "workers", "idle_since", "ready")

    def __init__(self, key: TemplateKey, library: str) -> None:
        self.key, self.library = key, library
        self.pid = 0
        self.state = "starting"
        self.workers = 0
        self.idle_since = time.monotonic()
        self.ready = threading.Event()


class Templates:
    def __init__(self, idle_timeout_s: Optional[float]) -> None:
        self.idle_timeout_s = idle_timeout_s
        self._lock = threading.Lock()
        self._by_key: dict[TemplateKey, _Template] = {}
        self._seen: set[TemplateKey] = set()    # keys whose first worker has started
        self.on_idle: Callable[[float], None] = lambda at: None   # tick(at) may retire one

    def _idle_from(self, tpl: _Template, since: float) -> None:
        tpl.idle_since = since
        if self.idle_timeout_s is not None:
            self.on_idle(since + self.idle_timeout_s)

    @staticmethod
    def why_not(limits: Limits, init: P.Init) -> str:
        """Why a worker of this library imports fresh ("" when a template may serve it)."""
        if limits.template is False:
            return "templates off for this library"
        if not init.files:
            return "code registered at run time"
        if init.confine is not None:
            return "confined: its own Landlock and uid apply before its import"
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
                tuple(sorted((lim.get("env") or {}).items())), bool(lim.get("network", True)))

    def start(self, zygote: Zygote, slot: Slot, init: P.Init, pump: OutputPump,
              deadline: Optional[float]) -> WorkerProcess:
        """Start ``slot``'s worker, from the library's template when one may serve it,
        and attach it to the slot."""
        name, bps = slot.library.name, slot.limits.log_bytes_per_s
        why = self.why_not(slot.limits, init)
        tpl = None
        if not why:
            try:
                tpl = self._template(zygote, init, deadline)
                why = "first worker of the library: no template yet" if tpl is None else \
                    "" if tpl.state == "ok" else tpl.state
            except OSError as exc:
                why = f"template not made: {exc}"
        if why or tpl is None:
            proc = WorkerProcess.start(zygote, init, pump, name, bps)
            slot.attach(proc, f"fresh ({why})")
            return proc
        proc = WorkerProcess.start(zygote, init, pump, name, bps, template=tpl.pid)
        slot.attach(proc, "template", tpl.key)
        with self._lock:
            tpl.workers += 1

        def served(fut: Future[int]) -> None:
            if fut.exception() is None and isinstance(fut, Forked) and not fut.templated:
                slot.started_fresh("its template was gone")
        proc.forked.add_done_callback(served)
        return proc

    def _template(self, zygote: Zygote, init: P.Init,
                  deadline: Optional[float]) -> Optional[_Template]:
        """The library's template, waiting while it is made; None for the library's
        first worker."""
        key = self.key(init)
        stale = []
        with self._lock:
            if key not in self._seen:
                if len(self._seen) > 10000:
                    self._seen.clear()
                self._seen.add(key)
                return None
            tpl = self._by_key.get(key)
            if tpl is None:
                for other in list(self._by_key.values()):
                    if other.library == init.library and other.key[1] != key[1] and \
                            [f[0] for f in other.key[1]] == [f[0] for f in key[1]]:
                        stale.append(self._by_key.pop(other.key))       # the file changed
                tpl = self._by_key[key] = _Template(key, init.library)
                mine = True
            else:
                mine = False
        for old in stale:
            if old.pid:
                zygote.kill(old.pid)
        if mine:       # made by a thread: a caller whose deadline passes goes fresh, it lives on
            threading.Thread(target=self._make, args=(zygote, tpl, init, time.monotonic() + 120.0),
                             name="lcp-sandbox-template", daemon=True).start()
        tpl.ready.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return tpl

    def _make(self, zygote: Zygote, tpl: _Template, init: P.Init,
              deadline: Optional[float]) -> None:
        host_sock, its_sock = P.pair()
        conn = P.Connection(host_sock)
        try:
            # Nothing of a tenant: no configuration (it may lend host objects), no handlers,
            # no workspace.  The environment and sys.path are the library's workers' own.
            conn.send(P.INIT, init._replace(configs={}, handlers=0, confine=None, tmpdir=None))
            fut = zygote.template(its_sock.fileno())
            its_sock.close()
            tpl.pid = fut.result(30.0)
            kind, payload = conn.recv_frame(deadline, {P.READY: P.READY_CAP})
            ready = cast(P.Ready, P.parse_from_worker(kind, payload, conn.decoder))
            verdict = ready.report.get("template", "")      # (str: the codec checked it)
            if verdict != "ok" and not verdict.startswith("refused: "):
                verdict = "refused: it answered out of protocol"
            tpl.state = verdict
        except TimeoutError:
            tpl.state = "refused: its import took over 120 s"
        except Exception as exc:                     # EOF, a protocol violation, the zygote gone
            tpl.state = f"refused: it ended before it was ready ({type(exc).__name__})"
        finally:
            its_sock.close()
            conn.close()
            tpl.ready.set()
        if tpl.state == "ok":
            self._idle_from(tpl, tpl.idle_since)     # (its first worker may have gone fresh)
        if tpl.state != "ok" and tpl.pid:
            zygote.kill(tpl.pid)
            if not tpl.state.startswith("refused: the import") and "thread" not in tpl.state \
                    and "descriptor" not in tpl.state and "process" not in tpl.state \
                    and "mapping" not in tpl.state:
                self._forget(tpl)                     # not the library's doing: try again next time

    def _forget(self, tpl: _Template) -> None:
        with self._lock:
            if self._by_key.get(tpl.key) is tpl:
                del self._by_key[tpl.key]

    def exited(self, pid: int) -> None:
        """A process ended: if it was a ready template, the next worker makes a new one."""
        with self._lock:
            for tpl in list(self._by_key.values()):
                if tpl.pid == pid and tpl.state == "ok":
                    del self._by_key[tpl.key]
                    tpl.state = "dead"

    def released(self, key: Optional[TemplateKey]) -> None:
        """A worker started from the template of ``key`` ended."""
        if key is None:
            return
        with self._lock:
            tpl = self._by_key.get(key)
            if tpl is not None:
                tpl.workers = max(0, tpl.workers - 1)
                if not tpl.workers:
                    self._idle_from(tpl, time.monotonic())

    def tick(self, now: float, zygote: Optional[Zygote]) -> Optional[float]:
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
        for tpl in idle:
            zygote.kill(tpl.pid)
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
                        "workers": t.workers, "rss": rss, "uss": uss})
        return out
