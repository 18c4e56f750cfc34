"""Confinement policy as plain data and pure functions, for both sides.

What a confined worker keeps of the environment, which uid it runs as, which
paths it reads, and how to read the protections report it sends in READY.
No processes, no system calls.
"""
from __future__ import annotations

import functools
import numbers
import os
import sys
from typing import Any, Optional

# Environment variables a confined worker keeps from the host (plus the library's own "env").
ENV_ALLOWLIST = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TERM", "USER", "LOGNAME", "SHELL",
                 "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONHASHSEED", "VIRTUAL_ENV")
SYSTEM_READ_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc/self",
                     "/sys/devices/system/cpu")
# Nobody:nogroup on most distributions.
DEFAULT_RUN_AS = (65534, 65534)
#: The folder holding the lcp_sandbox package: read-only for a confined worker,
#: never handed over to one.
ENGINE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


#: ``confine="best-effort"``: confine with what the system has, where ``True`` refuses to run
#: a worker without every protection it asked for.
BEST_EFFORT = "best-effort"
#: lcp_sandbox.testing.landlock_abi_at_most(): "landlock_abi=N" among INIT's switches.
LANDLOCK_ABI_SWITCH = "landlock_abi="
#: A protection switched off by lcp_sandbox.testing.protections_off(), as stats() show it.
SWITCHED_OFF = "unavailable (switched off for a test: lcp_sandbox.testing)"


def host_environment() -> dict[bytes, bytes]:
    """The host's environment as bytes names and values, the way the worker sets it
    (os.environb): copying the bytes behind os.environ costs 1 us, decoding them
    30 us; the worker then compares and sets bytes, with no encoding either."""
    return dict(os.environ._data)                # type: ignore[attr-defined]  # POSIX: bytes


# The allowlist as str (os.environ's names) and as bytes (host_environment()'s: decoding each
# name first took five times as long), each with the locale variables' prefix
_ALLOWED: dict[type, tuple[frozenset[Any], Any]] = {
    str: (frozenset(ENV_ALLOWLIST), "LC_"),
    bytes: (frozenset(os.fsencode(n) for n in ENV_ALLOWLIST), b"LC_")}


def allowed_environment(env: dict[Any, Any]) -> dict[Any, Any]:
    """The allowlisted part of an environment (what a confined worker may see), its names
    all str or all bytes."""
    if not env:
        return {}
    names, locale = _ALLOWED[type(next(iter(env)))]
    return {k: v for k, v in env.items() if k in names or k.startswith(locale)}


def python_paths() -> list[str]:
    """Where the interpreter and its packages live (read-only for a confined worker)."""
    return list(_python_paths(tuple(sys.path)))


@functools.lru_cache(maxsize=8)
def _python_paths(path: tuple[str, ...]) -> tuple[str, ...]:
    # (realpath of the executable on every confined start cost a hand-over 40 us)
    out = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
           os.path.dirname(os.path.realpath(sys.executable))}
    for p in path:
        if p and (p.endswith(("site-packages", "dist-packages")) or
                  any(p.startswith(root) for root in (sys.prefix, sys.base_prefix))):
            out.add(p)
    return tuple(sorted(out))


#: run_as="per-tenant": each tenant its own uid (and gid), from the supervisor's uid_range,
#: by default this range: above system, login and the usual subordinate-id users.
PER_TENANT = "per-tenant"
DEFAULT_UID_RANGE = (1_800_000_000, 1_000_000)
#: With a uid per tenant: the processes and threads of all of one tenant's workers together
#: (RLIMIT_NPROC of its uid), a fork bomb's end; None: no cap.
DEFAULT_TENANT_PROCESSES = 1024


def default_run_as(tenants_root: Optional[str]) -> "tuple[int, int] | str":
    """run_as when the host does not say: a uid per tenant for a root host that declared
    its tenants' folder (it keeps tenants apart by file permissions too), else nobody."""
    return PER_TENANT if tenants_root and os.geteuid() == 0 else DEFAULT_RUN_AS


def run_as_setting(value: Any) -> "tuple[int, int] | str":
    """A run_as setting checked: (uid, gid), or "per-tenant" (ValueError naming it)."""
    if isinstance(value, str):
        if value == PER_TENANT:
            return PER_TENANT
        raise ValueError(f"run_as={value!r}: it is (uid, gid) or {PER_TENANT!r}")
    uid, gid = run_as_ids(value)
    if uid == BUILDER_IDS[0] or gid == BUILDER_IDS[1]:
        raise ValueError(f"run_as {value!r}: {BUILDER_IDS[0]} is the environment builder's uid "
                         f"and gid, which own the store of every library's environment")
    return uid, gid


