"""A uid per tenant from one shared template: the right to change uid, kept behind a key.

A confined template of run_as="per-tenant" serves every tenant of its library, and each
of its workers must become its own tenant's uid.  Only the process itself can change its
uid, so the template must keep CAP_SETUID and CAP_SETGID for its workers, yet the
library's import (and anything the import left behind) must not be able to use them:

    template (before the import, as root)
        drop_privileges(keep=KEEP): uid 65534, nothing effective; permitted: KEEP only
        restrict_syscalls(): the allowlist, as every confined worker
        lock(): one more filter (stacked: filters only narrow) with a 128-bit key drawn
                from the kernel into a ctypes buffer: capset, setresuid, setresgid and
                setgroups pass only with the key in argument registers 5 and 6 (which
                these calls ignore); setuid, setgid, setreuid, setregid, setfsuid and
                setfsgid never (EPERM)
        send_key(chan): the key to the zygote, then the buffer zeroed: from here on it is
                in the kernel's copy of the filter and in the zygote, nowhere in the
                template's memory (no Python object ever held it)
        import the library: capset and the uid calls answer EPERM, so the permitted set
                cannot be raised into use
    zygote: a spare of that template gets the key with its descriptors (adopt())
    spare, INIT of tenant t:  take(t's uid and gid, key): capset up, setgroups([]),
                setresgid, setresuid, capset to nothing; then its Landlock layer; tool
                code runs only after, with no capability left to change anything

The key is useless to a worker: it holds no capability once it has taken its uid.
"""
from __future__ import annotations

import ctypes
import os
import resource
from typing import Optional

from ..libc import PR_GET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_PDEATHSIG
from ..libc import libc as _libc
from ..libc import prctl as _prctl
from . import seccomp
from .privileges import CAP_SETGID, CAP_SETUID, capability_sets, set_capabilities

KEEP = (1 << CAP_SETUID) | (1 << CAP_SETGID)
KEY_BYTES = 16
GATED = ("capset", "setresuid", "setresgid", "setgroups")
NEVER = ("setuid", "setgid", "setreuid", "setregid", "setfsuid", "setfsgid")
# Argument registers none of GATED reads.
_KEY_ARGS = (4, 5)

#: In a template, between lock() and send_key(): its key (then zeroed).
_KEY = (ctypes.c_uint32 * 4)()
#: In a spare of such a template: the key the zygote sent with its descriptors.
RECEIVED: list[bytes] = []


def lock(machine: str) -> str:
    """(A per-tenant template, privileges dropped with KEEP, before the import) install
    the key filter; "" or why not (then the template must refuse to import)."""
    got = _libc.syscall(ctypes.c_long(seccomp.number_of("getrandom", machine)),
                        ctypes.byref(_KEY), ctypes.c_long(KEY_BYTES), ctypes.c_long(0))
    if got != KEY_BYTES:
        return f"no key from getrandom ({os.strerror(ctypes.get_errno())})"
    rows = seccomp.key_gate(machine, [seccomp.number_of(n, machine) for n in GATED],
                            [seccomp.number_of(n, machine) for n in NEVER], _KEY_ARGS)
    try:
        return seccomp.install_rows(rows, machine, key=_KEY)
    finally:
        ctypes.memset(rows, 0, ctypes.sizeof(rows))


def send_key(chan_fd: int) -> bool:
    """Send the key to the zygote (b"K" + key, on the template's channel) and zero it."""
    msg = (ctypes.c_char * (1 + KEY_BYTES))()
    msg[0] = b"K"
    ctypes.memmove(ctypes.byref(msg, 1), _KEY, KEY_BYTES)
    ctypes.memset(_KEY, 0, KEY_BYTES)
    try:
        return os.write(chan_fd, memoryview(msg).cast("B")) == len(msg)
    except OSError:
        return False
    finally:
        ctypes.memset(msg, 0, len(msg))


def _gated(name: str, key: bytes, *args: int) -> Optional[int]:
    """Call ``name`` with ``args`` and the key; None, or the errno it failed with."""
    machine = os.uname().machine
    lo, hi = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")
    # Registers before the key's.
    padded = [*args, 0, 0, 0, 0][:_KEY_ARGS[0]]
    rc = _libc.syscall(ctypes.c_long(seccomp.number_of(name, machine)),
                       *(ctypes.c_ulong(a) for a in padded), ctypes.c_ulong(lo),
                       ctypes.c_ulong(hi))
    return ctypes.get_errno() if rc < 0 else None


def rehearse_take() -> None:
    """(A spare of a per-tenant template, before its INIT) what take() runs that changes
    nothing, run once: the first run of its code and of the ctypes objects it makes
    paid for the pages a fork shares (copied as they are touched) on the tenant's first
    call.  Nothing gated is called: the key is not here yet."""
    armed = ctypes.c_int(0)
    _libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(armed), 0, 0, 0)
    os.getppid()
    machine = os.uname().machine
    for name in GATED:
        seccomp.number_of(name, machine)
    int.from_bytes(bytes(KEY_BYTES // 2), "little")
    ctypes.c_ulong(0)
    os.getresuid()
    os.getresgid()
    os.getgroups()
    capability_sets()
    resource.getrlimit(resource.RLIMIT_NPROC)


def take(uid: int, gid: int) -> str:
    """(A spare of a per-tenant template, single-threaded, before any tool code) become
    ``uid``:``gid`` with the key the zygote sent, and give up every capability.  The
    report, read back from the kernel: starts with "uid " when all of it holds."""
    key = RECEIVED.pop() if RECEIVED else b""
    if len(key) != KEY_BYTES:
        return "failed (no key came from the zygote with its descriptors)"
    armed = ctypes.c_int(0)
    _libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(armed), 0, 0, 0)
    ppid = os.getppid()
    errors = []
    for what, call in (("capset", lambda: set_capabilities(KEEP, KEEP, _with=key)),
                       ("setgroups", lambda: _gated("setgroups", key, 0, 0)),
                       ("setresgid", lambda: _gated("setresgid", key, gid, gid, gid)),
                       ("setresuid", lambda: _gated("setresuid", key, uid, uid, uid)),
                       ("capset to nothing", lambda: set_capabilities(0, 0, _with=key))):
        err = call()
        if err is not None:
            errors.append(f"{what}: {os.strerror(err)}")
            break
    _prctl(PR_SET_DUMPABLE, 0)
    # A change of uid clears the parent-death signal.
    if armed.value:
        _prctl(PR_SET_PDEATHSIG, armed.value)
        if os.getppid() != ppid:
            os._exit(1)
    ids = os.getresuid() + os.getresgid()
    caps = capability_sets()
    if ids != (uid,) * 3 + (gid,) * 3 or os.getgroups():
        errors.append(f"ids are {ids} groups {os.getgroups()}")
    if caps["effective"] or caps["permitted"] or caps["inheritable"]:
        errors.append("capabilities remain")
    if errors:
        return f"failed (its tenant's uid {uid} not taken from its template: {'; '.join(errors)})"
    return (f"uid {uid} gid {gid}, no capabilities (its tenant's own, taken from the shared "
            f"template with a key only the zygote held)")
