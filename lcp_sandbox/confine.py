"""Confinement of a worker (Linux): clean environment, network namespace, Landlock,
no privileges, no unix sockets.

Applied once, inside a freshly forked worker, before any tool code runs, in
this order (worker.prepare()); each step needs what the later ones give up:

    clean_environment()   allowlist + the library's env
    isolate_network()     unshare(CLONE_NEWNET): CAP_SYS_ADMIN as root, else a
                          user namespace (needs /proc writes)
    private_tmpdir()      created as the host's user, owned by the worker's uid-to-be
    make_reachable()      own mount namespace if a folder above a path the worker
                          needs is private to root (mount(2) needs CAP_SYS_ADMIN)
    apply_landlock()      opens its rule paths now, while all are reachable; it can
                          only narrow what follows
    drop_privileges()     bounding set (needs CAP_SETPCAP), ambient, groups, gid,
                          uid, then every capability set to zero
    block_unix_sockets()  seccomp, with the network off (needs no_new_privs)

Every step reports whether it took effect; nothing pretends.  The host
shows the report in ``stats()["protections"]``.  Host side, hand_over() gives
the confinement root to the worker's uid before the worker starts.

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
import errno
import fcntl
import os
import re
import signal
import socket
import stat
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


# ------------------------------------------------------------------ privileges
#
# A worker forked from a root host is root with every capability: Landlock does not
# stop reboot(2), module loading, raw sockets, setting the clock...  A confined worker
# gives all of that up (drop_privileges()) once the steps that need it are done (see
# the module docstring).  Capabilities are per thread: prepare() runs single-threaded.

DEFAULT_RUN_AS = (65534, 65534)          # nobody:nogroup on most distributions

_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_SECCOMP = 1, 4, 22
_PR_CAPBSET_READ, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS = 23, 24, 28
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_IS_SET, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 1, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
# SECBIT_NOROOT (+ locked): uid 0 gains no capabilities by execve; KEEP_CAPS locked off,
# NO_SETUID_FIXUP locked off (setuid keeps clearing capabilities); no ambient raise (+ locked).
_SECUREBITS = (1 << 0) | (1 << 1) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7)


def run_as_ids(value) -> tuple[int, int]:
    """(uid, gid) from a setting: two positive ints.  0 is refused: never root."""
    try:
        uid, gid = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"run_as must be (uid, gid), two integers; got {value!r}") from None
    if uid <= 0 or gid <= 0 or uid > 0xFFFFFFFE or gid > 0xFFFFFFFE:
        raise ValueError(f"run_as {value!r}: a confined worker runs as an unprivileged uid and gid "
                         "(not 0, not -1)")
    return uid, gid


def _prctl(option: int, a2: int = 0, a3: int = 0, a4: int = 0, a5: int = 0) -> int:
    """prctl(2); -errno on failure."""
    rc = _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(a2), ctypes.c_ulong(a3),
                     ctypes.c_ulong(a4), ctypes.c_ulong(a5))
    return -ctypes.get_errno() if rc < 0 else rc


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _last_cap() -> int:
    """The highest capability this kernel knows (/proc/sys may be out of Landlock's reach)."""
    cap = 0
    while cap < 63 and _prctl(_PR_CAPBSET_READ, cap + 1) >= 0:
        cap += 1
    return cap


_LAST_CAP = _last_cap()          # once, in the zygote: its workers inherit it


def capabilities() -> dict:
    """This thread's capability sets as integers (as /proc/self/status shows them)."""
    hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), f"capget: {os.strerror(ctypes.get_errno())}")
    out = {k: getattr(data[0], k) | (getattr(data[1], k) << 32) for k in ("effective", "permitted", "inheritable")}
    out["bounding"] = sum(1 << c for c in range(_LAST_CAP + 1) if _prctl(_PR_CAPBSET_READ, c) > 0)
    out["ambient"] = sum(1 << c for c in range(_LAST_CAP + 1)
                         if _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_IS_SET, c) > 0)
    return out


def _capset_zero() -> None:
    hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), f"capset: {os.strerror(ctypes.get_errno())}")


