"""A tenant's tool that attacks the other tenant and the host (tests/test_host_kinds.py)."""
import os
import signal
import socket
import stat
import tempfile

STATE = {"calls": 0}
LISTENING = []
#: NETLINK_ROUTE, USERSOCK, SOCK_DIAG, AUDIT, KOBJECT_UEVENT, GENERIC
NETLINK = {"route": 0, "usersock": 2, "sock_diag": 4, "audit": 9, "uevent": 15, "generic": 16}


def tool_count() -> dict:
    """Counts its calls: module state that a killed worker would lose."""
    STATE["calls"] += 1
    return {"success": True, "output": STATE["calls"]}


def tool_listen_abstract() -> dict:
    """Listens on an abstract unix socket of its own (kept open); its name, or the error."""
    name = f"lcp-host-kind-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind("\0" + name)
        s.listen(8)
    except OSError as exc:
        return {"success": True, "output": {"error": type(exc).__name__}}
    LISTENING.append(s)
    return {"success": True, "output": {"name": name}}


def _try(fn):
    try:
        out = fn()
        return "ok" if out is None else out
    except OSError as exc:
        return type(exc).__name__


def _connect(family: int, kind: int, address) -> None:
    with socket.socket(family, kind) as s:
        s.settimeout(5)
        s.connect(address)


def _sendto_udp(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"from a tenant", ("127.0.0.1", port))


def _raw() -> None:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()


def _packet() -> None:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()


def _netlink(protocol: int) -> None:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol).close()


def _dgram_pair() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.close()
    b.close()


def _created(path: str) -> str:
    """Create ``path`` (a new file); its permission bits, octal."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        return oct(stat.S_IMODE(os.fstat(fd).st_mode))
    finally:
        os.close(fd)
        os.unlink(path)


def _mkstemp() -> list:
    """Where tempfile puts a file of this worker's, and its mode."""
    fd, path = tempfile.mkstemp()
    try:
        return [os.path.dirname(path), oct(stat.S_IMODE(os.fstat(fd).st_mode))]
    finally:
        os.close(fd)
        os.unlink(path)


def _network(host: dict) -> dict:
    """The host's endpoints, and the sockets a network-off worker must not have."""
    return {
        "tcp_host": _try(lambda: _connect(socket.AF_INET, socket.SOCK_STREAM,
                                          ("127.0.0.1", host["tcp"]))),
        "udp_host": _try(lambda: _sendto_udp(host["udp"])),
        "raw": _try(_raw),
        "packet": _try(_packet),
        "abstract_host": _try(lambda: _connect(socket.AF_UNIX, socket.SOCK_STREAM,
                                               "\0" + host["abstract"])),
        "unix_host": _try(lambda: _connect(socket.AF_UNIX, socket.SOCK_STREAM, host["unix"])),
        "dgram_pair": _try(_dgram_pair),
        "netlink": {name: _try(lambda p=p: _netlink(p)) for name, p in NETLINK.items()},
    }


def tool_attack(other_root: str, other_pid: int, host_pid: int, host: dict = None,
                other_abstract: str = "") -> dict:
    """Everything one tenant's worker may try against another tenant and the host.

    Args:
        other_root (str): the other tenant's folder
        other_pid (int): the other tenant's worker, as the host knows it
        host_pid (int): the host process
        host (dict): the host's endpoints: tcp and udp ports on 127.0.0.1, an abstract
            unix socket's name, a pathname unix socket (none given: not tried)
        other_abstract (str): the abstract unix socket the other tenant listens on
    """
    parent = os.path.dirname(other_root)
    me = os.getpid()
    out = {
        "read_secret": _try(lambda: open(os.path.join(other_root, "secret.txt")).read()),
        "list_other": _try(lambda: os.listdir(other_root)),
        "write_other": _try(lambda: open(os.path.join(other_root, "planted.txt"), "w").close()),
        "list_tenants": _try(lambda: sorted(os.listdir(parent))),
        "proc_other": _try(lambda: open(f"/proc/{other_pid}/environ").read()),
        "proc_host": _try(lambda: open(f"/proc/{host_pid}/environ").read()),
        "proc_other_cmdline": _try(lambda: open(f"/proc/{other_pid}/cmdline").read()),
        "signal_other": _try(lambda: os.kill(other_pid, signal.SIGCONT)),
        "signal_host": _try(lambda: os.kill(host_pid, signal.SIGCONT)),
        "renice_other": _try(lambda: os.setpriority(os.PRIO_PROCESS, other_pid, 19)),
        "pin_other": _try(lambda: os.sched_setaffinity(other_pid, {0})),
        "write_tmp": _try(lambda: _created(f"/tmp/lcp-attacker-{me}")),
        "write_shm": _try(lambda: _created(f"/dev/shm/lcp-attacker-{me}")),
        "write_var_tmp": _try(lambda: _created(f"/var/tmp/lcp-attacker-{me}")),
        "mkstemp": _try(_mkstemp),
        "read_shadow": _try(lambda: open("/etc/shadow").read()),
        "read_uid_store": _try(lambda: open(os.path.join(parent, ".lcp-sandbox-uids.jsonl"))
                               .read()),
        "uid": os.getuid(),
    }
    if host:
        out.update(_network(host))
    if other_abstract:
        out["abstract_other"] = _try(lambda: _connect(socket.AF_UNIX, socket.SOCK_STREAM,
                                                      "\0" + other_abstract))
    return {"success": True, "output": out}


