"""The system calls a confined worker may make: an allowlist, as data, with its evidence.

Pure: names and numbers only; worker/confine/seccomp.py turns them into a BPF filter.

    GROUPS       (group, where the calls come from, names): the allowlist is their union.
                 Each group was traced (``strace -f`` of the workload named, Python 3.11,
                 glibc 2.36, x86_64) and completed with the calls the same code makes on
                 other glibc versions and on aarch64 (``open`` or ``openat``, ``fstat`` or
                 ``newfstatat``...); the suite's confined tests were traced the same way.
    FILTERED     calls allowed only with some arguments (the rule is in seccomp.py):
                 clone without namespace flags, socket/socketpair by family and type,
                 prctl, personality and ioctl narrowed, prlimit64 and the calls that
                 set a priority, a scheduler or an affinity on this process (or thread)
                 only: a process of the same uid (another tenant's templated worker) is
                 out of their reach
    ENOSYS       calls answered ENOSYS, so the C library falls back (clone3 -> clone)
    DANGEROUS    families refused whatever a library's settings say, unless the host
                 also sets ``allow_dangerous``: the kernel surface a tool has no use for
    Everything else fails with EPERM.

A library's ``"sandbox": {"syscalls": {"allow": [names]}}`` adds calls (check_setting()).
"""
from __future__ import annotations

import difflib
import functools
from typing import Any, Optional

from .syscall_numbers import ARCHES, NUMBERS, number

