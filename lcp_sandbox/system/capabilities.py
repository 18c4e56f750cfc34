"""The capabilities a process holds, as the kernel tells in /proc/<pid>/status.

The host reads its own effective set (``CapEff``) before it starts confined workers
that run as another uid: managing them needs some of root's capabilities
(backends/local/handover.py says which, and what each is for).  Read only.
"""
from __future__ import annotations

import functools
from typing import Optional

#: The capabilities the engine names, by number (linux/capability.h).
NUMBERS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4,
           "KILL": 5, "SETGID": 6, "SETUID": 7, "SETPCAP": 8, "SYS_ADMIN": 21}


def effective(pid: str = "self") -> Optional[int]:
    """The effective set of process ``pid`` as a mask, from its status file; None where
    there is no /proc (macOS, Windows) or the line cannot be read."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return None
    return None


@functools.lru_cache(maxsize=1)
def own_effective() -> Optional[int]:
    """This process's effective set, read once (a host does not gain capabilities later;
    one that drops some must start its supervisors after it did)."""
    return effective()


def missing(names: tuple[str, ...], mask: Optional[int]) -> list[str]:
    """Those of ``names`` (keys of NUMBERS) that ``mask`` lacks; all of them when the
    mask is unknown (a check that cannot read the set fails closed)."""
    if mask is None:
        return list(names)
    return [name for name in names if not mask >> NUMBERS[name] & 1]
