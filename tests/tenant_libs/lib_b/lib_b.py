"""A tiny library."""
import os
import time


def tool_lib_b_pid() -> dict:
    """Returns the worker pid."""
    return {"success": True, "output": os.getpid()}


def tool_lib_b_work(seconds: float = 0.2) -> dict:
    """Busy for a while; returns when it started and ended (CLOCK_MONOTONIC).

    Args:
        seconds (float): how long
    """
    start = time.monotonic()
    while time.monotonic() - start < float(seconds):
        pass
    return {"success": True, "output": {"start": start, "end": time.monotonic(), "pid": os.getpid()}}