GROUPS: tuple[tuple[str, str, str], ...] = (
    ("python startup",
     ("python -c pass: the loader, glibc's start, site, the interpreter"),
     ("access arch_prctl brk close execve exit_group fcntl futex getdents64 getrandom "
      "gettid ioctl lseek mmap mprotect munmap newfstatat openat pread64 prlimit64 read "
      "readlink rseq rt_sigaction set_robust_list set_tid_address sysinfo write exit")),
    ("other spellings",
     ("the same operations as traced, as other glibc versions (2.34-2.41) or aarch64 ask "
      "for them; vDSO fallbacks"),
     ("open stat lstat fstat statx readlinkat faccessat faccessat2 getdents pipe dup dup2 "
      "dup3 poll ppoll select pselect6 creat openat2 preadv preadv2 pwritev pwritev2 readv "
      "writev getrlimit setrlimit time gettimeofday clock_gettime clock_getres fchmodat2 "
      "futex_waitv futex_wake futex_wait futex_requeue map_shadow_stack mseal fstatfs")),
    ("the worker's loop",
     ("the engine's worker: its socket to the host, signals and timers of timeouts, chdir "
      "to the workspace, resource limits"),
     ("chdir fchdir getcwd getpeername getsockname recvfrom sendto recvmsg sendmsg "
      "epoll_create epoll_create1 epoll_ctl epoll_wait epoll_pwait epoll_pwait2 pause "
      "rt_sigreturn rt_sigprocmask rt_sigsuspend rt_sigpending rt_sigtimedwait "
      "rt_sigqueueinfo rt_tgsigqueueinfo sigaltstack kill tgkill tkill alarm setitimer "
      "getitimer restart_syscall umask getpid getppid shutdown")),
    ("threads",
     ("concurrent.futures.ThreadPoolExecutor, threading.Timer, OpenBLAS's pool"),
     ("clone madvise sched_yield membarrier get_mempolicy")),
    ("fork and pipes",
     ("os.fork, os.waitpid, os.pipe"),
     ("pipe2 wait4 waitid")),
    ("subprocess of system programs",
     ("subprocess.run of /bin/true, git --version, sh -c with a pipe; the id calls stay "
      "harmless without capabilities"),
     ("close_range fadvise64 getegid geteuid getgid getuid vfork fork execveat getpgrp "
      "setpgid getpgid setsid getsid getresuid getresgid getgroups setuid setgid setreuid "
      "setregid setresuid setresgid setgroups setfsuid setfsgid capget")),
    ("git in a repository",
     ("git init, commit, log, status in a temp dir"),
     ("chmod fchmod fchmodat link linkat mkdir mkdirat rename renameat renameat2 symlink "
      "symlinkat unlink unlinkat rmdir fsync")),
    ("numpy and OpenBLAS",
     ("a matrix product, inv and fft: OpenBLAS binds its buffers to the worker's own NUMA "
      "node (only its own memory: no move_pages, no migrate_pages)"),
     ("sched_getaffinity sched_setaffinity uname mbind set_mempolicy "
      "set_mempolicy_home_node getcpu")),
    ("sqlite3",
     ("a database in the workspace, rollback journal and WAL"),
     ("fchown fdatasync ftruncate pwrite64 flock")),
    ("asyncio",
     ("an event loop with sleeps, a socketpair, a subprocess and an executor"),
     ("mremap eventfd eventfd2 pidfd_open pidfd_send_signal signalfd signalfd4 "
      "timerfd_create timerfd_settime timerfd_gettime")),
    ("sockets",
     ("TCP to a loopback listener, UDP, getaddrinfo (DNS over UDP and TCP, /etc/hosts), "
      "ssl, socket.if_nameindex (netlink)"),
     ("socket socketpair accept accept4 bind connect listen sendmmsg recvmmsg setsockopt "
      "getsockopt")),
    ("ctypes and mmap",
     ("ctypes.CDLL, ctypes.util.find_library (runs ldconfig/gcc), mmap.mmap(-1, n), "
      "os.memfd_create"),
     ("memfd_create msync mincore mlock mlock2 munlock mlockall munlockall")),
    ("files and the standard library",
     ("shutil copy/copytree/rmtree, tempfile, os.mkfifo, uuid, platform, "
      "multiprocessing.Pool (fork), time.sleep, os.nice, os.times"),
     ("clock_nanosleep nanosleep getpriority setpriority listxattr llistxattr flistxattr "
      "getxattr lgetxattr fgetxattr setxattr lsetxattr fsetxattr removexattr lremovexattr "
      "fremovexattr getxattrat listxattrat setxattrat removexattrat mknod mknodat sendfile "
      "statfs times truncate utime utimes utimensat futimesat copy_file_range fallocate "
      "sync syncfs sync_file_range splice tee vmsplice readahead getrusage chown lchown "
      "fchownat inotify_init inotify_init1 inotify_add_watch inotify_rm_watch "
      "sched_getparam sched_setparam sched_getscheduler sched_setscheduler "
      "sched_get_priority_max sched_get_priority_min sched_rr_get_interval sched_getattr "
      "sched_setattr ioprio_get ioprio_set timer_create timer_settime timer_gettime "
      "timer_getoverrun timer_delete cachestat")),
    ("narrowing itself further",
     ("a tool may sandbox what it runs (a browser's own sandbox, nsjail-like helpers): "
      "these can only take rights away"),
     ("seccomp landlock_create_ruleset landlock_add_rule landlock_restrict_self capset "
      "prctl personality")),
)

#: Allowed only with some arguments (the rules: worker/confine/seccomp.py).  Naming one of
#: these in a library's "allow" lifts its rule, except socket and socketpair, whose rules
#: follow the "network" setting, and clone, which is DANGEROUS (namespaces).
FILTERED = ("clone", "socket", "socketpair", "prctl", "personality", "ioctl", "prlimit64",
            "setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam",
            "sched_setattr", "ioprio_set")
FIXED = ("socket", "socketpair")
#: Answered ENOSYS: glibc then uses the older call (clone3 -> clone, filtered above).
ENOSYS = ("clone3",)

