"""Giving up privileges: capabilities, root, the ways to gain them back.

A worker forked from a root host is root with every capability: Landlock does not
stop reboot(2), module loading, raw sockets, setting the clock...  A confined worker
gives all of that up (drop_privileges()) once the steps that need it are done (see
the package docstring).  Capabilities are per thread: prepare() runs single-threaded.
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional, Sequence

from ...core.policy import DEFAULT_RUN_AS, run_as_ids
from ...core.syscall_numbers import ARCHES, number
from ..libc import (
    PR_CAP_AMBIENT,
    PR_CAP_AMBIENT_CLEAR_ALL,
    PR_CAP_AMBIENT_IS_SET,
    PR_CAPBSET_DROP,
    PR_CAPBSET_READ,
    PR_GET_PDEATHSIG,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    PR_SET_SECUREBITS,
)
from ..libc import libc as _libc
from ..libc import prctl as _prctl

_LINUX_CAPABILITY_VERSION_3 = 0x20080522
# SECBIT_NOROOT (+ locked): uid 0 gains no capabilities by execve; KEEP_CAPS locked off,
# NO_SETUID_FIXUP locked off (setuid keeps clearing capabilities); no ambient raise (+ locked).
_SECUREBITS = (1 << 0) | (1 << 1) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7)
# A per-tenant template: its permitted set survives setuid.
_SECBIT_KEEP_CAPS = 1 << 4
CAP_SETGID, CAP_SETUID = 6, 7


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _last_cap() -> int:
    """The highest capability this kernel knows (/proc/sys may be out of Landlock's reach)."""
    cap = 0
    while cap < 63 and _prctl(PR_CAPBSET_READ, cap + 1) >= 0:
        cap += 1
    return cap


# Once, in the zygote: its workers inherit it.
_LAST_CAP = _last_cap()


def capability_sets() -> dict[str, int]:
    """This thread's effective, permitted and inheritable sets as integers (one capget;
    ambient capabilities cannot outlast an empty permitted set)."""
    hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), f"capget: {os.strerror(ctypes.get_errno())}")
    return {k: getattr(data[0], k) | (getattr(data[1], k) << 32)
            for k in ("effective", "permitted", "inheritable")}


def capabilities() -> dict[str, int]:
    """This thread's capability sets as integers (as /proc/self/status shows them): the
    three of capability_sets(), the bounding set and the ambient set (a prctl a
    capability each, about 80 calls)."""
    out = capability_sets()
    out["bounding"] = sum(1 << c for c in range(_LAST_CAP + 1) if _prctl(PR_CAPBSET_READ, c) > 0)
    out["ambient"] = sum(1 << c for c in range(_LAST_CAP + 1)
                         if _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, c) > 0)
    return out


def set_capabilities(effective: int = 0, permitted: int = 0,
                     _with: Optional[bytes] = None) -> Optional[int]:
    """capset(2) of this thread (inheritable: none); None, or the errno it failed with.
    ``_with``: handoff.py's key, in the argument registers its filter checks."""
    hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    data[0].effective, data[0].permitted = effective & 0xFFFFFFFF, permitted & 0xFFFFFFFF
    data[1].effective, data[1].permitted = effective >> 32, permitted >> 32
    key = [0, 0] if _with is None else [int.from_bytes(_with[:8], "little"),
                                        int.from_bytes(_with[8:16], "little")]
    if _CAPSET_NR < 0:
        rc = _libc.capset(ctypes.byref(hdr), data)
    else:
        rc = _libc.syscall(ctypes.c_long(_CAPSET_NR), ctypes.byref(hdr), data, ctypes.c_ulong(0),
                           ctypes.c_ulong(0), ctypes.c_ulong(key[0]), ctypes.c_ulong(key[1]))
    return ctypes.get_errno() if rc != 0 else None


_CAPSET_NR = (number("capset", os.uname().machine) if os.uname().machine in ARCHES
              # (elsewhere libc's capset() is what there is)
              else None) or -1


def _capset(effective: int = 0, permitted: int = 0) -> None:
    err = set_capabilities(effective, permitted)
    if err is not None:
        raise OSError(err, f"capset: {os.strerror(err)}")


