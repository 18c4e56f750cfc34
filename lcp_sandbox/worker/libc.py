"""The C library, loaded once, for the worker's system calls (prctl, Landlock,
seccomp, capabilities, namespaces, mounts)."""
from __future__ import annotations

import ctypes

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# prctl(2) options
PR_SET_PDEATHSIG, PR_GET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP = 1, 2, 4, 22
PR_CAPBSET_READ, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 23, 24, 28
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, PR_CAP_AMBIENT_CLEAR_ALL = 47, 1, 4


def prctl(option: int, a2: int = 0, a3: int = 0, a4: int = 0, a5: int = 0) -> int:
    """prctl(2); -errno on failure."""
    rc = libc.prctl(ctypes.c_int(option), ctypes.c_ulong(a2), ctypes.c_ulong(a3),
                    ctypes.c_ulong(a4), ctypes.c_ulong(a5))
    return -ctypes.get_errno() if rc < 0 else rc

