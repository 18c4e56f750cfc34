"""What a worker is started with: the INIT message, built in one place.

    build_init(library, limits, root, host_tool_configs, handlers) ─► protocol.Init
        configs      the library's own stems' host_tool_configs; what cannot be
                     pickled (a callable) goes as a reference the worker calls back
        environment  the host's whole, or (confined) only the allowlisted part:
                     a confined worker never receives the rest; bytes, as
                     os.environb has them
        confine      {root, read_paths} when confined (the host adds run_as and
                     the temp dir it made, just before the fork)
        environment  the requirements the library declares, and where (None: the
                     host's environment); the backend has them built before it starts
                     the worker (backends/envs/)
"""
from __future__ import annotations

import sys
from typing import Iterable, Optional

from .. import protocol as P
from ..core.discovery import Library
from ..core.limits import Limits
from ..core.outcomes import CallFailed
from ..core.policy import allowed_environment, host_environment
from ..core.requirements import DeclarationError, Declared, declared, normalise
from ..protocol import Ref, sendable


def build_init(library: Library, limits: Limits, root: str, host_tool_configs: dict,
               handlers: int) -> P.Init:
    """The INIT of a worker of ``library`` (``root``: its confinement root, "" if none)."""
    configs = {}
    for stem in library.stems:
        cfg = host_tool_configs.get(stem)
        if isinstance(cfg, dict):
            configs[stem] = {k: v if sendable(v) else Ref(["cfg", stem, k]) for k, v in cfg.items()}
    confine = None
    env = host_environment()
    if root:
        read_paths = [str(p) for p in (library.root, *limits.read_paths) if p]
        confine = {"root": root, "read_paths": read_paths}
        env = allowed_environment(env)
    return P.Init(library.name, [str(f) for f in library.files], library.source, configs, handlers,
                  list(sys.path), env, confine, None, [],
                  {k: getattr(limits, k) for k in limits.__dataclass_fields__},
                  environment_of(library, limits))


def environment_of(library: Library, limits: Limits) -> Optional[dict]:
    """What the library needs: the host's ``"sandbox": {"requirements": [...]}``, else what
    it declares (None: nothing, it uses the host's environment); a declaration that cannot
    be read ends the call with a 500 naming the file."""
    try:
        if limits.requirements is not None:
            found: Optional[Declared] = Declared(
                normalise(limits.requirements, library.name),
                f"host_tool_configs[{library.name!r}]['sandbox']['requirements']")
        else:
            found = declared([str(f) for f in library.files],
                             str(library.root) if library.root else None)
    except DeclarationError as exc:
        raise CallFailed(f"[{library.name}] not run: its dependencies cannot be read: "
                         f"{exc}") from None
    if found is None or not found.requirements:
        return None
    return {"requirements": list(found.requirements), "where": found.where}


def read_declarations(libraries: Iterable[Library]) -> None:
    """Read what ``libraries`` declare now, at discovery, so a first call finds it parsed
    (core/requirements.py keeps it while the files are unchanged); a declaration that
    cannot be read is reported by the library's calls."""
    for library in libraries:
        if library.files:
            try:
                declared([str(f) for f in library.files],
                         str(library.root) if library.root else None)
            except DeclarationError:
                pass
