"""Landlock: the file system a confined worker may reach, for its whole life.

    read + write   the confinement root (the tenant's workspace root, or the
                   one workspace this worker serves), a private temp dir
    read only      the library's folder, the Python installation and
                   site-packages, /usr /lib /lib64 /bin /sbin /etc, /proc/self,
                   the extra ``read_paths`` of the library's sandbox config
    devices        /dev/null, /dev/zero, /dev/urandom, /dev/random
With Landlock ABI >= 6 the worker also cannot signal processes outside its
domain, nor reach abstract unix sockets outside it.  The rules cannot be
widened later; the rule paths are opened now, while they are all reachable.

A worker with a network policy and no network namespace of its own also gets a
layer of TCP rules (restrict_tcp(), ABI >= 4): it may connect to one port (the
host's egress proxy) and bind none.  Landlock checks the port, not the address:
egress_dial.py says why the address is held too.
"""
from __future__ import annotations

import ctypes
import os
import struct
from typing import Iterable

from ..libc import PR_SET_NO_NEW_PRIVS, prctl
from ..libc import libc as _libc

# Same on all Linux arches.
_SYS_create_ruleset, _SYS_add_rule, _SYS_restrict_self = 444, 445, 446
_RULE_PATH_BENEATH = 1

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
FS_MAKE_SYM, FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1
#: What its report says when the layer scopes signals and abstract sockets (ABI >= 6).
SCOPED = "signals and abstract sockets scoped"
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
_RULE_NET_PORT = 2
#: The first ABI with TCP rules (Linux 6.7).
NET_ABI = 4
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full")


#: The highest ABI used, below the kernel's (lcp_sandbox.testing.landlock_abi_at_most(): a
#: test of what an older kernel gives; None: the kernel's).
ABI_CAP: list[int] = []


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (at most ABI_CAP), 0 when Landlock is unavailable."""
    try:
        v = _libc.syscall(_SYS_create_ruleset, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except Exception:
        return 0
    return max(0, min([int(v), *ABI_CAP]))


def _handled_fs(abi: int) -> int:
    # ABI 1: EXECUTE .. MAKE_SYM.
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def apply_landlock(read_write: Iterable[str], read_only: Iterable[str],
                   devices: Iterable[str]) -> str:
    """Restrict this process (and its future children); returns a report string."""
    got = open_ruleset()
    if isinstance(got, str):
        return got
    fd, abi = got
    try:
        add_rules(fd, abi, read_write, read_only, devices)
        return enforce(fd, abi)
    finally:
        os.close(fd)


def open_ruleset() -> "tuple[int, int] | str":
    """A new ruleset (its fd, the ABI) handling every right this kernel knows, or why not.
    A spare of a confined template opens its own while it waits (confine.ready_layer())."""
    abi = landlock_abi()
    if abi < 1:
        return "unavailable (kernel without Landlock)"
    handled = _handled_fs(abi)
    if abi >= 6:
        attr = struct.pack("QQQ", handled, 0, SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL)
    else:
        attr = struct.pack("Q", handled)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _libc.syscall(_SYS_create_ruleset, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if fd < 0:
        return f"unavailable (create_ruleset: {os.strerror(ctypes.get_errno())})"
    return fd, abi


def add_rules(fd: int, abi: int, read_write: Iterable[str], read_only: Iterable[str],
              devices: Iterable[str]) -> None:
    """Add the rules: all rights beneath ``read_write``, reading and executing beneath
    ``read_only``, reading and writing the ``devices``."""
    handled = _handled_fs(abi)
    ro = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    dev = (FS_READ_FILE | FS_WRITE_FILE | (FS_IOCTL_DEV if abi >= 5 else 0)
           | (FS_TRUNCATE if abi >= 3 else 0))
    for paths, rights in ((read_write, handled), (read_only, ro), (devices, dev)):
        for path in paths:
            _add_path(fd, path, rights & handled)


def enforce(fd: int, abi: int) -> str:
    """Restrict this process to the ruleset ``fd`` (not closed here); the report."""
    rc = prctl(PR_SET_NO_NEW_PRIVS, 1)
    if rc != 0:
        return f"failed (no_new_privs: {os.strerror(-rc)})"
    if _libc.syscall(_SYS_restrict_self, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
        return f"failed (restrict_self: {os.strerror(ctypes.get_errno())})"
    return f"on (ABI {abi}{', ' + SCOPED if abi >= 6 else ''})"


def _add_path(ruleset_fd: int, path: str, rights: int) -> None:
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        # A missing path grants nothing.
        return
    try:
        if not os.path.isdir(path):
            rights &= _FILE_ONLY
        # Packed struct landlock_path_beneath_attr.
        attr = struct.pack("=Qi", rights, pfd)
        buf = ctypes.create_string_buffer(attr, len(attr))
        _libc.syscall(_SYS_add_rule, ctypes.c_int(ruleset_fd), ctypes.c_int(_RULE_PATH_BENEATH),
                      buf, ctypes.c_uint32(0))
    finally:
        os.close(pfd)



def restrict_tcp(port: int) -> str:
    """A layer of TCP rules on this process (and its future children): connect to
    ``port`` only (any address: the caller keeps the address to loopback), bind nothing.
    "" when in force, else why not."""
    abi = landlock_abi()
    if abi < NET_ABI:
        return f"Landlock ABI {abi} has no TCP rules"
    attr = struct.pack("QQ", 0, NET_BIND_TCP | NET_CONNECT_TCP)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _libc.syscall(_SYS_create_ruleset, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if fd < 0:
        return f"create_ruleset: {os.strerror(ctypes.get_errno())}"
    try:
        # packed struct landlock_net_port_attr: allowed_access, port
        rule = struct.pack("=QQ", NET_CONNECT_TCP, port)
        rbuf = ctypes.create_string_buffer(rule, len(rule))
        if _libc.syscall(_SYS_add_rule, ctypes.c_int(fd), ctypes.c_int(_RULE_NET_PORT), rbuf,
                         ctypes.c_uint32(0)) != 0:
            return f"add_rule: {os.strerror(ctypes.get_errno())}"
        state = enforce(fd, abi)
        return "" if state.startswith("on") else state
    finally:
        os.close(fd)
