"""Run a command as on a kernel without Landlock, or inside a default container: a seccomp
filter installed here holds for this process and everything it starts.

    python tests/support/without_landlock.py [--no-userns] [--keep-landlock] [--docker-default]
                                     COMMAND [ARGS...]
    python tests/support/without_landlock.py --readable-python-only COMMAND [ARGS...]

    (default)          the three landlock_* system calls (444-446 on every architecture)
                       answer ENOSYS, as on a kernel without Landlock
    --keep-landlock    they stay (for the other switches alone)
    --no-userns        unshare() answers EPERM too, as where the system refuses
                       unprivileged user namespaces (Ubuntu 24.04's
                       kernel.apparmor_restrict_unprivileged_userns)
    --docker-default   what Docker's default seccomp profile (moby's
                       profiles/seccomp/default.json; containerd's and CRI-O's
                       RuntimeDefault are copies) refuses a container without
                       CAP_SYS_ADMIN: unshare, setns, the mount API old and new, clone
                       with any CLONE_NEW* flag, bpf, perf events, keyrings, file
                       handles, fanotify, quotas, host and domain names, syslog (EPERM);
                       clone3 answers ENOSYS (the C library falls back to clone).  As
                       root it is installed without no_new_privs, then the bounding set
                       is cut to Docker's 14 default capabilities (CHOWN, DAC_OVERRIDE,
                       FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE,
                       NET_RAW, SYS_CHROOT, MKNOD, AUDIT_WRITE, SETFCAP), as a container
                       runtime starts a container's root.  First, where a folder only root
                       may pass lies above the Python installation (this machine's is below
                       /root), the command gets a mount namespace of its own in which that
                       folder shows the installation to every uid, as a container image's
                       Python is (readable_python())
    --readable-python-only   (root) that mount namespace alone, then COMMAND: no filter
                       (a container emulated by dropping capabilities, whose filters the
                       command installs itself)

The numbers are written out here, not taken from the engine: the emulation must not share
the engine's table (tests/confinement/test_host_kinds.py checks them against it).
"""
import ctypes
import os
import struct
import sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
ENOSYS = 38
EPERM = 1
UNSHARE = {"x86_64": 272, "aarch64": 97}
CLONE = {"x86_64": 56, "aarch64": 220}
CLONE3 = 435
#: Refused by Docker's default profile without CAP_SYS_ADMIN (and keyrings, never allowed).
DOCKER_REFUSED = {
    "x86_64": {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
               "bpf": 321, "keyctl": 250, "add_key": 248, "request_key": 249,
               "perf_event_open": 298, "name_to_handle_at": 303, "fanotify_init": 300,
               "quotactl": 179, "sethostname": 170, "setdomainname": 171, "syslog": 103,
               "lookup_dcookie": 212},
    "aarch64": {"unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
                "bpf": 280, "keyctl": 219, "add_key": 217, "request_key": 218,
                "perf_event_open": 241, "name_to_handle_at": 264, "fanotify_init": 262,
                "quotactl": 60, "sethostname": 161, "setdomainname": 162, "syslog": 116,
                "lookup_dcookie": 18},
}
#: The new mount API and quotactl_fd: the same numbers on every architecture.
DOCKER_REFUSED_GENERIC = {"open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
                          "fsmount": 432, "fspick": 433, "mount_setattr": 442, "quotactl_fd": 443}
#: CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET: Docker's mask on clone's flags.
CLONE_NEW_FLAGS = 0x7E020000
#: Docker's default capabilities (moby's oci/caps/defaults.go), by number.
DOCKER_CAPABILITIES = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5,
                       "SETGID": 6, "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10,
                       "NET_RAW": 13, "SYS_CHROOT": 18, "MKNOD": 27, "AUDIT_WRITE": 29,
                       "SETFCAP": 31}
PR_CAPBSET_READ, PR_CAPBSET_DROP = 23, 24

_LD_NR, _LD_ARG0 = (0x20, 0, 0, 0), (0x20, 0, 0, 16)
_ALLOW = (0x06, 0, 0, 0x7FFF0000)


def _errno(value: int) -> tuple:
    """SECCOMP_RET_ERRNO with ``value``."""
    return (0x06, 0, 0, 0x00050000 | value)


