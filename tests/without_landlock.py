"""Run a command as on a kernel without Landlock: a seccomp filter makes the three
landlock_* system calls (444-446 on every architecture) answer ENOSYS, for this process
and everything it starts (no_new_privs first, as an unprivileged filter needs).

    python tests/without_landlock.py COMMAND [ARGS...]
"""
import ctypes
import os
import struct
import sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
ENOSYS = 38
PROGRAM = [                     # (code, jt, jf, k) of classic BPF
    (0x20, 0, 0, 0),            # A = seccomp_data.nr
    (0x35, 0, 2, 444),          # A >= 444 ? next : allow
    (0x25, 1, 0, 446),          # A > 446 ? allow : next
    (0x06, 0, 0, 0x00050000 | ENOSYS),   # SECCOMP_RET_ERRNO | ENOSYS
    (0x06, 0, 0, 0x7FFF0000),   # SECCOMP_RET_ALLOW
]


def install() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    code = b"".join(struct.pack("HBBI", *ins) for ins in PROGRAM)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = struct.pack("HxxxxxxQ", len(PROGRAM), ctypes.addressof(buf))   # struct sock_fprog
    fprog = ctypes.create_string_buffer(prog, len(prog))
    arg = ctypes.c_ulong
    if libc.prctl(PR_SET_NO_NEW_PRIVS, arg(1), arg(0), arg(0), arg(0)) != 0 or libc.prctl(
            PR_SET_SECCOMP, arg(SECCOMP_MODE_FILTER), arg(ctypes.addressof(fprog)), arg(0),
            arg(0)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


if __name__ == "__main__":
    install()
    os.execvp(sys.argv[1], sys.argv[1:])
