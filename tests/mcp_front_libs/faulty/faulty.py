"""A tool that hangs, one that crashes its worker, one that answers."""
import os
import signal
import time

TOOL_LIBRARY_NAME = "Faulty"
COUNTER = 0


def tool_hang() -> dict:
    """Sleeps far past any timeout."""
    time.sleep(120)
    return {"success": True, "output": "woke up"}


def tool_crash() -> dict:
    """Kills its own worker with SIGSEGV."""
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(30)


def tool_alive() -> dict:
    """Counts its calls; returns the count and the worker's pid."""
    global COUNTER
    COUNTER += 1
    return {"success": True, "output": {"counter": COUNTER, "pid": os.getpid()}}
