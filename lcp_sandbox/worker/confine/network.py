"""The worker's own network namespace: loopback only."""
from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

from ..libc import libc as _libc


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
    # Bring lo up: SIOCGIFFLAGS / SIOCSIFFLAGS.
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            ifr = struct.pack("16sH", b"lo", 0)
            flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, ifr + b"\0" * 14)[:18])[1]
            fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 0x1) + b"\0" * 14)
    except OSError as exc:
        return f"on (own network namespace; loopback down: {exc})"
    return "on (own network namespace, loopback only)"

