"""Confinement of a worker (Linux): clean environment, Landlock, network namespace.

Applied once, inside a freshly forked worker, before any tool code runs, in
this order: environment, network namespace (needs /proc writes when a user
namespace is involved), Landlock (last: it can only narrow what follows).
Every step reports whether it took effect; nothing pretends.  The host
shows the report in ``stats()["protections"]``.

Landlock rules (the worker's whole life; they cannot be widened later):
    read + write   the confinement root (the tenant's workspace root, or the
                   one workspace this worker serves), a private temp dir
    read only      the library's folder, the Python installation and
                   site-packages, /usr /lib /lib64 /bin /sbin /etc, /proc/self,
                   the extra ``read_paths`` of the library's sandbox config
    devices        /dev/null, /dev/zero, /dev/urandom, /dev/random
With Landlock ABI >= 6 the worker also cannot signal processes outside its
domain, nor reach abstract unix sockets outside it.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import sys
from typing import Iterable, Optional

# Environment variables a confined worker keeps from the host (plus the library's own "env").
ENV_ALLOWLIST = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TERM", "USER", "LOGNAME", "SHELL",
                 "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONHASHSEED", "VIRTUAL_ENV")

_SYS_create_ruleset, _SYS_add_rule, _SYS_restrict_self = 444, 445, 446   # same on all Linux arches
_PR_SET_NO_NEW_PRIVS = 38
_RULE_PATH_BENEATH = 1

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
FS_MAKE_SYM, FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is unavailable."""
    try:
        v = _libc.syscall(_SYS_create_ruleset, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except Exception:
        return 0
    return max(0, int(v))


def _handled_fs(abi: int) -> int:
    rights = (1 << 13) - 1                      # ABI 1: EXECUTE .. MAKE_SYM
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def apply_landlock(read_write: Iterable[str], read_only: Iterable[str], devices: Iterable[str]) -> str:
    """Restrict this process (and its future children); returns a report string."""
    abi = landlock_abi()
    if abi < 1:
        return "unavailable (kernel without Landlock)"
    handled = _handled_fs(abi)
    scoped = (SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL) if abi >= 6 else 0
    if abi >= 6:
        attr = struct.pack("QQQ", handled, 0, scoped)
    else:
        attr = struct.pack("Q", handled)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _libc.syscall(_SYS_create_ruleset, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if fd < 0:
        return f"unavailable (create_ruleset: {os.strerror(ctypes.get_errno())})"
    ro = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    rw = handled
    dev = FS_READ_FILE | FS_WRITE_FILE | (FS_IOCTL_DEV if abi >= 5 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    try:
        for paths, rights in ((read_write, rw), (read_only, ro), (devices, dev)):
            for path in paths:
                _add_path(fd, path, rights & handled)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"failed (no_new_privs: {os.strerror(ctypes.get_errno())})"
        if _libc.syscall(_SYS_restrict_self, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            return f"failed (restrict_self: {os.strerror(ctypes.get_errno())})"
    finally:
        os.close(fd)
    return f"on (ABI {abi}{', signals and abstract sockets scoped' if scoped else ''})"


def _add_path(ruleset_fd: int, path: str, rights: int) -> None:
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return                                   # a missing path grants nothing
    try:
        if not os.path.isdir(path):
            rights &= _FILE_ONLY
        attr = struct.pack("=Qi", rights, pfd)   # packed struct landlock_path_beneath_attr
        buf = ctypes.create_string_buffer(attr, len(attr))
        _libc.syscall(_SYS_add_rule, ctypes.c_int(ruleset_fd), ctypes.c_int(_RULE_PATH_BENEATH), buf,
                      ctypes.c_uint32(0))
    finally:
        os.close(pfd)


def isolate_network() -> str:
    """Move this process into a new network namespace with only loopback, up."""
    CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWNET) != 0:
        # Without CAP_SYS_ADMIN: a user namespace first, mapping ourselves to ourselves.
        if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            return f"unavailable (unshare: {os.strerror(ctypes.get_errno())})"
        try:
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"{uid} {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"{gid} {gid} 1")
        except OSError as exc:
            return f"partial (own network namespace, uid map failed: {exc})"
    try:                                         # bring lo up: SIOCGIFFLAGS / SIOCSIFFLAGS
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            ifr = struct.pack("16sH", b"lo", 0)
            flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, ifr + b"\0" * 14)[:18])[1]
            fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 0x1) + b"\0" * 14)
    except OSError as exc:
        return f"on (own network namespace; loopback down: {exc})"
    return "on (own network namespace, loopback only)"


def allowed_environment(env: dict) -> dict:
    """The allowlisted part of an environment (what a confined worker may see)."""
    return {k: v for k, v in env.items() if k in ENV_ALLOWLIST or k.startswith("LC_")}


def clean_environment(extra: Optional[dict], host_env: dict) -> None:
    """Replace os.environ with the allowlist (values from the host) plus ``extra``."""
    keep = allowed_environment(host_env)
    keep.update({str(k): str(v) for k, v in (extra or {}).items()})
    os.environ.clear()
    os.environ.update(keep)


def python_paths() -> list[str]:
    """Where the interpreter and its packages live (read-only for a confined worker)."""
    out = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
           os.path.dirname(os.path.realpath(sys.executable))}
    for p in sys.path:
        if p and (p.endswith(("site-packages", "dist-packages")) or
                  any(p.startswith(root) for root in (sys.prefix, sys.base_prefix))):
            out.add(p)
    return sorted(out)


SYSTEM_READ_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc/self",
                     "/sys/devices/system/cpu")
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full")
