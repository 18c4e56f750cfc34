"""Benchmark library: a trivial import and tools that do (almost) nothing.

Used by ``lcp-sandbox bench`` for the warm, cold, throughput and memory rows.
The module records ``time.perf_counter()`` at the top and bottom of its body
and around ``init_tools_library``; ``tool_stamp`` returns those stamps, so the
harness can split a cold start into phases.  ``perf_counter`` is
CLOCK_MONOTONIC on Linux, a system-wide clock, so stamps taken here compare
with the host's.
"""
import os
import time

_T_IMPORT_START = time.perf_counter()          # first line of the module body
_T_INIT_START = None
_T_INIT_END = None
_CALLS = 0


def init_tools_library(config=None) -> None:
    """Records when the host's init hook ran."""
    global _T_INIT_START, _T_INIT_END
    _T_INIT_START = time.perf_counter()
    _T_INIT_END = time.perf_counter()


def tool_noop() -> dict:
    """Does nothing and returns a tiny result, {"ok": True} (no parameters: its schema is
    empty, so an MCP client may call it with no arguments)."""
    return {"ok": True}


def tool_cpu(ms: float = 1.0) -> dict:
    """Burns about `ms` milliseconds of this thread's CPU time.

    Args:
        ms (float): CPU milliseconds to burn.

    Returns:
        dict: {"ms": ms}
    """
    clock = time.thread_time
    end = clock() + ms / 1000.0
    x = 0
    while clock() < end:
        for i in range(100):
            x += i
    return {"ms": ms}


def tool_stamp() -> dict:
    """Returns the worker's pid and perf_counter stamps of its import, init and this call.

    Returns:
        dict: pid, import_start, import_end, init_start, init_end, call, calls
    """
    global _CALLS
    now = time.perf_counter()
    _CALLS += 1
    return {"pid": os.getpid(), "import_start": _T_IMPORT_START, "import_end": _T_IMPORT_END,
            "init_start": _T_INIT_START, "init_end": _T_INIT_END, "call": now, "calls": _CALLS}


_T_IMPORT_END = time.perf_counter()            # last line of the module body
