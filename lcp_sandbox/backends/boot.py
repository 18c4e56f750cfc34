"""How a fresh interpreter of the engine is started: the zygote's, a spawned worker's, the
environment builder's.

    python -I -c BOOT(entry) ARG ENGINE_DIR/lcp_sandbox

``-I``: neither the host's CWD nor PYTHONPATH nor user site-packages on its sys.path.
The boot line makes the host's own copy of the engine's folder the ``lcp_sandbox`` package
(not whatever ``lcp_sandbox`` the environment would find first), then runs ``entry``.
"""
from __future__ import annotations

import os
import sys

from ..core.policy import ENGINE_DIR, allowed_environment

# The package is registered by its folder, its __init__ not run: that is the host's front
# door (its lazy names, logging's NullHandler), which no worker uses, and logging alone
# is about 8 ms of a spawned worker's start.
_LOADER = ("import sys\n"
           "m = sys.modules['lcp_sandbox'] = type(sys)('lcp_sandbox')\n"
           "m.__path__ = [sys.argv[2]]\n")
#: What the interpreter needs to start at all, kept even in an allowlisted environment
#: (Windows cannot start Python, nor open a socket, without SYSTEMROOT).
_TO_START = ("LD_LIBRARY_PATH", "PYTHONHOME", "SYSTEMROOT", "WINDIR", "COMSPEC", "PATHEXT")


def boot_argv(entry: str, arg: str) -> list[str]:
    """The command line of a fresh engine process that runs ``entry`` (Python code,
    ``sys.argv[1]`` is ``arg``)."""
    return [sys.executable, "-I", "-c", _LOADER + entry, arg,
            os.path.join(ENGINE_DIR, "lcp_sandbox")]


def boot_environment() -> dict[str, str]:
    """The allowlisted part of the host's environment, plus what starting needs: the
    environment of a process that must never hold the host's secrets."""
    env = allowed_environment(dict(os.environ))
    env.update({k: os.environ[k] for k in _TO_START if k in os.environ})
    return env
