"""Probes what a worker can see and do: files, environment, network, state."""
import os
import socket
import time

STATE = {}


def tool_remember(key: str, value: str) -> dict:
    """Stores a value in module state.

    Args:
        key (str): key
        value (str): value
    """
    STATE[key] = value
    return {"success": True, "output": dict(STATE)}


def tool_recall() -> dict:
    """Returns the module state."""
    return {"success": True, "output": {"state": dict(STATE), "pid": os.getpid()}}


def tool_read_file(path: str) -> dict:
    """Reads a file.

    Args:
        path (str): relative or absolute path
    """
    try:
        with open(path) as f:
            return {"success": True, "output": f.read()}
    except OSError as exc:
        return {"success": False, "error": f"{type(exc).__name__}: {exc}"}


def tool_write_file(path: str, text: str) -> dict:
    """Writes a file.

    Args:
        path (str): relative or absolute path
        text (str): content
    """
    try:
        with open(path, "w") as f:
            f.write(text)
        return {"success": True, "output": os.path.realpath(path)}
    except OSError as exc:
        return {"success": False, "error": f"{type(exc).__name__}: {exc}"}


def tool_getenv(name: str) -> dict:
    """Looks for an environment variable, in os.environ and in /proc/self/environ.

    Args:
        name (str): variable name
    """
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        raw = b""
    return {"success": True, "output": {"environ": os.environ.get(name),
                                        "proc": (name + "=").encode() in raw}}


def tool_connect(host: str, port: int) -> dict:
    """Opens a TCP connection and reads one line.

    Args:
        host (str): address
        port (int): port
    """
    try:
        with socket.create_connection((host, int(port)), timeout=3) as s:
            return {"success": True, "output": s.recv(64).decode()}
    except OSError as exc:
        return {"success": False, "error": f"{type(exc).__name__}: {exc}"}


def tool_work(seconds: float = 0.2) -> dict:
    """Busy for a while; returns when it started and ended (CLOCK_MONOTONIC).

    Args:
        seconds (float): how long
    """
    start = time.monotonic()
    while time.monotonic() - start < float(seconds):
        pass
    return {"success": True, "output": {"start": start, "end": time.monotonic(), "pid": os.getpid()}}
