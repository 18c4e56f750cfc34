"""Modules imported ahead: the standard modules tool libraries commonly import, which the
engine itself does not need before a call.

    the zygote        import_ahead() before its first fork: shared by every worker
    a spawned spare   import_ahead(call_waiting) while no call waits (backends/local/spawn.py
                      says which spares do): a call that comes meanwhile is served first

A library's first import then finds them loaded.  A worker's own start imports none of them
(tests/engine/test_spawn.py checks): everything it imports is on the path of a call that
found no spare.
"""
from __future__ import annotations

import importlib
from typing import Callable

AHEAD = ("ctypes", "dataclasses", "datetime", "inspect", "json", "logging", "pathlib", "re",
         "sqlite3", "tempfile", "threading", "traceback", "typing", "fcntl")


def import_ahead(call_waiting: Callable[[], bool] = lambda: False) -> None:
    """Import the AHEAD modules, one at a time until ``call_waiting()``: a call that came
    meanwhile is never kept waiting for modules it may not need."""
    for name in AHEAD:
        if call_waiting():
            return
        try:
            importlib.import_module(name)
        # fcntl on Windows; a module the interpreter was built without
        except ImportError:
            pass
