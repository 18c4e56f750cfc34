"""How the Supervisor starts its workers: forked by the zygote, or spawned.

    start_method "zygote" (Linux; zygote.py)   a pre-started process forks each worker;
                   the host keeps one forked ahead; library templates (templates.py);
                   one output pump thread (epoll) for every worker's log pipe
    start_method "spawn" (everywhere; spawn.py)   a fresh interpreter per worker, spares
                   spawned ahead; no templates (fork-only); a thread per worker's output

A library that declares its dependencies (core/requirements.py) starts its workers
with its own environment: found in the store or built (backends/envs/) before the
worker starts, waited for outside the call's timeout (``env_wait_s``), named in INIT
(and readable by a confined worker: its folder joins the read paths).

``Starts`` is the Supervisor's (a mixin, as endings.CallEnds): it reads and sets
the Supervisor's ``_zygote``, ``_pump``, ``_lock``, ``_closed``, ``_watchdog``,
``templates`` and calls its ``_on_exit``.
"""
from __future__ import annotations

import threading
import time
from typing import Optional, Union

from ... import protocol as P
from ...core.outcomes import Unavailable
from ..envs import Environments
from .handover import private_tmpdir, remove_tmpdir
from .output import OutputPump
from .process import WorkerProcess
from .slot import Slot
from .spawn import Spawner
from .templates import Templates
from .watchdog import Watchdog
from .zygote import Zygote, ZygoteGone


class Starts:
    """The Supervisor's parent of workers (zygote or spawner) and its start of one."""

    start_method: str
    templates: Templates
    _zygote: Optional[Union[Zygote, Spawner]]
    _pump: Optional[OutputPump]
    _lock: threading.Lock
    _closed: bool
    _watchdog: Watchdog
    environments: Environments

    def _on_exit(self, pid: int, status: int) -> None:
        raise NotImplementedError

    def _zyg(self) -> tuple[Union[Zygote, Spawner], Optional[OutputPump]]:
        """The zygote (or the spawner), started if need be, and the pump of its workers'
        output (a spawned worker's output has a thread of its own)."""
        with self._lock:
            if self._closed:
                raise Unavailable("The sandbox supervisor is closed.")
            if self._zygote is None or not self._zygote.alive:
                try:
                    self._zygote = (Spawner(self._on_exit) if self.start_method == "spawn"
                                    else Zygote(on_exit=self._on_exit))
                except ZygoteGone as exc:
                    raise Unavailable(f"The sandbox could not start: {exc}") from None
            if isinstance(self._zygote, Zygote):
                self._pump = self._pump or OutputPump()
            self._watchdog.start()
            return self._zygote, self._pump

    def start(self) -> None:
        """Start the zygote (or the spawner's first spare) now (else the first call does)."""
        self._zyg()

    def _templates_due(self, now: float) -> Optional[float]:
        """(the watchdog's tick) Idle templates retired; when the next may be."""
        zyg = self._zygote
        return self.templates.tick(now, zyg if isinstance(zyg, Zygote) else None)

    def _environment(self, slot: Slot, init: P.Init, tool: str,
                     deadline: Optional[float]) -> tuple[P.Init, Optional[float]]:
        """INIT with the library's environment built and named, and the call's queue
        deadline moved by the wait (it does not count against the call's timeout).  (A
        library that no longer declares anything: its slot says so, INIT as it is.)"""
        if init.environment is None:
            slot.uses_environment(None)
            return init, deadline
        declared = init.environment
        start = time.monotonic()
        requirements = tuple(declared["requirements"])
        built = self.environments.ensure(requirements, declared["where"], slot.library.name,
                                         tool)
        env = {**built.for_worker(requirements), "where": declared["where"],
               "use": "layered over the engine's interpreter (site-packages first)"}
        slot.uses_environment({k: env[k] for k in ("key", "prefix", "where", "versions", "use")})
        confine = init.confine
        if confine is not None:            # its environment, nothing else of the store
            confine = {**confine, "read_paths": [*confine.get("read_paths", ()), built.prefix]}
        moved = None if deadline is None else deadline + (time.monotonic() - start)
        return init._replace(environment=env, confine=confine), moved

    def _launch(self, slot: Slot, init: P.Init, deadline: Optional[float],
                tool: str) -> WorkerProcess:
        """Start ``slot``'s worker, attached to the slot: forked (from its library's
        template when one may serve it) or spawned."""
        zyg, pump = self._zyg()
        if isinstance(zyg, Spawner):        # (a forked worker's temp dir: templates.start)
            if init.confine is not None:
                init = init._replace(tmpdir=private_tmpdir(init.confine["run_as"]))
            try:
                return zyg.start(slot, init, deadline, tool)
            except BaseException:
                if init.tmpdir:
                    remove_tmpdir(init.tmpdir, f"a worker of {slot.library.name}")
                raise
        assert pump is not None
        return self.templates.start(zyg, slot, init, pump, deadline)
