"""Windows only — UNTESTED on this project's machines (Linux): written to the documented
Win32 API, kept small and apart.

A spawned worker on Windows gets:
  * its channel: ``socket.share(pid)`` of its socketpair end, sent first on its control
    pipe (length, then bytes; worker/spawned.py calls ``socket.fromshare``);
  * a Job Object of its own, ``JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`` (the host's handle
    closing, even by the host's death, ends the worker and everything it started) and,
    once the worker has a library, ``JOB_OBJECT_LIMIT_PROCESS_MEMORY`` = its memory_mb
    (an allocation past it fails inside the tool, as RLIMIT_DATA's on Linux).

The worker is assigned to its job before it gets its INIT: no tool code runs outside it.
"""
from __future__ import annotations

import ctypes
import subprocess
from ctypes import wintypes
from typing import Any, Optional

# Windows only.
_last_error: Any = getattr(ctypes, "get_last_error", lambda: 0)
_KILL_ON_JOB_CLOSE = 0x2000
_PROCESS_MEMORY = 0x100
_EXTENDED_LIMIT_INFORMATION = 9


class _IoCounters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in (
        "ReadOperationCount", "WriteOperationCount", "OtherOperationCount",
        "ReadTransferCount", "WriteTransferCount", "OtherTransferCount")]


class _BasicLimits(ctypes.Structure):
    _fields_ = [("PerProcessUserTimeLimit", ctypes.c_int64),
                ("PerJobUserTimeLimit", ctypes.c_int64),
                ("LimitFlags", wintypes.DWORD), ("MinimumWorkingSetSize", ctypes.c_size_t),
                ("MaximumWorkingSetSize", ctypes.c_size_t), ("ActiveProcessLimit", wintypes.DWORD),
                ("Affinity", ctypes.c_size_t), ("PriorityClass", wintypes.DWORD),
                ("SchedulingClass", wintypes.DWORD)]


class _ExtendedLimits(ctypes.Structure):
    _fields_ = [("BasicLimitInformation", _BasicLimits), ("IoInfo", _IoCounters),
                ("ProcessMemoryLimit", ctypes.c_size_t), ("JobMemoryLimit", ctypes.c_size_t),
                ("PeakProcessMemoryUsed", ctypes.c_size_t), ("PeakJobMemoryUsed", ctypes.c_size_t)]


class Job:
    """One worker's Job Object."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._k32: Any = ctypes.WinDLL(                    # type: ignore[attr-defined]
            "kernel32", use_last_error=True)
        self.handle = self._k32.CreateJobObjectW(None, None)
        if not self.handle:
            raise OSError(_last_error(), "CreateJobObjectW failed")
        self._set(None)
        handle = int(popen._handle)                        # type: ignore[attr-defined]
        if not self._k32.AssignProcessToJobObject(self.handle, handle):
            raise OSError(_last_error(), "AssignProcessToJobObject failed")

    def _set(self, memory_mb: Optional[float]) -> None:
        info = _ExtendedLimits()
        flags = _KILL_ON_JOB_CLOSE | (_PROCESS_MEMORY if memory_mb else 0)
        info.BasicLimitInformation.LimitFlags = flags
        info.ProcessMemoryLimit = int((memory_mb or 0) * 1048576)
        if not self._k32.SetInformationJobObject(self.handle, _EXTENDED_LIMIT_INFORMATION,
                                                 ctypes.byref(info), ctypes.sizeof(info)):
            raise OSError(_last_error(), "SetInformationJobObject failed")

    def limit_memory(self, memory_mb: Optional[float]) -> None:
        if memory_mb:
            self._set(memory_mb)

    def kill(self) -> None:
        self._k32.TerminateJobObject(self.handle, 1)

    def close(self) -> None:
        if self.handle:
            self._k32.CloseHandle(self.handle)
            self.handle = None


def share_socket(popen: subprocess.Popen, sock: Any) -> Job:
    """Put the new worker in a Job Object, then send it its socket (length, bytes)."""
    job = Job(popen)
    data = sock.share(popen.pid)
    assert popen.stdin is not None
    popen.stdin.write(len(data).to_bytes(4, "little") + data)
    popen.stdin.flush()
    return job