#: The uid and gid of environment builds on a root host (backends/envs/build.py): their
#: own, neither a tenant's (confined workers run as nobody, 65534, by default) nor in the
#: per-tenant range, which starts just above it; above the system, login and usual
#: subordinate ids.  No run_as or uid_range may hold it: a worker with it could write the
#: store every library's environment comes from.
BUILDER_IDS = (DEFAULT_UID_RANGE[0] - 1, DEFAULT_UID_RANGE[0] - 1)
#: The largest uid or gid a worker may take (2**32 - 1 is the kernel's "no id").
MAX_ID = 0xFFFFFFFE
#: nobody's uid: the run_as of confined workers without a uid of their own.
NOBODY_UID = DEFAULT_RUN_AS[0]
#: uid_range=(first, count, LOGIN_UIDS): the host says these login-range uids belong to no one.
LOGIN_UIDS = "login-uids"
#: The login users' uids when /etc/login.defs does not say (UID_MIN, UID_MAX).
DEFAULT_LOGIN_RANGE = (1000, 60000)


def _whole(value: Any) -> bool:
    # (a bool is an int to Python, never a uid; 1.0 and "1" are no uids either)
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _pair(value: Any, setting: str, wanted: str) -> tuple[int, int]:
    """Two whole numbers, exactly (a list or tuple of two ints), else ValueError."""
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(_whole(v) for v in value)):
        raise ValueError(f"{setting} must be {wanted}, two whole numbers (ints); got {value!r}")
    return int(value[0]), int(value[1])


def uid_range_setting(value: Any) -> tuple[int, int]:
    """(first uid, how many) of run_as="per-tenant", checked: two ints, above the system
    uids and outside the login users' (UID_MIN..UID_MAX of /etc/login.defs) and nobody's,
    unless a third item, "login-uids", says the login-range uids given belong to no one."""
    allowed = isinstance(value, (list, tuple)) and len(value) == 3 and value[2] == LOGIN_UIDS
    first, count = _pair(value[:2] if allowed else value, "uid_range", "(first uid, count)")
    last = first + count - 1
    login_min, login_max = login_range()
    if count < 1 or first < login_min or last > MAX_ID:
        raise ValueError(f"uid_range {value!r}: unprivileged uids, from {login_min} (above the "
                         f"system's) to {MAX_ID}, and at least one")
    if first <= NOBODY_UID <= last:
        raise ValueError(f"uid_range {value!r} holds {NOBODY_UID}, nobody's uid, which the "
                         f"confined workers without a uid of their own share")
    if first <= BUILDER_IDS[0] <= last:
        raise ValueError(f"uid_range {value!r} holds {BUILDER_IDS[0]}, the uid of the "
                         f"environment builder, which owns the store of every library's "
                         f"environment")
    if first <= login_max and not allowed:
        raise ValueError(f"uid_range {value!r} overlaps the login users' uids ({login_min} to "
                         f"{login_max}, UID_MIN and UID_MAX of /etc/login.defs): a tenant "
                         f"would share its uid with a person's files and processes. Take uids "
                         f"above {login_max} (the default is {DEFAULT_UID_RANGE}), or, if "
                         f"these belong to no one, say so: uid_range=({first}, {count}, "
                         f"{LOGIN_UIDS!r})")
    return first, count


def run_as_ids(value: Any) -> tuple[int, int]:
    """(uid, gid) from a setting: two ints, exactly, from 1 to 2**32 - 2.  0 is refused:
    never root."""
    uid, gid = _pair(value, "run_as", "(uid, gid)")
    if not (0 < uid <= MAX_ID and 0 < gid <= MAX_ID):
        raise ValueError(f"run_as {value!r}: a confined worker runs as an unprivileged uid and gid "
                         "(not 0, not -1)")
    return uid, gid


def login_range(text: Optional[str] = None) -> tuple[int, int]:
    """(UID_MIN, UID_MAX) of the login users: from ``text`` (a login.defs), else the
    system's /etc/login.defs, else 1000 to 60000."""
    if text is None:
        return _system_login_range()
    found = {"UID_MIN": DEFAULT_LOGIN_RANGE[0], "UID_MAX": DEFAULT_LOGIN_RANGE[1]}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in found and words[1].isdigit():
            found[words[0]] = int(words[1])
    return found["UID_MIN"], found["UID_MAX"]


@functools.lru_cache(maxsize=1)
def _system_login_range() -> tuple[int, int]:
    try:
        with open("/etc/login.defs", encoding="utf-8", errors="replace") as f:
            return login_range(f.read())
    except OSError:
        return DEFAULT_LOGIN_RANGE


