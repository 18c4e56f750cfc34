"""Confined workers of each start kind, for the tests of confinement and of hostile workers.

    fresh     Supervisor(confine=True), no tenants_root: forked from the zygote, confined
              after the fork (as before confined templates)
    base      Supervisor(confine=True, tenants_root=...), the library marked
              "trusted_import": false: forked from the base (the tenant-independent
              confinement applied, nothing imported), imports after its own layer
    template  the same, trusted: forked from the library's confined template (imported)

``Confined(kind, tenants_root).binding(folder, tenant, ...)`` makes a binding whose
workers start that way: before the first binding of a (folder, configuration), a warm-up
tenant loads every library of the folder and the templates that follow are waited for.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Optional

import pytest

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox import protocol as P
from lcp_sandbox.binding.objects import HostObjects
from lcp_sandbox.testing import landlock_abi_at_most
from lcp_sandbox.worker.confine.apart import namespaces_refused
from lcp_sandbox.worker.confine.landlock import landlock_abi

KINDS = ("fresh", "base", "template")
#: A filter refuses namespaces to this test process, and so to the workers it starts.
NAMESPACES_REFUSED = namespaces_refused()


def started_as(kind: str, start: str) -> bool:
    """Whether a worker's stats()["start"] is of ``kind``."""
    return start == "template" if kind == "template" else start.startswith(kind + " (")


class Confined:
    def __init__(self, kind: str, tenants_root: Path, **supervisor_kw) -> None:
        self.kind, self.tenants_root = kind, Path(tenants_root)
        self.tenants_root.mkdir(parents=True, exist_ok=True)
        self.sup = Supervisor(confine=True, tenants_root=None if kind == "fresh" else
                              str(tenants_root), **supervisor_kw)
        if kind != "fresh" and self.sup.start_method == "spawn":
            self.sup.close()
            pytest.skip("fork-only (zygote path): confined templates and bases fork their "
                        "workers; the spawn path starts every confined worker fresh")
        # LCP_TEST_LANDLOCK_ABI=N (.ci/run): these workers use Landlock as a kernel of ABI N
        capped = int(os.environ.get("LCP_TEST_LANDLOCK_ABI") or 0)
        if capped:
            self._capped = landlock_abi_at_most(self.sup, capped)
            self._capped.__enter__()
        abi = min(landlock_abi(), capped or 99)
        # Landlock's scope (ABI 6+) keeps abstract unix sockets apart; without it a network-on
        # confined worker gets no unix socket at all (worker/confine/seccomp.py)
        self.scoped = abi >= 6
        if kind != "fresh" and abi < 6:
            self.sup.close()
            pytest.skip(f"Landlock ABI {abi} here: without ABI 6's signal scope a worker forked "
                        f"from a confined template (or base) is kept apart by a uid of its "
                        f"tenant's own, or refused (tests/confinement/test_host_kinds.py attacks both)")
        self._warmed: set = set()
        # A fresh worker forked from the zygote has a PID namespace and a root of its own
        # (a spawned one, on the spawn path, relies on Landlock as forked ones do), unless
        # a filter refuses namespaces here (a default container: without_landlock.py
        # --docker-default)
        self.own_namespaces = (kind == "fresh" and self.sup.start_method == "zygote"
                               and not NAMESPACES_REFUSED)
        self.made: list = []

    def configs(self, folder, host_tool_configs: Optional[dict]) -> Optional[dict]:
        """``host_tool_configs`` with every library of ``folder`` untrusted at import (base)."""
        if self.kind != "base":
            return host_tool_configs
        cfgs = {k: dict(v) for k, v in (host_tool_configs or {}).items()}
        probe = SandboxedBinding(tools_folders=[str(folder)], supervisor=self.sup)
        for lib in probe.catalog.libraries():
            cfg = cfgs.setdefault(lib.name, {})
            cfg["sandbox"] = {**cfg.get("sandbox", {}), "trusted_import": False}
        return cfgs

    def binding(self, folder, tenant: str, root: Optional[Path] = None,
                host_tool_configs: Optional[dict] = None, **kw) -> SandboxedBinding:
        """A binding of ``tenant`` with its root (default: tenants_root/tenant)."""
        root = Path(root) if root is not None else self.tenants_root / tenant
        root.mkdir(parents=True, exist_ok=True)
        cfgs = self.configs(folder, host_tool_configs)
        if self.kind != "fresh":
            self.warm(folder, cfgs, kw.get("confine"))
        kw.setdefault("workspace", str(root))
        b = SandboxedBinding(tools_folders=[str(folder)], supervisor=self.sup, tenant=tenant,
                             workspace_root=str(root), host_tool_configs=cfgs, **kw)
        self.made.append(b)
        return b

    def warm(self, folder, cfgs: Optional[dict], confine=None) -> None:
        """Load every library of ``folder`` once (with ``cfgs`` and ``confine``) in a
        throwaway tenant, so that the templates its first workers owe are made; wait for them."""
        mark = (str(folder), repr(sorted((cfgs or {}).items(), key=str)),
                tuple(sorted(self.sup.protections_off)), confine)   # (a key of its own, too)
        if mark in self._warmed:
            return
        self._warmed.add(mark)
        tenant = f"warm-{uuid.uuid4().hex[:8]}"
        root = self.tenants_root / tenant
        root.mkdir(parents=True, exist_ok=True)
        w = SandboxedBinding(tools_folders=[str(folder)], supervisor=self.sup, tenant=tenant,
                             workspace=str(root), workspace_root=str(root), host_tool_configs=cfgs,
                             confine=confine)
        for _ in range(2):                       # the second round: the base / the template
            for lib in w.catalog.libraries():
                try:
                    self.sup.run(w._spec(lib, str(root)), P.Load(str(root), 0),
                                 HostObjects(w._named(lib)), tool="warm-up")
                except Exception:
                    pass                         # (a configuration the test expects refused)
                self.sup.stop(tenant, lib.key)
                self.settled()

    def settled(self, timeout: float = 60.0) -> None:
        """Wait until no template is being made."""
        deadline = time.monotonic() + timeout
        while any(t["state"] == "starting" for t in self.sup.pool_stats()["templates"]):
            assert time.monotonic() < deadline, self.sup.pool_stats()["templates"]
            time.sleep(0.01)

    def check(self, b: SandboxedBinding) -> None:
        """Every worker of ``b`` started as this kind."""
        for s in b.stats():          # (code registered at run time: never a library template)
            if s["pid"] and "code registered at run time" not in s["start"]:
                spawned = self.sup.start_method == "spawn" and s["start"] == "spawn"
                assert spawned or started_as(self.kind, s["start"]), (self.kind, s["start"])

    def close(self) -> None:
        """Close everything, having checked how every worker of its bindings started."""
        try:
            for b in self.made:
                self.check(b)
        finally:
            for b in self.made:
                b.close()
            self.sup.close()
