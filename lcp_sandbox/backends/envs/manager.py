"""The environments a supervisor's workers start with: found in the store, or built.

    ensure(requirements, where, library, tool, wait_s) ─► Built
        complete in the store?  ─► at once (a stat and a small read: no uv, no network)
        else one build per key (a thread; other callers of the key wait for the same
        one), under the key's file lock (another host process building it: waited for,
        then found complete)
        waited for at most ``wait_s`` (outside the tool's timeout) ─► 503 that says the
        build goes on; uv refused (no wheel, no solution) ─► 500 with uv's words

A build that outlives its callers' wait completes and serves the next call.  The
counters (``metrics()["env_builds"]``) are kept here.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as WaitedTooLong
from typing import Any, Optional

from ...core.outcomes import CallFailed, Unavailable
from ...core.requirements import DeclarationError, declared_in, env_key
from . import build as builder
from .build import BuildFailed, build
from .store import Built, Store, interpreter

log = logging.getLogger("lcp_sandbox")


class Environments:
    """A store and the builds in flight for it."""

    def __init__(self, root: Optional[str] = None, wait_s: float = 600.0) -> None:
        if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or wait_s < 0:
            raise ValueError(f"env_wait_s={wait_s!r}: it is a number of seconds, 0 or more")
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"envs_dir={root!r}: it is a folder (a path), or None")
        self.store = Store(os.fspath(root) if root is not None else None)
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._building: dict[str, Future[Built]] = {}
        self._counts = {"ok": 0, "failed": 0}
        # Seconds of the completed builds (last 1000)
        self._durations: list[float] = []
        self._interpreter = interpreter()

    def key(self, requirements: tuple[str, ...]) -> str:
        return env_key(requirements, self._interpreter)

    def ensure(self, requirements: tuple[str, ...], where: str, library: str, tool: str,
               wait_s: Optional[float] = None) -> Built:
        """The complete environment of ``requirements`` (declared in ``where``)."""
        key = self.key(requirements)
        found = self.store.ready(key)
        if found is not None:
            self.store.used(key, where)
            return found
        with self._lock:
            fut = self._building.get(key)
            if fut is None:
                fut = self._building[key] = Future()
                threading.Thread(target=self._build, args=(fut, key, requirements, where),
                                 name="lcp-sandbox-env", daemon=True).start()
        limit = self.wait_s if wait_s is None else wait_s
        try:
            built = fut.result(max(0.0, limit))
        except WaitedTooLong:
            raise Unavailable.not_run(library, tool, f"its environment ({where}: "
                                      f"{', '.join(requirements)}) was not ready within "
                                      f"{limit:g} s; the build goes on and a later call will "
                                      f"use it.", "env_pending") from None
        except BuildFailed as exc:
            raise CallFailed.not_run(library, tool, f"its environment could not be made "
                                     f"from {where} (wheels only, nothing is built from "
                                     f"source): {exc}") from None
        self.store.used(key, where)
        return built

    def _build(self, fut: Future[Built], key: str, requirements: tuple[str, ...],
               where: str) -> None:
        start = time.monotonic()
        try:
            with self.store.locked(key):
                # Another process made it meanwhile?
                built = self.store.ready(key)
                if built is None:
                    build(self.store, key, requirements, [where])
                    built = self.store.ready(key)
                    if built is None:
                        raise BuildFailed(f"the environment {key} was made but is not "
                                          f"complete in {self.store.root}")
                    self._done("ok", time.monotonic() - start)
                    log.info("environment %s built in %.2f s for %s", key,
                             time.monotonic() - start, where)
            fut.set_result(built)
        except BaseException as exc:
            self._done("failed", time.monotonic() - start)
            fut.set_exception(exc if isinstance(exc, BuildFailed) else BuildFailed(
                f"{type(exc).__name__}: {exc}"))
        finally:
            with self._lock:
                if self._building.get(key) is fut:
                    del self._building[key]

    def _done(self, outcome: str, seconds: float) -> None:
        with self._lock:
            self._counts[outcome] += 1
            self._durations.append(seconds)
            del self._durations[:-1000]

    def snapshot(self) -> dict[str, Any]:
        """Builds by outcome and their durations, and what confined the last builder and
        whom it ran as (``metrics()["env_builds"]``)."""
        with self._lock:
            durations = list(self._durations)
            return {**self._counts, "seconds_total": sum(durations),
                    "seconds_max": max(durations, default=0.0), "in_flight": len(self._building),
                    "builder_landlock": builder.LANDLOCK[-1] if builder.LANDLOCK else None,
                    "builder_runs_as": builder.RUNS_AS[-1] if builder.RUNS_AS else None}

    def unused(self) -> list[str]:
        """The environments of the store no declaration uses any more: every file that
        was built or used with it is gone or now declares something else (or it is not
        complete)."""
        out = []
        for entry in self.store.entries():
            if not entry["complete"] or not any(
                    self._still(where, entry) for where in entry["libraries"]):
                out.append(entry["key"])
        return out

    @staticmethod
    def _still(where: str, entry: dict[str, Any]) -> bool:
        try:
            found = declared_in(where)
        except DeclarationError:
            return False
        return found is not None and env_key(
            found.requirements, entry["interpreter"] or interpreter()) == entry["key"]

    def prune(self) -> list[str]:
        """Remove the unused environments (and leftovers of builds that died); their keys."""
        gone = self.unused()
        for key in gone:
            self.store.remove(key)
        self.store.sweep()
        return gone
