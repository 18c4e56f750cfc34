"""Probes what a worker may do: its credentials, privileged calls, unix sockets."""
import ctypes
import os
import socket
import stat
import tempfile

STATUS_KEYS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")


def tool_status() -> dict:
    """This worker's credentials, as /proc/self/status shows them."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in STATUS_KEYS:
                out[key] = " ".join(value.split())
    return {"success": True, "output": out}


def tool_write(name: str, text: str) -> dict:
    """Writes a file in the workspace and one in TMPDIR, appends to ``name`` if it exists.

    Args:
        name (str): file name in the workspace
        text (str): content
    """
    try:
        with open(name, "a") as f:
            f.write(text)
        fd, tmp = tempfile.mkstemp()
        os.write(fd, text.encode())
        os.close(fd)
        return {"success": True, "output": {"file": os.path.realpath(name), "tmp": tmp,
                                            "tmp_owner": os.stat(tmp).st_uid}}
    except OSError as exc:
        return {"success": False, "error": f"{type(exc).__name__}: {exc}"}


def tool_try(what: str, path: str = "") -> dict:
    """Attempts one privileged thing; says whether it worked.

    Args:
        what (str): setuid0, setgid0, raw_socket, chown_root
        path (str): file for chown_root
    """
    try:
        if what == "setuid0":
            os.setuid(0)
        elif what == "setgid0":
            os.setgid(0)
        elif what == "raw_socket":
            socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
        elif what == "chown_root":
            os.chown(path, 0, 0)
        else:
            raise ValueError(what)
    except OSError as exc:
        return {"success": True, "output": {"ok": False, "error": type(exc).__name__, "errno": exc.errno}}
    return {"success": True, "output": {"ok": True}}


def tool_import(name: str) -> dict:
    """Imports a module (the worker may not have it yet); its file.

    Args:
        name (str): module name
    """
    import importlib
    return {"success": True, "output": importlib.import_module(name).__file__}


def tool_read(path: str) -> dict:
    """Reads a file: its text, or the error's type name.

    Args:
        path (str): file path
    """
    try:
        with open(path) as f:
            return {"success": True, "output": f.read()}
    except OSError as exc:
        return {"success": True, "output": type(exc).__name__}


def tool_unix_connect(path: str) -> dict:
    """Connects to a pathname unix socket and reads one line.

    Args:
        path (str): socket path
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(path)
            return {"success": True, "output": s.recv(64).decode()}
    except OSError as exc:
        return {"success": False, "error": f"{type(exc).__name__}: {exc}"}


def tool_pairs() -> dict:
    """socketpair() of each kind, and an asyncio loop (it makes a socketpair)."""
    import asyncio
    out = {}
    for kind, typ in (("stream", socket.SOCK_STREAM), ("seqpacket", socket.SOCK_SEQPACKET),
                      ("dgram", socket.SOCK_DGRAM)):
        try:
            a, b = socket.socketpair(socket.AF_UNIX, typ)
            with a, b:
                a.sendall(b"ping")
                out[kind] = b.recv(4).decode()
        except OSError as exc:
            out[kind] = type(exc).__name__
    out["asyncio"] = asyncio.run(asyncio.sleep(0, result="ran"))
    return {"success": True, "output": out}


def tool_socket(family: int) -> dict:
    """Creates a socket of a family: "ok" or the error's type name.

    Args:
        family (int): address family number
    """
    try:
        socket.socket(int(family), socket.SOCK_STREAM).close()
        return {"success": True, "output": "ok"}
    except OSError as exc:
        return {"success": True, "output": type(exc).__name__}


def tool_syscall(name: str) -> dict:
    """A raw system call that could open a unix socket by a side door: (result, errno).

    Args:
        name (str): x32_socket (x86_64 only) or io_uring_setup
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if name == "x32_socket":
        rc = libc.syscall(ctypes.c_long(0x40000000 | 41), ctypes.c_long(socket.AF_UNIX),
                          ctypes.c_long(socket.SOCK_STREAM), ctypes.c_long(0))
    elif name == "io_uring_setup":
        params = ctypes.create_string_buffer(120)
        rc = libc.syscall(ctypes.c_long(425), ctypes.c_long(1), params)
    else:
        raise ValueError(name)
    err = ctypes.get_errno() if rc < 0 else 0
    if rc >= 0:
        os.close(rc)
    return {"success": True, "output": [int(rc >= 0), err]}


def tool_sockets() -> dict:
    """The sockets this process holds: (family, type, connected) for each."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
        except OSError:
            continue
        s = socket.socket(fileno=os.dup(fd))
        try:
            try:
                s.getpeername()
                connected = True
            except OSError:
                connected = False
            out.append([int(s.family), int(s.type), connected])
        finally:
            s.close()
    return {"success": True, "output": out}