def program(no_userns: bool, landlock: bool = False, docker: bool = False) -> list:
    """(code, jt, jf, k) of classic BPF."""
    machine = os.uname().machine
    refused = [UNSHARE[machine]] if no_userns else []
    if docker:
        refused = sorted({*refused, *DOCKER_REFUSED[machine].values(),
                          *DOCKER_REFUSED_GENERIC.values()})
    enosys = [] if landlock else [444, 445, 446]
    if docker:
        enosys.append(CLONE3)
    # [LD nr] [JEQ refused -> EPERM]... [JEQ enosys -> ENOSYS]... [JEQ clone -> its block]
    # [JA -> ALLOW] [the clone block: LD flags, JSET CLONE_NEW* -> EPERM, ALLOW]
    # [EPERM] [ENOSYS] [ALLOW]
    checks = [*((nr, "eperm") for nr in refused), *((nr, "enosys") for nr in enosys)]
    if docker:
        checks.append((CLONE[machine], "clone"))
    clone_at = 1 + len(checks) + 1
    eperm_at = clone_at + (4 if docker else 0)
    at = {"clone": clone_at, "eperm": eperm_at, "enosys": eperm_at + 1, "allow": eperm_at + 2}
    rows: list = [_LD_NR]
    for nr, to in checks:
        rows.append((0x15, at[to] - len(rows) - 1, 0, nr))
    rows.append((0x05, 0, 0, at["allow"] - len(rows) - 1))
    if docker:
        # clone: any CLONE_NEW* flag in its first argument (its flags): EPERM
        rows += [_LD_ARG0, (0x45, 0, 1, CLONE_NEW_FLAGS), _errno(EPERM), _ALLOW]
    rows += [_errno(EPERM), _errno(ENOSYS), _ALLOW]
    assert len(rows) == at["allow"] + 1 and all(0 <= r[1] < 256 for r in rows)
    return rows


def install(no_userns: bool = False, landlock: bool = False, docker: bool = False) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    prog_ = program(no_userns, landlock, docker)
    code = b"".join(struct.pack("HBBI", *ins) for ins in prog_)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = struct.pack("HxxxxxxQ", len(prog_), ctypes.addressof(buf))     # struct sock_fprog
    fprog = ctypes.create_string_buffer(prog, len(prog))
    arg = ctypes.c_ulong
    # A container's root installs its filter with CAP_SYS_ADMIN, without no_new_privs.
    nnp = not (docker and os.geteuid() == 0)
    if nnp and libc.prctl(PR_SET_NO_NEW_PRIVS, arg(1), arg(0), arg(0), arg(0)) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs refused")
    if libc.prctl(PR_SET_SECCOMP, arg(SECCOMP_MODE_FILTER), arg(ctypes.addressof(fprog)), arg(0),
                  arg(0)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_SLAVE = 0x00020000, 4096, 16384, 1 << 19


def readable_python() -> None:
    """(Root, before the filter refuses mounts) the Python installation readable by every
    uid: a tmpfs over the first folder above it that others may not pass, holding only the
    installation, bound; in a mount namespace of this command's own."""
    prefix = os.path.realpath(sys.base_prefix)
    parts = prefix.strip("/").split("/")
    private = next((p for p in ("/" + "/".join(parts[:i]) for i in range(1, len(parts)))
                    if not os.stat(p).st_mode & 0o001), None)
    if private is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0 or libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE,
                                                     None) != 0:
        raise OSError(ctypes.get_errno(), "no mount namespace for a readable Python")
    # (opened in the new namespace, before the tmpfs hides it)
    fd = os.open(prefix, os.O_PATH | os.O_CLOEXEC)
    if libc.mount(b"tmpfs", private.encode(), b"tmpfs", 0, b"mode=0755") != 0:
        raise OSError(ctypes.get_errno(), f"tmpfs on {private}")
    os.makedirs(prefix, mode=0o755)
    if libc.mount(f"/proc/self/fd/{fd}".encode(), prefix.encode(), None, _MS_BIND | _MS_REC,
                  None) != 0:
        raise OSError(ctypes.get_errno(), f"bind of {prefix}")
    os.close(fd)


def docker_capabilities() -> None:
    """(Root) cut the bounding set to Docker's default capabilities: the command this
    process runs next (a root's execve) holds those and no other."""
    libc = ctypes.CDLL(None, use_errno=True)
    arg = ctypes.c_ulong
    cap = 0
    while libc.prctl(PR_CAPBSET_READ, arg(cap), arg(0), arg(0), arg(0)) >= 0:
        if cap not in DOCKER_CAPABILITIES.values() and libc.prctl(
                PR_CAPBSET_DROP, arg(cap), arg(0), arg(0), arg(0)) != 0:
            raise OSError(ctypes.get_errno(), f"capability {cap} could not be dropped")
        cap += 1


if __name__ == "__main__":
    args = sys.argv[1:]
    flags = set()
    while args and args[0].startswith("--"):
        flags.add(args.pop(0))
    if "--readable-python-only" in flags:
        # (a container's image: its Python readable by every uid; the caller drops the
        # capabilities and installs the filters after)
        readable_python()
        os.execvp(args[0], args)
    if "--docker-default" in flags and os.geteuid() == 0:
        readable_python()
    install("--no-userns" in flags, "--keep-landlock" in flags, "--docker-default" in flags)
    if "--docker-default" in flags and os.geteuid() == 0:
        docker_capabilities()
    os.execvp(args[0], args)
