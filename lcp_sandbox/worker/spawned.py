"""A spawned worker: the spawn start path's fresh interpreter, with only what every OS has.

    host (backends/local/spawn.py)                      this process
      Popen(python -I -c BOOT ...)  ─────────────────►  main(): engine imported
      a spare that is up: handed out first  ◄─────────  BOOTED (one byte, before any frame);
                                                           then, while no call waits, ahead.py's
                                                           modules
        stdin   the control pipe (the host's end only)     fd 0 moved aside, /dev/null in its
                                                           place (a tool's children never hold it)
        stdout + stderr   the log pipe (host threads)     line-buffered
        channel: a socketpair end (POSIX: pass_fds;       the same socket, non-inheritable
                 Windows: socket.share() bytes first      (socket.fromshare(), untested here)
                 on the control pipe)
      INIT [+ the first call] ───────────────────────►  loop.serve(sock, PortableConnection)
      control record: the call's number (4 bytes) ────►  the control thread: interrupt_main(SIGINT)
                                                           ─► on_interrupt() in the main thread:
                                                           still that call? the loop's soft-timeout
                                                           handler (ToolTimeout in the tool)
      control pipe EOF (the host is gone, even killed) ─►  the worker's process tree killed, exit
      (and at any end of the worker loop: its tree ends with it, end_tree())

The soft interrupt is seen between bytecodes only: a tool blocked in C (time.sleep,
a read) sees it when it returns to Python, so the host's hard kill after grace_s
stays.  On Linux a spawned worker confines exactly as a forked one (loop.py imports
worker/confine/'s prepare()); elsewhere worker/portable_prepare.py's.
"""
from __future__ import annotations

import _thread
import atexit
import functools
import io
import os
import select
import signal
import socket
import struct
import sys
import threading
from typing import Any, cast

from .. import protocol as P
from . import loop
from .ahead import import_ahead

# A control record: the number of the call to interrupt.
CONTROL = struct.Struct("<I")
# The call the last record named.
_wanted = [0]


def main(arg: str, ahead: str = "lean") -> None:
    """Entry point (backends/boot.py's boot line): ``arg`` is the channel's
    descriptor, or "share" (Windows: its share bytes come first on the control pipe);
    ``ahead``: "ahead" to import ahead.AHEAD while no call waits (backends/local/spawn.py
    says which spares do)."""
    # Non-inheritable, as os.dup makes it.
    control = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for stream in (sys.stdout, sys.stderr):
        try:
            cast(io.TextIOWrapper, stream).reconfigure(line_buffering=True)
        except Exception:
            pass
    # Windows (untested on these machines)
    if arg == "share":
        size = CONTROL.unpack(_read(control, CONTROL.size))[0]
        sock = socket.fromshare(_read(control, size))   # type: ignore[attr-defined]
    else:
        fd = int(arg)
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, on_interrupt)
    # The first registered runs last, after the tools' own.
    atexit.register(end_tree)
    # Up: the host hands out a spare that said so before one still starting.
    sock.sendall(P.BOOTED)
    # A spare that is up before its call: the modules tools commonly import.  A call
    # already waiting is served first.
    if ahead == "ahead":
        import_ahead(lambda: bool(select.select([sock], [], [], 0)[0]))
    # The control thread starts once the worker is confined: capabilities and Landlock
    # are per thread, so a thread started before prepare() would keep what it drops.
    loop.serve(sock, P.PortableConnection, functools.partial(
        threading.Thread(target=_control, args=(control,), name="lcp-sandbox-control",
                         daemon=True).start))


def _read(fd: int, n: int) -> bytes:
    """Exactly ``n`` bytes of ``fd``, or fewer at EOF."""
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _control(fd: int) -> None:
    """The control thread: interrupt requests until EOF, then the end of this tree."""
    while True:
        try:
            record = _read(fd, CONTROL.size)
        except OSError:
            record = b""
        if len(record) < CONTROL.size:
            end_tree()
        _wanted[0] = CONTROL.unpack(record)[0]
        # Handled in the main thread, below.
        _thread.interrupt_main(signal.SIGINT)


def on_interrupt(signum: int, frame: Any) -> None:
    """(main thread) The host asked to interrupt call number ``_wanted``: if that call
    still runs, as the soft-timeout signal would (a late request for an earlier call
    is dropped)."""
    workers = loop.ACTIVE
    if not workers or workers[0].ch.call_seq & 0xFFFFFFFF != _wanted[0]:
        return
    handler = signal.getsignal(P.SOFT_TIMEOUT_SIGNAL)
    if callable(handler):
        handler(signum, frame)


def end_tree() -> None:
    """This worker ends (the host is gone, or it was told to stop, or its library failed to
    load): what its tools started ends with it, as the zygote ends a forked worker's tree.
    Its descendants (psutil), then its process group, itself included (POSIX); on Windows
    its Job Object does the rest when the host closes it."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        import psutil
        for child in psutil.Process().children(recursive=True):
            child.kill()
    except Exception:
        pass
    if hasattr(os, "killpg"):
        try:
            # Its process group (it leads it)
            os.killpg(0, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)
