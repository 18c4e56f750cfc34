"""Benchmark library with a heavier import: a realistic tool library pulls in
a dozen standard-library packages (none of them preloaded by the zygote).

``tool_heavy_stamp`` returns the same stamps as ``bench_noop.tool_stamp``, so
the cold rows show how much of a first call is the library's own import.
"""
import os
import time

_T_IMPORT_START = time.perf_counter()

import asyncio  # noqa: E402,F401
import csv  # noqa: E402,F401
import decimal  # noqa: E402,F401
import email.message  # noqa: E402,F401
import email.parser  # noqa: E402,F401
import http.client  # noqa: E402,F401
import urllib.request  # noqa: E402,F401
import xml.etree.ElementTree  # noqa: E402,F401
import zipfile  # noqa: E402,F401
import tarfile  # noqa: E402,F401
import difflib  # noqa: E402,F401
import statistics  # noqa: E402,F401

_T_INIT_START = None
_T_INIT_END = None


def init_tools_library(config=None) -> None:
    """Records when the host's init hook ran."""
    global _T_INIT_START, _T_INIT_END
    _T_INIT_START = time.perf_counter()
    _T_INIT_END = time.perf_counter()


def tool_heavy_stamp() -> dict:
    """Returns the worker's pid and perf_counter stamps of its import, init and this call.

    Returns:
        dict: pid, import_start, import_end, init_start, init_end, call
    """
    now = time.perf_counter()
    return {"pid": os.getpid(), "import_start": _T_IMPORT_START, "import_end": _T_IMPORT_END,
            "init_start": _T_INIT_START, "init_end": _T_INIT_END, "call": now}


_T_IMPORT_END = time.perf_counter()
