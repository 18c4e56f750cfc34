"""Seccomp: no AF_UNIX socket a confined worker could point at a path.

Landlock (ABI <= 7) does not cover connect() to a pathname unix socket, and an own
network namespace does not either (those sockets live in the file system): a
confined tool could talk to a socket another tenant serves in its workspace, or to
a host service (a docker socket would be one).  With the network off, a seccomp
filter closes every way this process has to get an AF_UNIX socket it could point
at a path:
  socket(AF_UNIX, ...)            EACCES; so is every family but AF_INET, AF_INET6
                                  (both in the worker's own network namespace) and
                                  AF_NETLINK: AF_VSOCK, for one, is in no network
                                  namespace and reaches the hypervisor's services
  socketpair(), datagram type     EACCES: an AF_UNIX datagram socket can sendto()
                                  or connect() any path even when paired
  socketpair(), stream/seqpacket  allowed: already connected, connect() and a
                                  sendto() address fail (multiprocessing and asyncio
                                  use these)
  io_uring_setup/enter/register   EPERM (IORING_OP_SOCKET creates sockets)
  x32 calls (nr | 0x40000000), any other architecture's calls (i386 int 0x80 with
  its socketcall(2), arm32 compat)          EPERM, whatever the call
Sockets the worker already has: only its channel to the host, a connected stream
socket (connect() on it fails with EISCONN).  The host never passes descriptors.
Opening a socket file, directly or through /proc/<pid>/fd, fails with ENXIO.
"""
from __future__ import annotations

import ctypes
import errno
import os
import socket
import sys

from ..libc import PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, libc as _libc, prctl as _prctl

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NR = {  # socket, socketpair, seccomp
    "x86_64": (41, 53, 317),
    "aarch64": (198, 199, 277),
}
_NR_IO_URING_FIRST, _NR_IO_URING_END = 425, 428          # same on both
_X32_BIT = 0x40000000
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC, _SECCOMP_MODE_FILTER = 1, 1, 2
_BPF_LD_W_ABS, _BPF_JEQ, _BPF_JGE, _BPF_AND, _BPF_RET = 0x20, 0x15, 0x35, 0x54, 0x06
_OFF_NR, _OFF_ARCH, _OFF_ARG0, _OFF_ARG1 = 0, 4, 16, 24     # struct seccomp_data (little endian)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _assemble(program: list) -> list[tuple[int, int, int, int]]:
    """Classic BPF with named forward jumps: items are a label (str) or
    (code, k, jump-if-true label or None, jump-if-false label or None)."""
    labels, at = {}, 0
    for item in program:
        if isinstance(item, str):
            labels[item] = at
        else:
            at += 1
    out = []
    for item in program:
        if isinstance(item, str):
            continue
        code, k, jt, jf = item
        here = len(out) + 1
        out.append((code, labels[jt] - here if jt else 0, labels[jf] - here if jf else 0, k))
    assert all(0 <= o[1] <= 255 and 0 <= o[2] <= 255 for o in out)
    return out


def unix_socket_filter(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter of block_unix_sockets() for ``machine``: (code, jt, jf, k) rows."""
    sock, pair, _ = _NR[machine]
    refuse = _SECCOMP_RET_ERRNO | errno.EACCES
    deny = _SECCOMP_RET_ERRNO | errno.EPERM
    prog = [
        (_BPF_LD_W_ABS, _OFF_ARCH, None, None),
        (_BPF_JEQ, _AUDIT_ARCH[machine], None, "deny"),           # another ABI: refuse all
        (_BPF_LD_W_ABS, _OFF_NR, None, None),
    ]
    if machine == "x86_64":
        prog.append((_BPF_JGE, _X32_BIT, "deny", None))            # x32 numbers
    prog += [
        (_BPF_JEQ, sock, "socket", None),
        (_BPF_JEQ, pair, "socketpair", None),
        (_BPF_JGE, _NR_IO_URING_FIRST, None, "allow"),
        (_BPF_JGE, _NR_IO_URING_END, "allow", "deny"),
        "socket",
        (_BPF_LD_W_ABS, _OFF_ARG0, None, None),                    # domain (the kernel reads an int)
        (_BPF_JEQ, socket.AF_INET, "allow", None),
        (_BPF_JEQ, socket.AF_INET6, "allow", None),
        (_BPF_JEQ, socket.AF_NETLINK, "allow", "refuse"),
        "socketpair",
        (_BPF_LD_W_ABS, _OFF_ARG1, None, None),                    # type, with SOCK_* flags
        (_BPF_AND, 0xF, None, None),                               # SOCK_TYPE_MASK
        (_BPF_JEQ, socket.SOCK_STREAM, "allow", None),
        (_BPF_JEQ, socket.SOCK_SEQPACKET, "allow", "refuse"),
        "refuse", (_BPF_RET, refuse, None, None),
        "deny", (_BPF_RET, deny, None, None),
        "allow", (_BPF_RET, _SECCOMP_RET_ALLOW, None, None),
    ]
    return _assemble(prog)


def block_unix_sockets() -> str:
    """Install the seccomp filter above on this process (all its threads)."""
    machine = os.uname().machine
    if machine not in _NR or sys.byteorder != "little":
        return f"unavailable (no filter for the {machine} architecture)"
    rows = unix_socket_filter(machine)
    insns = (_SockFilter * len(rows))(*[_SockFilter(c, jt, jf, k) for c, jt, jf, k in rows])
    prog = _SockFprog(len(rows), insns)
    if _prctl(PR_SET_NO_NEW_PRIVS, 1) < 0:
        return "unavailable (no_new_privs refused)"
    rc = _libc.syscall(ctypes.c_long(_NR[machine][2]), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                       ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if rc < 0 and ctypes.get_errno() == errno.ENOSYS:       # kernel < 3.17: this thread only
        rc = _prctl(PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog))
    if rc < 0:
        return f"unavailable (seccomp: {os.strerror(ctypes.get_errno())})"
    if rc > 0:
        return f"failed (thread {rc} could not take the filter)"
    try:                                                     # trust, but check
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
    except PermissionError:
        return "blocked (seccomp: only AF_INET, AF_INET6 and AF_NETLINK sockets can be created)"
    return "failed (the filter is installed but socket(AF_UNIX) still works)"