def tool_kill_everyone() -> dict:
    """kill(-1, SIGKILL): every process this worker may signal."""
    try:
        os.kill(-1, signal.SIGKILL)
        return {"success": True, "output": "sent"}
    except OSError as exc:
        return {"success": True, "output": type(exc).__name__}


_LIBC = None


def _syscall(name: str, *args: int) -> None:
    """A raw system call by name (x86_64, aarch64 numbers); OSError on failure."""
    import ctypes
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
        _LIBC.syscall.restype = ctypes.c_long
    numbers = {"x86_64": {"tgkill": 234, "tkill": 200, "rt_sigqueueinfo": 129, "getpgid": 121},
               "aarch64": {"tgkill": 131, "tkill": 130, "rt_sigqueueinfo": 138, "getpgid": 155}}
    nr = numbers[os.uname().machine][name]
    if _LIBC.syscall(ctypes.c_long(nr), *map(ctypes.c_long, args)) < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _sigio_to(pid: int) -> None:
    """Make ``pid`` (a group when negative) the owner of a pipe's SIGIO."""
    import fcntl
    r, w = os.pipe()
    try:
        fcntl.fcntl(r, fcntl.F_SETOWN, pid)
    finally:
        os.close(r)
        os.close(w)


def _own_child(group: bool) -> str:
    """Fork a child that waits, signal it (by its group, ``group``), reap it: how it ended."""
    import time
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    if group:
        os.setpgid(pid, pid)
        os.killpg(pid, signal.SIGKILL)
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return f"killed by {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {status}"


def tool_name_processes(other_pid: int, host_pid: int, host_pgid: int) -> dict:
    """The calls that name a process, against the other tenant's worker and the host (by
    the pids the host knows), and against this worker's own children.

    Args:
        other_pid (int): the other tenant's worker, as the host knows it
        host_pid (int): the host process
        host_pgid (int): the host's process group
    """
    import resource
    out = {
        "tgkill_other": _try(lambda: _syscall("tgkill", other_pid, other_pid, 0)),
        "tkill_other": _try(lambda: _syscall("tkill", other_pid, 0)),
        "sigqueue_host": _try(lambda: _syscall("rt_sigqueueinfo", host_pid, 0, 0)),
        "probe_other": _try(lambda: os.kill(other_pid, 0)),
        "pidfd_other": _try(lambda: os.close(os.pidfd_open(other_pid))),
        "pidfd_host": _try(lambda: os.close(os.pidfd_open(host_pid))),
        "killpg_host": _try(lambda: os.killpg(host_pgid, 0)),
        "kill_own_group": _try(lambda: os.kill(0, 0)),
        "sigio_other": _try(lambda: _sigio_to(other_pid)),
        "sigio_host_group": _try(lambda: _sigio_to(-host_pgid)),
        "priority_other": _try(lambda: os.getpriority(os.PRIO_PROCESS, other_pid)),
        "pgid_other": _try(lambda: _syscall("getpgid", other_pid)),
        "setpriority_other": _try(lambda: os.setpriority(os.PRIO_PROCESS, other_pid, 19)),
        "prlimit_other": _try(lambda: resource.prlimit(other_pid, resource.RLIMIT_NOFILE)),
        "own_child": _try(lambda: _own_child(group=False)),
        "own_child_group": _try(lambda: _own_child(group=True)),
        "own_pidfd": _try(lambda: os.close(os.pidfd_open(os.getpid()))),
        "own_priority": _try(lambda: os.getpriority(os.PRIO_PROCESS, os.getpid())),
    }
    return {"success": True, "output": out}
