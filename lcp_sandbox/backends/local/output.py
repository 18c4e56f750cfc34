"""What tools print: worker stdout/stderr pipes forwarded to host logging.

One thread serves every worker's pipe (epoll: a new pipe is added from the
starting thread, without waking the pump).  Output is cut into lines (each at
most ``MAX_LINE`` characters) and logged on ``lcp_sandbox.tool.<library>``;
each worker may log ``bytes_per_s`` per second, the rest is counted and
reported in one line, so a tool printing in a loop cannot flood the host.
Prints never touch the call pipe, so they cannot corrupt the protocol.
(The spawn path, where there may be no epoll, reads each worker's pipe with a
thread of its own and feeds the same ``Stream``: spawn.py.)
"""
from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from typing import Optional

MAX_LINE = 4096
_LIVE_REGISTER = selectors.DefaultSelector is getattr(selectors, "EpollSelector", None)


class Stream:
    __slots__ = ("logger", "rate", "partial", "window", "used", "dropped")

    def __init__(self, library: str, rate: int) -> None:
        self.logger = logging.getLogger(f"lcp_sandbox.tool.{library}")
        self.rate = rate
        self.partial = b""
        self.window = time.monotonic()
        self.used = 0
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        now = time.monotonic()
        if now - self.window >= 1.0:
            self._flush_dropped()
            self.window, self.used = now, 0
        if self.used + len(data) > self.rate:
            keep = max(0, self.rate - self.used)
            self.dropped += len(data) - keep
            data = data[:keep]
        self.used += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()[:MAX_LINE]
        for line in lines:
            self.logger.info("%s", line[:MAX_LINE].decode("utf-8", "replace"))

    def _flush_dropped(self) -> None:
        if self.dropped:
            self.logger.warning("... %d bytes of tool output dropped (over %d bytes/s)",
                                self.dropped, self.rate)
            self.dropped = 0

    def close(self) -> None:
        if self.partial:
            self.logger.info("%s", self.partial.decode("utf-8", "replace"))
        self._flush_dropped()


class OutputPump:
    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="lcp-sandbox-output", daemon=True)
        self._thread.start()

    def add(self, fd: int, library: str, bytes_per_s: int) -> None:
        """Start forwarding ``fd`` (read end; the pump closes it at EOF)."""
        os.set_blocking(fd, False)
        with self._lock:
            if self._closed:
                os.close(fd)
                return
            # Registered from here: an epoll set may change while the pump waits in it, so
            # a new worker's start does not wake the pump thread (a cold start is short of CPU).
            self._sel.register(fd, selectors.EVENT_READ, Stream(library, bytes_per_s))
        if not _LIVE_REGISTER:
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _run(self) -> None:
        while True:
            for key, _ in self._sel.select():
                if key.data is None:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    with self._lock:
                        closed = self._closed
                    if closed:
                        self._drain_all()
                        return
                    continue
                self._read(key.fd, key.data)

    def _read(self, fd: int, stream: Stream) -> bool:
        """Read one chunk; True if there may be more right now."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if data:
            stream.feed(data)
            return True
        self._sel.unregister(fd)
        os.close(fd)
        stream.close()
        return False

    def _drain_all(self) -> None:
        # Closing: take what is already buffered in each pipe, then let go.
        for key in list(self._sel.get_map().values()):
            if key.data is not None:
                for _ in range(64):
                    if not self._read(key.fd, key.data):
                        break
                # Still open: not at EOF yet.
                if key.fd in self._sel.get_map():
                    self._sel.unregister(key.fd)
                    os.close(key.fd)
                    key.data.close()
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def close(self, timeout: Optional[float] = 2.0) -> None:
        with self._lock:
            self._closed = True
        self._wake()
        self._thread.join(timeout)
