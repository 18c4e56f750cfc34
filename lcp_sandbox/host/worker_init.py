"""What a worker is started with: the INIT message, built in one place.

    build_init(library, limits, root, host_tool_configs, handlers) ─► protocol.Init
        configs      the library's own stems' host_tool_configs; what cannot be
                     pickled (a callable) goes as a reference the worker calls back
        environment  the host's whole, or (confined) only the allowlisted part:
                     a confined worker never receives the rest; bytes, as
                     os.environb has them
        confine      {root, read_paths} when confined (the host adds run_as and
                     the temp dir it made, just before the fork)
"""
from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

from .. import protocol as P
from ..core.discovery import Library
from ..core.policy import allowed_environment
from ..protocol import Ref, is_plain
from .limits import Limits


def sendable(value: Any) -> bool:
    """Whether ``value`` can be sent to a worker as it is (else it is lent)."""
    if is_plain(value):
        return True
    if callable(value):
        return False
    try:
        pickle.dumps(value)
        return True
    except Exception:
        return False


def host_environment() -> dict:
    """The host's environment as bytes names and values, the way the worker sets it
    (os.environb): copying the bytes behind os.environ costs 1 us, decoding them
    30 us; the worker then compares and sets bytes, with no encoding either."""
    return dict(os.environ._data)                # type: ignore[attr-defined]  (POSIX: bytes)


def _allowed(env: dict) -> dict:
    """The allowlisted part of a bytes environment (core/policy.py decides on names)."""
    names = allowed_environment(dict.fromkeys(os.fsdecode(k) for k in env))
    return {k: v for k, v in env.items() if os.fsdecode(k) in names}


def build_init(library: Library, limits: Limits, root: str, host_tool_configs: dict, handlers: int) -> P.Init:
    """The INIT of a worker of ``library`` (``root``: its confinement root, "" if none)."""
    stems = [Path(f).stem for f in library.files] or [library.name]
    configs = {}
    for stem in stems:
        cfg = host_tool_configs.get(stem)
        if isinstance(cfg, dict):
            configs[stem] = {k: v if sendable(v) else Ref(["cfg", stem, k]) for k, v in cfg.items()}
    confine = None
    env = host_environment()
    if root:
        confine = {"root": root, "read_paths": [str(p) for p in (library.root, *limits.read_paths) if p]}
        env = _allowed(env)
    disabled = [x.strip() for x in os.environ.get("LCP_SANDBOX_DISABLE", "").split(",") if x.strip()]
    return P.Init(library.name, [str(f) for f in library.files], library.source, configs, handlers,
                  list(sys.path), env, confine, None, disabled,
                  {k: getattr(limits, k) for k in limits.__dataclass_fields__})