DANGEROUS: dict[str, tuple[str, ...]] = {
    "namespaces": ("unshare", "setns", "clone", "clone3"),
    "keyrings": ("keyctl", "add_key", "request_key"),
    "bpf": ("bpf",),
    "perf events": ("perf_event_open",),
    "userfaultfd": ("userfaultfd",),
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "mounts": ("mount", "umount2", "pivot_root", "chroot", "open_tree", "open_tree_attr",
               "fsopen", "fsmount", "fsconfig", "fspick", "move_mount", "mount_setattr",
               "statmount", "listmount"),
    "file handles": ("name_to_handle_at", "open_by_handle_at"),
    "kexec and modules": ("kexec_load", "kexec_file_load", "init_module", "finit_module",
                          "delete_module"),
    "port I/O": ("iopl", "ioperm", "modify_ldt"),
    "quotas": ("quotactl", "quotactl_fd"),
    "other processes": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
                        "pidfd_getfd", "process_madvise", "process_mrelease", "move_pages",
                        "migrate_pages", "get_robust_list"),
    "administration": ("reboot", "swapon", "swapoff", "sethostname", "setdomainname",
                       "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "acct",
                       "syslog", "vhangup", "lookup_dcookie", "nfsservctl", "uselib", "ustat",
                       "sysfs", "_sysctl", "fanotify_init", "fanotify_mark"),
}
DANGEROUS_NAMES = frozenset(n for names in DANGEROUS.values() for n in names)

#: prctl options a confined worker may use (the first argument).  CPython, glibc (2.39+
#: names its mappings with PR_SET_VMA), OpenBLAS, subprocess, libcap-based programs and
#: sandboxes that narrow themselves.  Not: PR_SET_MM, PR_SET_PTRACER, PR_SET_SECUREBITS,
#: PR_SET_KEEPCAPS, PR_MCE_KILL, PR_SET_IO_FLUSHER, PR_SCHED_CORE and the rest.
PRCTL_OPTIONS: dict[str, int] = {
    "PR_SET_PDEATHSIG": 1, "PR_GET_PDEATHSIG": 2, "PR_GET_DUMPABLE": 3, "PR_SET_DUMPABLE": 4,
    "PR_GET_KEEPCAPS": 7, "PR_SET_NAME": 15, "PR_GET_NAME": 16, "PR_GET_SECCOMP": 21,
    "PR_SET_SECCOMP": 22, "PR_CAPBSET_READ": 23, "PR_CAPBSET_DROP": 24,
    "PR_GET_SECUREBITS": 27, "PR_SET_TIMERSLACK": 29, "PR_GET_TIMERSLACK": 30,
    "PR_SET_CHILD_SUBREAPER": 36, "PR_GET_CHILD_SUBREAPER": 37, "PR_SET_NO_NEW_PRIVS": 38,
    "PR_GET_NO_NEW_PRIVS": 39, "PR_GET_TID_ADDRESS": 40, "PR_SET_THP_DISABLE": 41,
    "PR_GET_THP_DISABLE": 42, "PR_CAP_AMBIENT": 47, "PR_SVE_GET_VL": 51,
    "PR_GET_SPECULATION_CTRL": 52, "PR_SET_SPECULATION_CTRL": 53, "PR_GET_TAGGED_ADDR_CTRL": 56,
    "PR_SET_MDWE": 65, "PR_GET_MDWE": 66, "PR_GET_AUXV": 0x41555856, "PR_SET_VMA": 0x53564D41,
}
#: personality(2): the query (0xffffffff) and PER_LINUX; not ADDR_NO_RANDOMIZE and the like.
PERSONALITIES = (0xFFFFFFFF, 0)
#: ioctl requests (the second argument; the same numbers on x86_64 and aarch64), most used
#: first: terminals (isatty() on every open() in text mode, os.get_terminal_size, a pty of
#: pexpect or pty.fork), descriptors (FIONBIO, FIOCLEX...), interfaces (uuid, socket's
#: SIOCGIF*), reflink copies (cp, FICLONE).  Not TIOCSTI (typing into a terminal),
#: TIOCLINUX, TIOCCONS, nor any device's own requests.
IOCTL_REQUESTS: dict[str, int] = {
    "TCGETS": 0x5401, "FIONREAD": 0x541B, "FIONBIO": 0x5421, "FIOCLEX": 0x5451,
    "FIONCLEX": 0x5450, "TIOCGWINSZ": 0x5413, "TCSETS": 0x5402, "TCSETSW": 0x5403,
    "TCSETSF": 0x5404, "TCSBRK": 0x5409, "TCXONC": 0x540A, "TCFLSH": 0x540B,
    "TIOCSCTTY": 0x540E, "TIOCGPGRP": 0x540F, "TIOCSPGRP": 0x5410, "TIOCOUTQ": 0x5411,
    "TIOCSWINSZ": 0x5414, "TIOCNOTTY": 0x5422, "TIOCGSID": 0x5429, "FIOASYNC": 0x5452,
    "TCGETS2": 0x802C542A, "TCSETS2": 0x402C542B, "TCSETSW2": 0x402C542C,
    "TCSETSF2": 0x402C542D, "TIOCGPTN": 0x80045430, "TIOCSPTLCK": 0x40045431,
    "TIOCGPTPEER": 0x5441, "SIOCATMARK": 0x8905, "SIOCGIFNAME": 0x8910, "SIOCGIFCONF": 0x8912,
    "SIOCGIFFLAGS": 0x8913, "SIOCGIFADDR": 0x8915, "SIOCGIFNETMASK": 0x891B,
    "SIOCGIFMTU": 0x8921, "SIOCGIFHWADDR": 0x8927, "SIOCGIFINDEX": 0x8933,
    "FICLONE": 0x40049409, "FICLONERANGE": 0x4020940D,
}