def path_within(path: str, root: str) -> bool:
    """Whether the resolved path ``path`` is ``root`` or under it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


# Paths a confinement root must not contain: handing them to an unprivileged uid
# would give it the system (think of a confined binding without a workspace in a
# host whose CWD is "/").
_NEVER_HAND_OVER = ("/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64",
                    "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys",
                    "/tmp", "/usr", "/var", "/var/tmp")


def may_hand_over(path: str) -> bool:
    """False for "/", a system directory, or a folder holding one, the Python
    installation or this package (``path`` is a real path)."""
    if path == os.sep:
        return False
    # path_within(kept, path) for each, with the prefix made once (a hand-over asks twice)
    below = path.rstrip(os.sep) + os.sep
    return not any(kept == path or kept.startswith(below)
                   for kept in (*_NEVER_HAND_OVER, *python_paths(), ENGINE_DIR))


#: The protections a worker's READY reports, as stats()[i]["protections"] shows them.
PROTECTIONS = ("env", "network", "filesystem", "processes", "privileges", "unix_sockets",
               "syscalls", "max_processes", "tenant_processes", "disk")
#: What provides each protection of a confined (or network-off) worker on Linux, for the
#: refusal that names what is missing.
PROVIDERS = {
    "filesystem": "Landlock (Linux 5.13+ with landlock among the active LSMs)",
    "processes": "a PID namespace of its own (workers forked from the zygote, not from a "
                 "template: a root host with CAP_SYS_ADMIN, or else user namespaces: "
                 "kernel.unprivileged_userns_clone=1, on Ubuntu 24.04 "
                 "kernel.apparmor_restrict_unprivileged_userns=0, in a container a seccomp "
                 "profile that allows unshare), Landlock ABI 6 (Linux 6.12+), whose scope "
                 "keeps a worker's signals in its domain, or the host's guard of a fresh "
                 "worker (seccomp user notification: Linux 5.5+, 5.7+ where the worker has "
                 "threads)",
    "privileges": "a host that may change uid: root with CAP_SETUID, CAP_SETGID and "
                  "CAP_SETPCAP (a container keeps them unless they were dropped), or a "
                  "non-root host",
    "syscalls": "seccomp filters (CONFIG_SECCOMP_FILTER) on x86_64 or aarch64",
    "unix_sockets": "seccomp filters (CONFIG_SECCOMP_FILTER) on x86_64 or aarch64",
    "max_processes": "a pids cgroup: a root host (cgroup v1 with the pids controller, or "
                     "v2), or a cgroup v2 subtree delegated to the host's user",
    "tenant_processes": "RLIMIT_NPROC of a uid of the tenant's own (max_processes_per_tenant)",
    "disk": "a file system of its own for the tenant's root (disk_mb): a root host with loop "
            "devices (/dev/loop-control) and mkfs.ext4 (e2fsprogs)",
    "network": "network namespaces: CAP_SYS_ADMIN, or unprivileged user namespaces "
               "(kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also "
               "kernel.apparmor_restrict_unprivileged_userns=0); for a network policy, "
               "Landlock ABI 4 (Linux 6.7+) instead",
}


def in_force(kind: str, state: str) -> bool:
    """Whether a protections report entry says the protection holds."""
    if kind == "privileges":
        return state.startswith("uid ")
    if kind == "unix_sockets":
        return state.startswith("blocked")
    if kind == "syscalls":
        return state.startswith("allowlist")
    if kind == "network":
        return state.startswith(("on", "policy"))
    return state.startswith("on")


def not_in_force(report: dict[str, Any], confined: bool, network: "bool | dict[str, Any]",
                 max_processes: Optional[int] = None,
                 disk_mb: Optional[int] = None) -> list[tuple[str, str]]:
    """The protections a worker was asked for that its READY report does not show
    in force, as (kind, what the report says).  ``network``: True, False or a policy."""
    wanted = ["max_processes"] if max_processes else []
    wanted += ["disk"] if disk_mb else []
    # Its own uid's.
    wanted += ["tenant_processes"] if "tenant_processes" in report else []
    if confined:
        wanted += ["filesystem", "processes", "privileges", "syscalls"]
        wanted += [] if network is True else ["unix_sockets"]
    if network is not True:
        wanted.append("network")
    return [(kind, state) for kind in wanted
            if not in_force(kind, state := str(report.get(kind, "unknown")))]


def refused(report: dict[str, Any], limits: dict[str, Any],
            confined: bool) -> list[tuple[str, str]]:
    """What keeps a worker (its READY ``report``, its INIT's ``limits``) from serving:
    the protections asked for and not in force, unless the host said best effort."""
    if limits.get("confine") == BEST_EFFORT:
        return []
    return not_in_force(report, confined, limits.get("network", True),
                        limits.get("max_processes"), limits.get("disk_mb"))


def refusal_text(missing: list[tuple[str, str]]) -> str:
    """Why a worker whose protections ``missing`` (not_in_force()) are not in force was
    not run, with what would provide each."""
    said = "; ".join(f"{kind}: {state}, which needs {PROVIDERS.get(kind, 'a newer kernel')}"
                     for kind, state in missing)
    return (f"its confinement is not all in force ({said}). The call was not run and the "
            f"worker was stopped. With confine=\"best-effort\" it runs with "
            f"what there is (stats() says what is in force).")
