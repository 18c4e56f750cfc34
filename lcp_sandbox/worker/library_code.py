"""A library file run into its module: the host's compiled code when it still is the file's.

The host sends each file compiled (core/code_cache.py), so a worker that cannot keep a
``.pyc`` does not compile it again.  It is run only when this worker can open the file,
the file is still of the version the host compiled, and this interpreter reads that
bytecode; else the file is imported as it always was (and fails as it always did).
"""
from __future__ import annotations

import importlib.util
import marshal
import os
import types
from typing import TYPE_CHECKING, Optional

from .. import protocol as P
from ..core.code_cache import version

if TYPE_CHECKING:
    # (importlib.abc imports importlib.resources and tempfile: 7 ms at a spawned worker's start)
    from importlib.abc import Loader


def run_file(mod: types.ModuleType, loader: "Loader", path: str,
             host_code: Optional[list[Optional[P.Compiled]]], index: int) -> None:
    """Execute ``path`` into ``mod`` (made from its spec, whose loader is ``loader``).
    ``host_code``: INIT's, ``path`` at ``index``; that entry is dropped as it is taken (a
    worker keeps no copy of code it ran: it would count in its memory for its whole life)."""
    taken = None
    if host_code:
        taken, host_code[index] = host_code[index], None
    code = _usable(path, taken) if taken is not None else None
    if code is None:
        loader.exec_module(mod)
    else:
        exec(code, mod.__dict__)


def _usable(path: str, host_code: P.Compiled) -> Optional[types.CodeType]:
    if host_code.magic != importlib.util.MAGIC_NUMBER:
        return None
    # Opened, not only stat'ed: a file this worker may not read is not run.
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if version(st) != (host_code.mtime_ns, host_code.size, host_code.inode):
        return None
    code = marshal.loads(host_code.code)
    return code if isinstance(code, types.CodeType) else None