def drop_privileges(run_as=None) -> str:
    """Give up every capability and, when root, become ``run_as`` (uid, gid).

    Called once in a confined worker, single-threaded, before tool code runs.
    Never raises: the returned report says what holds, checked afterwards with
    capget(2), PR_CAPBSET_READ and getresuid(2), not assumed.  Starts with "uid "
    when everything that could be dropped was, with "failed" otherwise."""
    errors: list[str] = []
    try:
        uid, gid = run_as_ids(DEFAULT_RUN_AS if run_as is None else run_as)
    except ValueError as exc:
        errors.append(str(exc))
        uid = gid = None
    was_root = os.geteuid() == 0
    ppid = os.getppid()
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = 1
    if threads > 1:      # capabilities are per thread: the others would keep theirs
        errors.append(f"{threads} threads (only this one drops its capabilities)")
    _prctl(_PR_SET_SECUREBITS, _SECUREBITS)          # best effort; needs CAP_SETPCAP
    no_setpcap = False
    for cap in range(_LAST_CAP + 1):                 # while CAP_SETPCAP is still held
        if _prctl(_PR_CAPBSET_DROP, cap) < 0:
            no_setpcap = True
            break
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)  # EINVAL before Linux 4.3: none to clear
    if was_root and uid is not None:
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)              # clears effective and permitted
        except OSError as exc:
            errors.append(f"setuid {uid}:{gid}: {exc.strerror}")
    try:
        _capset_zero()                               # inheritable too
    except OSError as exc:
        errors.append(str(exc))
    if _prctl(_PR_SET_NO_NEW_PRIVS, 1) < 0:          # no setuid binary or file capability helps
        errors.append("no_new_privs refused")
    _prctl(_PR_SET_DUMPABLE, 0)                      # no ptrace or /proc/<pid>/mem by same-uid peers
    # A change of uid clears the parent-death signal: ask again, and leave if the zygote
    # went away meanwhile (we would have missed the signal).
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != ppid:
        os._exit(1)

    try:
        caps = capabilities()
    except OSError as exc:
        return f"failed ({'; '.join(errors + [str(exc)])})"
    ruid, euid, suid = os.getresuid()
    rgid, egid, sgid = os.getresgid()
    held = {k: v for k, v in caps.items() if v and k != "bounding"}
    if was_root and ((ruid, euid, suid, rgid, egid, sgid) != (uid, uid, uid, gid, gid, gid) or os.getgroups()):
        errors.append(f"ids are {ruid},{euid},{suid}:{rgid},{egid},{sgid} groups {os.getgroups()}")
    if held or (caps["bounding"] and (was_root or not no_setpcap)):
        errors.append("capabilities remain")
    state = f"uid {euid} gid {egid}"
    if not errors:
        if not was_root:
            state += " (the host's: it is not root)"
        state += ", no capabilities"
        if caps["bounding"]:
            state += " (bounding set kept: no CAP_SETPCAP to drop it; no_new_privs stops gaining any)"
        return state
    sets = ", ".join(f"{k} {v:#x}" for k, v in caps.items() if v) or "no capabilities"
    return f"failed ({'; '.join(dict.fromkeys(errors))}): {state}, {sets}"


def private_tmpdir(run_as=None) -> str:
    """The worker's TMPDIR, created now (as the host's user) and owned by ``run_as``
    when the worker is about to drop to it."""
    import tempfile
    tmp = tempfile.mkdtemp(prefix="lcp-sandbox-")
    if os.geteuid() == 0:
        try:
            os.chown(tmp, *run_as_ids(DEFAULT_RUN_AS if run_as is None else run_as))
        except (OSError, ValueError):
            pass                                     # drop_privileges() reports a bad run_as
    return tmp


_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_SLAVE = 2, 4, 8, 4096, 16384, 1 << 19


