"""Probes the channels between two workers (loopback, netlink, abstract unix sockets,
signals) and what a worker holds (credentials, filters, namespaces, reachable paths)."""
import os
import socket

_HELD = []          # sockets a tool opened and keeps listening (module state)
IMPORTED_BY = os.getpid()       # the process that imported this module (a template's pid, or its own)


def _err(exc: BaseException) -> str:
    return type(exc).__name__


def tool_listen(kind: str) -> dict:
    """Opens a listening endpoint of ``kind`` (tcp, udp, abstract) and keeps it; its address."""
    try:
        if kind == "tcp":
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            s.listen(4)
            addr = s.getsockname()[1]
        elif kind == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            addr = s.getsockname()[1]
        else:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            name = f"lcp-test-{os.getpid()}"
            s.bind("\0" + name)
            s.listen(4)
            addr = name
    except OSError as exc:
        return {"success": True, "output": {"error": _err(exc)}}
    _HELD.append(s)
    return {"success": True, "output": {"addr": addr, "pid": os.getpid()}}


def tool_reach(kind: str, addr, pid: int = 0) -> dict:
    """Tries to reach another worker's endpoint of ``kind`` ("ok" or the error's type),
    or, for "signal", to signal ``pid`` (signal 0 and SIGCONT)."""
    try:
        if kind == "signal":
            os.kill(pid, 0)
            os.kill(pid, 18)
        elif kind == "tcp":
            with socket.create_connection(("127.0.0.1", int(addr)), timeout=2):
                pass
        elif kind == "udp":
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b"x", ("127.0.0.1", int(addr)))
        elif kind == "usersock":
            with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2) as s:     # NETLINK_USERSOCK
                s.bind((0, 0))
        else:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect("\0" + addr)
    except OSError as exc:
        return {"success": True, "output": _err(exc)}
    return {"success": True, "output": "ok"}


STATUS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
          "Seccomp", "Seccomp_filters")


def _try(fn) -> str:
    try:
        fn()
        return "ok"
    except OSError as exc:
        return _err(exc)


def tool_holds(paths: dict, host_pid: int = 1) -> dict:
    """/proc/self/status's credentials and filters, the network namespace (whether it is
    the host's, given its inode), and what each of ``paths`` ({label: [path, "read" |
    "write"]}) allows, and whether it can read the host process's /proc entry."""
    with open("/proc/self/status") as f:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    out = {k: " ".join(fields.get(k, "").split()) for k in STATUS}
    out["netns"] = os.readlink("/proc/self/ns/net")
    out["env"] = sorted(os.environ)
    out["tmp_in_its_own_dir"] = os.environ.get("TMPDIR", "")
    for label, (path, how) in paths.items():
        if how == "read":
            out[label] = _try(lambda p=path: open(p).close() if os.path.isfile(p) else os.listdir(p))
        else:
            out[label] = _try(lambda p=path: open(os.path.join(p, f"w-{os.getpid()}"), "w").close())
    out["proc_host"] = _try(lambda: open(f"/proc/{host_pid}/status").close())
    out["inet"] = _try(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
    return {"success": True, "output": out}


def tool_imported_by() -> dict:
    """The pid of the process that imported this module, and this worker's."""
    return {"success": True, "output": [IMPORTED_BY, os.getpid()]}