ALLOWED = frozenset(n for _, _, names in GROUPS for n in names.split())


@functools.lru_cache(maxsize=64)
def allowed_on(machine: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The names allowed on ``machine`` (with a library's ``extra``), sorted; calls the
    architecture does not have are left out."""
    return tuple(sorted(n for n in ALLOWED.union(extra) if number(n, machine) is not None))


def check_setting(value: Any) -> Optional[dict[str, Any]]:
    """A library's ``"syscalls"`` setting, checked: ``{"allow": (names...),
    "allow_dangerous": bool}`` or None; raises ValueError saying what is wrong."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f'"syscalls" must be a dict such as {{"allow": ["name", ...]}}, '
                         f"not {type(value).__name__}")
    unknown_keys = set(value) - {"allow", "allow_dangerous"}
    if unknown_keys:
        raise ValueError(f'"syscalls" takes "allow" and "allow_dangerous", not '
                         f"{', '.join(sorted(map(repr, unknown_keys)))}")
    allow = value.get("allow") or ()
    if isinstance(allow, str) or not all(isinstance(n, str) for n in allow):
        raise TypeError('"syscalls": "allow" must be a list of system call names')
    dangerous = value.get("allow_dangerous", False)
    if not isinstance(dangerous, bool):
        raise TypeError('"syscalls": "allow_dangerous" must be true or false')
    problems = []
    for name in allow:
        if name not in NUMBERS:
            near = difflib.get_close_matches(name, NUMBERS, 1)
            problems.append(f"{name!r} is no system call of {' or '.join(ARCHES)}"
                            + (f" (did you mean {near[0]!r}?)" if near else ""))
        elif name in FIXED:
            problems.append(f"{name!r}: its rules follow the library's \"network\" setting "
                            "and cannot be lifted")
        elif name in DANGEROUS_NAMES and not dangerous:
            family = next(f for f, names in DANGEROUS.items() if name in names)
            problems.append(f"{name!r} is in a dangerous family ({family}): the host must "
                            'also set "allow_dangerous": true')
    if problems:
        raise ValueError('"syscalls": ' + "; ".join(problems))
    return {"allow": tuple(sorted(set(allow))), "allow_dangerous": dangerous}
