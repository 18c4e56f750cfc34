"""Run a command as on a kernel without Landlock: a seccomp filter makes the three
landlock_* system calls (444-446 on every architecture) answer ENOSYS, for this process
and everything it starts (no_new_privs first, as an unprivileged filter needs).  With
--no-userns, unshare() answers EPERM too, as where the system refuses unprivileged user
namespaces (Ubuntu 24.04's kernel.apparmor_restrict_unprivileged_userns).

    python tests/without_landlock.py [--no-userns] [--keep-landlock] COMMAND [ARGS...]
"""
import ctypes
import os
import struct
import sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
ENOSYS = 38
EPERM = 1
UNSHARE = {"x86_64": 272, "aarch64": 97}


def program(no_userns: bool, landlock: bool = False) -> list:
    """(code, jt, jf, k) of classic BPF."""
    unshare = UNSHARE[os.uname().machine] if no_userns else 0xFFFF
    first = 0xFFFF if landlock else 444
    return [
        (0x20, 0, 0, 0),            # A = seccomp_data.nr
        (0x15, 4, 0, unshare),      # A == unshare ? EPERM : next
        (0x35, 0, 2, first),        # A >= 444 ? next : allow
        (0x25, 1, 0, 446),          # A > 446 ? allow : next
        (0x06, 0, 0, 0x00050000 | ENOSYS),   # SECCOMP_RET_ERRNO | ENOSYS
        (0x06, 0, 0, 0x7FFF0000),   # SECCOMP_RET_ALLOW
        (0x06, 0, 0, 0x00050000 | EPERM),
    ]


def install(no_userns: bool = False, landlock: bool = False) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    prog_ = program(no_userns, landlock)
    code = b"".join(struct.pack("HBBI", *ins) for ins in prog_)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = struct.pack("HxxxxxxQ", len(prog_), ctypes.addressof(buf))     # struct sock_fprog
    fprog = ctypes.create_string_buffer(prog, len(prog))
    arg = ctypes.c_ulong
    if libc.prctl(PR_SET_NO_NEW_PRIVS, arg(1), arg(0), arg(0), arg(0)) != 0 or libc.prctl(
            PR_SET_SECCOMP, arg(SECCOMP_MODE_FILTER), arg(ctypes.addressof(fprog)), arg(0),
            arg(0)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


if __name__ == "__main__":
    args = sys.argv[1:]
    flags = set()
    while args and args[0].startswith("--"):
        flags.add(args.pop(0))
    install("--no-userns" in flags, "--keep-landlock" in flags)
    os.execvp(args[0], args)
