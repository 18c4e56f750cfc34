"""A spare's dry run of a worker's first session, before it is handed out.

A forked process copies every page it writes to, and CPython writes to every
object it touches (reference counts): the first call of a fresh worker paid for
hundreds of page copies and faults on its critical path.  A spare (plain, from
the zygote, or a template's) waits for its descriptors anyway, so it runs
loop.session() first on a socketpair of its own:

    INIT  (its own environment and 64 more variables, unset afterwards; limits: only
           what every worker sets anyway, no core files)
    ◄── READY
    CALL  tool_rehearse in lcp_sandbox_rehearsal.py (imported from its file, as a library is)
    ◄── RESULT
    SHUTDOWN

Nothing of it stays in force: the module is dropped, the CWD restored, and the
real INIT sets the environment again.  ``loop.REHEARSED`` says what ran (the
worker's READY reports it).  Only an optimization: a failure is ignored.
"""
from __future__ import annotations

import os
import sys

from .. import protocol as P
from ..core import normalize
from ..core.code_cache import compiled
from . import loop

LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lcp_sandbox_rehearsal.py")
_MODULE = loop.PERSISTENT_PREFIX + "lcp_sandbox_rehearsal"
# Variables set, then unset: the C library's environment array grows to hold a host's
# environment, and the memory its setenv() allocates is paged in, before the real INIT.
_ENV = {f"LCP_SANDBOX_REHEARSAL_{i}".encode(): b"x" * 48 for i in range(64)}


def rehearse() -> None:
    # A template's own library of that name.
    if _MODULE in sys.modules:
        return
    host_end, ours = P.pair()
    host = P.Connection(host_end)
    cwd = os.getcwd()
    try:
        # Bytes, as a host's INIT has it.
        env = {**os.environb, **_ENV}
        host.send(P.INIT, P.Init("_rehearsal", [LIBRARY], None, {}, 0, None, env, None, None, [],
                                 {"max_result_mb": 64}, None, [compiled(LIBRARY)]))
        host.send(P.CALL, P.Call("tool_rehearse", 0, {"a": 1, "b": "x"}, cwd, None, 0))
        host.send(P.SHUTDOWN)
        loop.session(P.Connection(ours))
        decoder = P.Decoder()
        # READY, RESULT: as the host reads them.
        for _ in range(2):
            kind, payload = host.recv_frame()
            P.parse_from_worker(kind, payload, decoder)
        normalize.normalize({"success": False, "error": "e", "data": 1}, cwd)
        loop.REHEARSED[:] = ["session", os.path.basename(LIBRARY)]
    finally:
        host.close()
        ours.close()
        os.chdir(cwd)
        for key in _ENV:
            os.environb.pop(key, None)
        sys.modules.pop(_MODULE, None)
