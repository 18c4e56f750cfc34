"""The capabilities a process holds, as the kernel tells in /proc/<pid>/status.

The host reads its own effective set (``CapEff``) before it starts confined workers
that run as another uid: managing them needs some of root's capabilities
(backends/local/confine/handover.py says which, and what each is for).  Read only.
"""
from __future__ import annotations

import functools
from typing import Optional

#: The capabilities the engine names, by number (linux/capability.h).
NUMBERS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4,
           "KILL": 5, "SETGID": 6, "SETUID": 7, "SETPCAP": 8, "SYS_ADMIN": 21}


def sets(pid: str = "self") -> dict[str, int]:
    """The capability sets of process ``pid`` as masks, by the status file's names
    (CapEff, CapBnd...); empty where there is no /proc (macOS, Windows) or it cannot be
    read."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Cap"):
                    name, value = line.split(b":", 1)
                    found[name.decode()] = int(value, 16)
    except (OSError, ValueError):
        return {}
    return found


@functools.lru_cache(maxsize=1)
def own() -> dict[str, int]:
    """This process's sets, read once (a host does not gain capabilities later; one that
    drops some must start its supervisors after it did)."""
    return sets()


def effective() -> Optional[int]:
    """What this process may use now (CapEff); None when it cannot be read."""
    return own().get("CapEff")


def of_children() -> Optional[int]:
    """What a program this root process starts holds (the zygote, a spawned worker): an
    exec'd root gets its bounding set (CapBnd), of which this process may use only what it
    holds itself (CapEff & CapBnd); None when it cannot be read."""
    got = own()
    if "CapEff" not in got or "CapBnd" not in got:
        return None
    return got["CapEff"] & got["CapBnd"]


def missing(names: tuple[str, ...], mask: Optional[int]) -> list[str]:
    """Those of ``names`` (keys of NUMBERS) that ``mask`` lacks; all of them when the
    mask is unknown (a check that cannot read the set fails closed)."""
    if mask is None:
        return list(names)
    return [name for name in names if not mask >> NUMBERS[name] & 1]
