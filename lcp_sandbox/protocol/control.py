"""The zygote's control channel: fixed-size records, never pickled.

The host's end is backends/local/zygote_client.py, the zygote's worker/zygote.py:

    host                               zygote process
      FORK(req, flags) + [sock, log] ► hand them to a spare worker (FORK_PIDNS: one
      ◄── FORKED(req, pid)             that is pid 1 of a PID namespace of its own)
      KILL(pid) / SIGNAL(pid, sig) ──► kill a worker's tree / signal it
      ◄── KILL_FAILED(pid, errno, ended)  a kill of that tree was refused (EPERM: the
                                       zygote lacks CAP_KILL over the worker's uid): at
                                       KILL, or (ended: 1) of what it left behind when
                                       it ended, just before its EXITED
      ◄── EXITED(pid, status)          a worker was reaped
      ◄── ZYGOTE_READY(zygote pid)     once, when it can fork
      TEMPLATE(req) + [conn] fd ──────► fork a template (worker/template.py) on that
      ◄── FORKED(req, template pid)    connection: it imports a library, then waits
      TFORK(req, template pid)         like FORK, from the template's pre-forked spare;
        + [sock, log] fds ───────────► FORKED's third field is 1 when it came from the
      ◄── FORKED(req, pid, templated)  template, 0 when a plain spare served it instead

An AF_UNIX SOCK_SEQPACKET pair: one record per datagram, file descriptors
travel with SCM_RIGHTS.  A record is a kind byte and three integers.
"""
from __future__ import annotations

import struct

FORK, KILL, SIGNAL, FORKED, EXITED, ZYGOTE_READY, TEMPLATE, TFORK = 1, 2, 3, 4, 5, 6, 7, 8
KILL_FAILED = 9
# FORK's flags: a worker in its own PID namespace.
FORK_PIDNS = 1
# Kind, then up to three integers.
RECORD = struct.Struct("!Bqqq")
MAX_RECORD = 64


def pack(kind: int, a: int = 0, b: int = 0, c: int = 0) -> bytes:
    return RECORD.pack(kind, a, b, c)


def unpack(data: bytes) -> tuple[int, int, int, int]:
    """(kind, a, b, c); struct.error for a record of the wrong size."""
    kind, a, b, c = RECORD.unpack(data)
    return kind, a, b, c
