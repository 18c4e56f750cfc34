"""Library files compiled once by the host, for every worker that starts on them.

A worker imports its library from the file.  Where it cannot keep a ``.pyc`` (a confined
worker may not write beside the library, tool folders may be read-only, and
PYTHONDONTWRITEBYTECODE turns the cache off) it compiles the file again at each start:
2-7 ms for each file of the bundled tools, 0.35 ms for a 60-line one.  The host compiles
each file once per version and sends the code in the worker's INIT:

    compiled(path) ─► Compiled(magic, mtime_ns, size, inode, marshalled code) | None
                      (None: a fresh .pyc of it was there when this version was first
                      seen, which the worker loads as fast; or it is unreadable or does
                      not compile: the worker's own import then fails as it always did,
                      with the same error)

The worker (worker/library_code.py) runs it only if the file it opens is still of that
version and its interpreter reads this bytecode; else it imports the file itself.  A
version is what a ``.pyc`` checks too (mtime and size), and the inode: a file replaced by
another is compiled anew.  At most MAX_BYTES of code, and MAX_ENTRIES files, are kept: past
that, the cache starts again (as the parse cache of core/discovery.py does).
"""
from __future__ import annotations

import importlib.util
import marshal
import os
from typing import Optional

from ..protocol import Compiled

MAX_BYTES = 64 * 1024 * 1024
# Files (most have a .pyc and no code kept), as the parse cache's bound.
MAX_ENTRIES = 50_000
MAGIC = importlib.util.MAGIC_NUMBER

# Shared by the host's threads without a lock: a dict's get and set are atomic, and a
# cache that starts again when full needs no order.
# path -> (its version, its code; None: a fresh .pyc of that version was there)
_kept: dict[str, tuple[tuple[int, int, int], Optional[Compiled]]] = {}


def version(st: os.stat_result) -> tuple[int, int, int]:
    """What identifies a file's content for the cache: (mtime_ns, size, inode)."""
    return st.st_mtime_ns, st.st_size, st.st_ino


def compiled(path: str) -> Optional[Compiled]:
    """``path`` compiled as an import would compile it, from its current version."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    hit = _kept.get(path)
    if hit is not None and hit[0] == version(st):
        return hit[1]
    if _fresh_pyc(path, st):
        _keep(path, version(st), None)
        return None
    try:
        with open(path, "rb") as f:
            before = version(os.fstat(f.fileno()))
            source = f.read()
            after = version(os.fstat(f.fileno()))
        # As importlib compiles a source file (its encoding line, its own __future__ imports)
        code = compile(source, path, "exec", dont_inherit=True)
    # (The worker's own import says what it is; nothing of it may stop the host.)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None
    # Written while read: no version to name it by.
    if before != after:
        return None
    mtime_ns, size, inode = before
    got = Compiled(magic=MAGIC, mtime_ns=mtime_ns, size=size, inode=inode,
                   code=marshal.dumps(code))
    _keep(path, before, got)
    return got


def _fresh_pyc(path: str, st: os.stat_result) -> bool:
    """A .pyc of ``path``'s version, as importlib checks one (timestamp-based: magic,
    flags 0, the source's mtime in seconds and its size)."""
    try:
        with open(importlib.util.cache_from_source(path), "rb") as f:
            head = f.read(16)
    except (OSError, ValueError, NotImplementedError):
        return False
    return head == MAGIC + bytes(4) + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") \
        + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")


def _keep(path: str, seen: tuple[int, int, int], got: Optional[Compiled]) -> None:
    size = len(got.code) if got is not None else 0
    if size > MAX_BYTES:
        return
    kept = [c for _, c in list(_kept.values()) if c is not None]
    if sum(len(c.code) for c in kept) + size > MAX_BYTES or len(_kept) >= MAX_ENTRIES:
        _kept.clear()
    _kept[path] = (seen, got)


def clear() -> None:
    """Forget every file (tests)."""
    _kept.clear()