def _searchable(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether ``uid``:``gid`` (no other groups) may pass through a directory (mode bits)."""
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def make_reachable(paths: Iterable[str], run_as=None) -> str:
    """Let the worker's uid-to-be reach ``paths`` when a directory above them is
    private to root (a Python installed in root's home directory, pytest's 0700 temp folders): in an
    own mount namespace, that directory is covered by a small read-only-for-others
    tmpfs holding only the way down to each path, each path bound there as it is.
    Nothing changes for the host.  A path's own permissions still apply.

    Called as root, before Landlock (whose rules are then taken on the paths as the
    worker sees them) and before dropping privileges.  Returns "" when nothing was
    needed, else a report."""
    if os.geteuid() != 0:
        return ""
    try:
        uid, gid = run_as_ids(DEFAULT_RUN_AS if run_as is None else run_as)
    except ValueError:
        return ""
    covers: dict[str, list[str]] = {}          # private ancestor -> paths below it
    for path in sorted({os.path.realpath(p) for p in paths if p}):
        parts = path.strip(os.sep).split(os.sep)
        for i in range(1, len(parts)):
            above = os.sep + os.sep.join(parts[:i])
            try:
                st = os.stat(above)
            except OSError:
                break
            if not _searchable(st, uid, gid):
                if above not in (*SYSTEM_READ_PATHS, "/dev", "/proc", "/sys") and os.path.exists(path):
                    listed = covers.setdefault(above, [])
                    if not any(_contains(p, path) for p in listed):   # else it comes along
                        listed.append(path)
                break
    if not covers:
        return ""
    if _libc.unshare(_CLONE_NEWNS) != 0:
        return f"unreachable by uid {uid}: below {', '.join(covers)} (unshare: {os.strerror(ctypes.get_errno())})"
    # Mounts made here must never propagate to the host; the host's later mounts still arrive.
    if _libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        return f"unreachable by uid {uid}: below {', '.join(covers)} (mount: {os.strerror(ctypes.get_errno())})"
    failed = []
    for above, below in covers.items():
        fds = []
        try:
            for path in below:                   # opened in this namespace, before the cover hides them
                fds.append((path, os.open(path, os.O_PATH | os.O_CLOEXEC)))
            if _libc.mount(b"tmpfs", above.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                           b"mode=0755,size=64k,nr_inodes=256") != 0:
                failed.append(f"{above} ({os.strerror(ctypes.get_errno())})")
                continue
            for path, fd in fds:
                rel = os.path.relpath(path, above)
                os.makedirs(os.path.join(above, os.path.dirname(rel)), mode=0o755, exist_ok=True)
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.mkdir(path, 0o755)
                else:
                    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
                if _libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, _MS_BIND | _MS_REC, None) != 0:
                    failed.append(f"{path} ({os.strerror(ctypes.get_errno())})")
        except OSError as exc:
            failed.append(f"{above} ({exc})")
        finally:
            for _, fd in fds:
                os.close(fd)
    shown = ", ".join(covers)
    if failed:
        return f"own mount namespace, {shown} covered; failed: {', '.join(failed)}"
    return f"{shown} covered (own mount namespace: only the allowed paths below, for uid {uid})"


# Paths a confinement root must not contain: handing them to an unprivileged uid
# would give it the system (think of a confined binding without a workspace in a
# host whose CWD is "/").
_NEVER_HAND_OVER = ("/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/media",
                    "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr",
                    "/var", "/var/tmp")
_MAX_DEPTH = 64


def _contains(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def may_hand_over(path: str) -> bool:
    """False for "/", a system directory, or a folder holding one, the Python
    installation or this package (``path`` is a real path)."""
    keep = [*_NEVER_HAND_OVER, *python_paths(), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    return path != os.sep and not any(_contains(path, p) for p in keep)


def hand_over(path: str, uid: int, gid: int) -> None:
    """Make ``path`` (a confinement root) and what it holds owned by ``uid``:``gid``.

    Host side, before a confined worker that will run as that uid starts; a no-op
    unless this process is root.  What already lives there may be hostile (a worker
    of the same tenant may be running), so every directory is opened relative to
    its parent with O_NOFOLLOW and checked to be the entry that was listed, and
    only directories and regular files change owner, each through its own open
    descriptor.  Left alone: symlinks, devices, sockets, fifos, a regular file with
    more than one link (it may be a hard link to a file outside the root), other
    file systems mounted inside, entries deeper than 64 levels, and whatever
    vanishes or changes meanwhile.  Raises PermissionError for a root that is or
    holds a system directory or the Python installation."""
    if os.geteuid() != 0:
        return
    path = os.path.realpath(path)
    if not may_hand_over(path):
        raise PermissionError(f"refusing to hand {path!r} to uid {uid}: it is or holds a system "
                              "directory or the Python installation; give the worker a root of its own")
    try:
        top = _open_dir_path(path)
    except OSError:
        return                       # gone, or a symlink appeared on the way: nothing handed over
    mounts = _mount_points_below(path)   # bind mounts of the same file system too
    # Depth first, holding one descriptor per level: [fd, its path, subdirectories to visit].
    stack = [[top, path, []]]
    try:
        dev = os.fstat(top).st_dev
        stack[-1][2] = _hand_over_dir(top, path, dev, mounts, uid, gid, 0)
        while stack:
            fd, where, pending = stack[-1]
            if not pending:
                os.close(stack.pop()[0])
                continue
            name, ino = pending.pop()
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                continue
            stack.append([sub, os.path.join(where, name), []])
            try:
                st = os.fstat(sub)
            except OSError:
                continue
            if st.st_ino == ino and st.st_dev == dev:      # else replaced since it was listed
                stack[-1][2] = _hand_over_dir(sub, stack[-1][1], dev, mounts, uid, gid, len(stack) - 1)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _mount_points_below(path: str) -> set:
    out = set()
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), line.split()[4])
                point = os.fsdecode(point)
                if point != path and _contains(path, point):
                    out.add(point)
    except (OSError, IndexError):
        pass
    return out


def _hand_over_dir(fd: int, where: str, dev: int, mounts: set, uid: int, gid: int, depth: int) -> list:
    """Chown an open directory and its regular files; return its subdirectories to visit."""
    try:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.chown(fd, uid, gid)
        with os.scandir(fd) as it:
            entries = [e.name for e in it]
    except OSError:
        return []
    subdirs = []
    for name in entries:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if st.st_dev != dev or (mounts and os.path.join(where, name) in mounts):
            continue
        if stat.S_ISDIR(st.st_mode):
            if depth < _MAX_DEPTH:
                subdirs.append((name, st.st_ino))
        elif stat.S_ISREG(st.st_mode) and (st.st_uid, st.st_gid) != (uid, gid) and st.st_nlink == 1:
            try:     # O_NONBLOCK: if a fifo took its place, opening does not wait for a writer
                f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                            dir_fd=fd)
            except OSError:
                continue
            try:
                now = os.fstat(f)
                if now.st_ino == st.st_ino and stat.S_ISREG(now.st_mode) and now.st_nlink == 1:
                    os.chown(f, uid, gid)
            except OSError:
                pass
            finally:
                os.close(f)
    return subdirs


def _open_dir_path(path: str) -> int:
    """An fd on the directory ``path`` (absolute, no symlinks), opened one component at a
    time without following symlinks: a component swapped for a link fails (ELOOP)."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in path.strip(os.sep).split(os.sep):
            if not part:
                continue
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


# ------------------------------------------------------------------ unix sockets
#
# Landlock (ABI <= 7) does not cover connect() to a pathname unix socket, and an own
# network namespace does not either (those sockets live in the file system): a
# confined tool could talk to a socket another tenant serves in its workspace, or to
# a host service (a docker socket would be one).  With the network off, a seccomp
# filter closes every way this process has to get an AF_UNIX socket it could point
# at a path:
#   socket(AF_UNIX, ...)            EACCES; so is every family but AF_INET, AF_INET6
#                                   (both in the worker's own network namespace) and
#                                   AF_NETLINK: AF_VSOCK, for one, is in no network
#                                   namespace and reaches the hypervisor's services
#   socketpair(), datagram type     EACCES: an AF_UNIX datagram socket can sendto()
#                                   or connect() any path even when paired
#   socketpair(), stream/seqpacket  allowed: already connected, connect() and a
#                                   sendto() address fail (multiprocessing and asyncio
#                                   use these)
#   io_uring_setup/enter/register   EPERM (IORING_OP_SOCKET creates sockets)
#   x32 calls (nr | 0x40000000), any other architecture's calls (i386 int 0x80 with
#   its socketcall(2), arm32 compat)          EPERM, whatever the call
# Sockets the worker already has: only its channel to the host, a connected stream
# socket (connect() on it fails with EISCONN).  The host never passes descriptors.
# Opening a socket file, directly or through /proc/<pid>/fd, fails with ENXIO.

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
    if _prctl(_PR_SET_NO_NEW_PRIVS, 1) < 0:
        return "unavailable (no_new_privs refused)"
    rc = _libc.syscall(ctypes.c_long(_NR[machine][2]), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                       ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if rc < 0 and ctypes.get_errno() == errno.ENOSYS:       # kernel < 3.17: this thread only
        rc = _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog))
    if rc < 0:
        return f"unavailable (seccomp: {os.strerror(ctypes.get_errno())})"
    if rc > 0:
        return f"failed (thread {rc} could not take the filter)"
    try:                                                     # trust, but check
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
    except PermissionError:
        return "blocked (seccomp: only AF_INET, AF_INET6 and AF_NETLINK sockets can be created)"
    return "failed (the filter is installed but socket(AF_UNIX) still works)"


def in_force(kind: str, state: str) -> bool:
    """Whether a protections report entry says the protection holds."""
    if kind == "privileges":
        return state.startswith("uid ")
    if kind == "unix_sockets":
        return state.startswith("blocked")
    return state.startswith("on")