def drop_privileges(run_as: Optional[Sequence[int]] = None, keep: int = 0) -> str:
    """Give up every capability and, when root, become ``run_as`` (uid, gid).  ``keep``
    (a per-tenant template: handoff.py): these capabilities stay in the permitted set,
    none effective.

    Called once in a confined worker, single-threaded, before tool code runs.
    Never raises: the returned report says what holds, checked afterwards with
    capget(2), PR_CAPBSET_READ and getresuid(2), not assumed.  Starts with "uid "
    when everything that could be dropped was, with "failed" otherwise."""
    errors: list[str] = []
    ids: Optional[tuple[int, int]]
    try:
        ids = run_as_ids(DEFAULT_RUN_AS if run_as is None else run_as)
    except ValueError as exc:
        errors.append(str(exc))
        ids = None
    was_root = os.geteuid() == 0
    ppid = os.getppid()
    armed = ctypes.c_int(0)
    _libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(armed), 0, 0, 0)
    no_setpcap = _drop(ids if was_root else None, errors, keep if was_root else 0)
    # A change of uid clears the parent-death signal: a forked worker asks again, and leaves
    # if the zygote went away meanwhile (it would have missed the signal).  A spawned one
    # never had it: its parent is a host thread, which may end long before the host does
    # (it sees the host go by its control pipe).
    if armed.value:
        _prctl(PR_SET_PDEATHSIG, armed.value)
        if os.getppid() != ppid:
            os._exit(1)
    return _verified(errors, ids, was_root, no_setpcap, keep if was_root else 0)


def _drop(ids: Optional[tuple[int, int]], errors: list[str], keep: int = 0) -> bool:
    """The dropping itself (becoming ``ids`` when given); what failed goes to
    ``errors``.  Returns whether the bounding set could not be dropped (no
    CAP_SETPCAP)."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = 1
    # Capabilities are per thread: the others would keep theirs.
    if threads > 1:
        errors.append(f"{threads} threads (only this one drops its capabilities)")
    # CAP_SETPCAP
    _prctl(PR_SET_SECUREBITS, _SECUREBITS | (_SECBIT_KEEP_CAPS if keep else 0))
    no_setpcap = False
    # While CAP_SETPCAP is still held.
    for cap in range(_LAST_CAP + 1):
        if _prctl(PR_CAPBSET_DROP, cap) < 0:
            no_setpcap = True
            break
    # EINVAL before Linux 4.3: none to clear.
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    if ids is not None:
        uid, gid = ids
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            # Clears effective and permitted.
            os.setresuid(uid, uid, uid)
        except OSError as exc:
            errors.append(f"setuid {uid}:{gid}: {exc.strerror}")
    try:
        # Inheritable too.
        _capset(0, keep)
    except OSError as exc:
        errors.append(str(exc))
    # No setuid binary or file capability helps.
    if _prctl(PR_SET_NO_NEW_PRIVS, 1) < 0:
        errors.append("no_new_privs refused")
    # No ptrace or /proc/<pid>/mem by same-uid peers.
    _prctl(PR_SET_DUMPABLE, 0)
    return no_setpcap


def _verified(errors: list[str], ids: Optional[tuple[int, int]], was_root: bool,
              no_setpcap: bool, keep: int = 0) -> str:
    """The report: what holds now, read back from the kernel."""
    try:
        caps = capabilities()
    except OSError as exc:
        return f"failed ({'; '.join(errors + [str(exc)])})"
    ruid, euid, suid = os.getresuid()
    rgid, egid, sgid = os.getresgid()
    held = {k: v for k, v in caps.items() if v and k != "bounding"
            and not (k == "permitted" and v == keep)}
    wanted = None if ids is None else (ids[0],) * 3 + (ids[1],) * 3
    if was_root and ((ruid, euid, suid, rgid, egid, sgid) != wanted or os.getgroups()):
        errors.append(f"ids are {ruid},{euid},{suid}:{rgid},{egid},{sgid} groups {os.getgroups()}")
    if held or (caps["bounding"] and (was_root or not no_setpcap)):
        errors.append("capabilities remain")
    state = f"uid {euid} gid {egid}"
    if not errors:
        if not was_root:
            state += " (the host's: it is not root)"
        state += (", no capabilities" if not keep else
                  ", no capability effective (CAP_SETUID and CAP_SETGID kept in its permitted "
                  "set, for its workers' uids: see its key)")
        if caps["bounding"]:
            state += (" (bounding set kept: no CAP_SETPCAP to drop it; no_new_privs stops "
                      "gaining any)")
        return state
    sets = ", ".join(f"{k} {v:#x}" for k, v in caps.items() if v) or "no capabilities"
    return f"failed ({'; '.join(dict.fromkeys(errors))}): {state}, {sets}"
