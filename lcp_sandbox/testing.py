"""Test hooks: switch protections off for one supervisor, to prove a test would
fail without them.

    with protections_off(supervisor, "landlock"):
        ...   # workers started meanwhile by that supervisor run without Landlock

Only a Python call in the host can do this: no environment variable, option or
configuration file turns a protection off, so a deployment cannot do it by
accident.  Each switch is logged as a warning, and the workers' ``stats()`` say
the protection is unavailable, switched off for a test.

    with landlock_abi_at_most(supervisor, 5):
        ...   # workers use Landlock as a kernel of that ABI would give it (no scope below 6)
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterable, Iterator

from .backends.local import Supervisor
from .core.policy import LANDLOCK_ABI_SWITCH

#: What can be switched off: Landlock, the own network namespace of a network-off
#: worker (or of one with a network policy, which then reaches the proxy by port), the
#: system call filter of a confined worker, a fresh confined worker's own root
#: (a tmpfs of the allowed paths) and its own PID namespace.
SWITCHES = frozenset({"landlock", "netns", "syscalls", "root", "pidns"})


@contextmanager
def protections_off(supervisor: Supervisor, *names: str) -> Iterator[None]:
    """Workers ``supervisor`` starts inside the block run without ``names``."""
    unknown = set(names) - SWITCHES
    if unknown:
        raise ValueError(f"unknown protections {sorted(unknown)}; known: {sorted(SWITCHES)}")
    with _switched(supervisor, names, f"run without {', '.join(sorted(names))}"):
        yield


@contextmanager
def landlock_abi_at_most(supervisor: Supervisor, abi: int) -> Iterator[None]:
    """Workers ``supervisor`` starts inside the block use Landlock as a kernel of ABI
    ``abi`` (1 to 5) gives it: its rights, and no scope below 6."""
    if not isinstance(abi, int) or not 1 <= abi <= 5:
        raise ValueError(f"abi={abi!r}: a Landlock ABI from 1 to 5")
    with _switched(supervisor, [f"{LANDLOCK_ABI_SWITCH}{abi}"],
                   f"use at most Landlock ABI {abi}"):
        yield


@contextmanager
def _switched(supervisor: Supervisor, switches: Iterable[str], what: str) -> Iterator[None]:
    """The switches on for the block (INIT carries them to the workers), said in a warning."""
    logging.getLogger("lcp_sandbox").warning(
        "TEST HOOK: workers started by this supervisor %s", what)
    before = supervisor.protections_off
    supervisor.protections_off = before | frozenset(switches)
    try:
        yield
    finally:
        supervisor.protections_off = before
