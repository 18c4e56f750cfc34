"""What each operating system gives the engine: how workers start, what confines them.

    start_method(value)     "zygote" (fork from a pre-started process: Linux only, the
                            default there) or "spawn" (a fresh interpreter per worker:
                            every OS, the default elsewhere); None: the environment
                            variable LCP_SANDBOX_START_METHOD, then the default
    missing_confinement()   the confinement mechanisms a worker asked for that this
                            system does not have (none on Linux: Landlock, seccomp,
                            namespaces and the uid drop report there, per worker, what
                            the kernel gave); a confined worker is refused (503) unless
                            the host said confine="best-effort"

``SYSTEM`` is ``sys.platform``; tests set it to simulate another system.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from ...core.policy import BEST_EFFORT

SYSTEM = sys.platform
START_METHODS = ("zygote", "spawn")
ENV_START_METHOD = "LCP_SANDBOX_START_METHOD"
#: What confines a worker on Linux, by the protections report's names.
LINUX_CONFINEMENT = {"filesystem": "Landlock (file system rules)",
                     "privileges": "a uid and capability drop",
                     "syscalls": "a seccomp system call allowlist",
                     "network": "network namespaces (network off)"}


def linux() -> bool:
    return SYSTEM.startswith("linux")


def start_method(value: Optional[str] = None) -> str:
    """The start method a Supervisor uses (ValueError: one that does not exist here)."""
    chosen = value or os.environ.get(ENV_START_METHOD) or ("zygote" if linux() else "spawn")
    if chosen not in START_METHODS:
        where = "start_method" if value else ENV_START_METHOD
        raise ValueError(f"{where}={chosen!r}: the start method is 'zygote' or 'spawn'")
    if chosen == "zygote" and not linux():
        raise ValueError(f"start_method 'zygote' forks workers from a pre-started process, which "
                         f"needs Linux; on {SYSTEM} workers start with 'spawn'")
    return chosen


def missing_confinement(confined: bool, network: object) -> list[str]:
    """The mechanisms a worker needs (confined, and/or with the network off or a network
    policy) that this system does not have."""
    if linux():
        return []
    wanted = ["filesystem", "privileges", "syscalls"] if confined else []
    if network is not True:
        wanted.append("network")
    return [LINUX_CONFINEMENT[kind] for kind in wanted]


def refusal(confined: bool, network: object, confine: object) -> str:
    """Why a worker must not start here ("" when it may): fail closed, unless the host
    asked for best effort."""
    lacking = missing_confinement(confined, network)
    if not lacking or confine == BEST_EFFORT:
        return ""
    return (f"its confinement needs {', '.join(lacking)}, which this system ({SYSTEM}) does "
            f"not have; nothing was run. With confine=\"best-effort\" it runs with what there is "
            f"(stats() says what is in force).")
