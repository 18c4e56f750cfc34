"""A worker's own environment, put first on its path before its library imports.

    enter(INIT.environment)      (a worker before its first import; a template before its own)
        pipmaster                answers from this environment, never installs (packages.py)
        None                     the host's environment, as it is
        else, once per process:  a module the engine already loaded that the environment
                                 pins at another version?  ─► EnvironmentConflict (names it)
                                 site.addsitedir(each site-packages): .pth files honoured
        every time:              those entries first on sys.path, sys.prefix the environment's

Layering over the interpreter the zygote started keeps the fast starts (a fork, a
template per environment), as an overlay or ``activate_this`` does.  What cannot be
layered is a package the process already imported (the engine's own msgpack, psutil,
cloudpickle...) at another version: the old module would stay in ``sys.modules``, so the
library would run with a version it did not ask for.  That is refused, by name.
"""
from __future__ import annotations

import importlib
import os
import site
import sys
from typing import Any, Optional

from . import packages

# Environment key -> the sys.path entries it adds.
_LAYERED: dict[str, list[str]] = {}
_NOT_MODULES = (".dist-info", ".egg-info", ".pth", ".data")


class EnvironmentConflict(Exception):
    """The environment pins a package this process already imported at another version."""


def enter(environment: Optional[dict[str, Any]]) -> None:
    """Make ``environment`` (INIT's, built) this process's, before any library import."""
    packages.install(environment)
    if environment is None or "key" not in environment:
        return
    key = environment["key"]
    entries = _LAYERED.get(key)
    if entries is None:
        clashes = conflicts(environment)
        if clashes:
            raise EnvironmentConflict(
                f"its environment ({environment.get('where')}) cannot be layered over the "
                f"engine's interpreter: it pins {'; '.join(clashes)}. Declare the version the "
                f"engine runs with, or leave that package out of the declaration")
        before = set(sys.path)
        for folder in environment["site"]:
            # Its .pth files run, as at a venv's start.
            site.addsitedir(folder)
        entries = _LAYERED[key] = [p for p in sys.path if p not in before]
    rest = [p for p in sys.path if p not in entries]
    sys.path[:] = [*entries, *rest]
    sys.prefix = sys.exec_prefix = environment["prefix"]
    importlib.invalidate_caches()


def conflicts(environment: dict[str, Any]) -> list[str]:
    """Packages of ``environment`` whose modules this process already imported from
    elsewhere at another version ("name version (...)" each)."""
    loaded = {name for name in sys.modules if "." not in name}
    prefix = os.path.join(environment["prefix"], "")
    out = []
    for folder in environment["site"]:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        tops = {n.split(".")[0] for n in names
                if not n.endswith(_NOT_MODULES) and n != "__pycache__"}
        for top in sorted(tops & loaded):
            where = getattr(sys.modules[top], "__file__", None) or ""
            if where.startswith(prefix):
                continue
            dist, theirs = _owner(folder, top)
            ours = _host_version(dist)
            if theirs != ours:
                out.append(f"{dist} {theirs} (this process already runs {top} "
                           f"{ours or 'from the interpreter'})")
    return out


def _owner(folder: str, top: str) -> tuple[str, str]:
    """(distribution, version) of the wheel in ``folder`` that provides module ``top``."""
    # Here: 20-40 ms to import, and seldom needed.
    import importlib.metadata
    for dist in importlib.metadata.distributions(path=[folder]):
        files = dist.files or ()
        if any(str(f).split("/")[0].split(".")[0] == top for f in files):
            return dist.metadata["Name"], dist.version
    return top, "?"


def _host_version(dist: str) -> Optional[str]:
    import importlib.metadata
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
