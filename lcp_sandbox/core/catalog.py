"""Finding libraries by name: the lookups behind the LCP mounting helpers.

Pure code over the file system and the discovery cache; nothing runs a tool
file.  A *search dir* is a tools folder (the binding's, then lollms_client's
``default_tools`` when installed); a library named ``X`` is the folder
``<search dir>/X`` or a loose ``X.py`` in one.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Iterable, Optional

from .discovery import (
    Discovered,
    FileCache,
    Library,
    add_library,
    iter_libraries,
    normalize_library_name,
)


def find_library_dir(dirs: Iterable[Path], name: str) -> Optional[Path]:
    """The folder of library ``name`` (also accepting a ``tool_`` prefix)."""
    clean = (name or "").strip()
    if not clean:
        return None
    for folder in dirs:
        for candidate in (clean, clean[5:] if clean.startswith("tool_") else None):
            if candidate and (folder / candidate).is_dir():
                return folder / candidate
    return None


def library_of(dirs: Iterable[Path], name: str) -> Optional[Library]:
    """The library called ``name`` (folder or loose file) in the search dirs."""
    clean = (name or "").strip()
    for lib in iter_libraries(dirs):
        if lib.name == clean or (clean.startswith("tool_") and lib.name == clean[5:]):
            return lib
    return None


def resolve_library_name(dirs: list[Path], raw: str, cache: FileCache) -> Optional[str]:
    """A user's or an LLM's name for a toolkit -> library stem, tolerating case,
    separators, display names (TOOL_LIBRARY_NAME), aliases (TOOL_LIBRARY_ALIASES)
    and close misspellings."""
    clean = (raw or "").strip()
    if not clean:
        return None
    direct = find_library_dir(dirs, clean)
    if direct is not None:
        return direct.name
    wanted = normalize_library_name(clean)
    variants: dict[str, set[str]] = {}
    for lib in iter_libraries(dirs):
        names = variants.setdefault(lib.name, {normalize_library_name(lib.name)})
        for f in lib.files:
            parsed = cache.parse(Path(f))
            if parsed is not None:
                names.add(normalize_library_name(parsed.display_name))
                names.update(normalize_library_name(a) for a in parsed.aliases)
        names.discard("")
        if wanted in names:
            return lib.name
    everything = {v for names in variants.values() for v in names}
    close = difflib.get_close_matches(wanted, everything, n=1, cutoff=0.75)
    if close:
        return next(stem for stem, names in variants.items() if close[0] in names)
    return None


def tools_of(lib: Library, cache: FileCache) -> set[str]:
    """The tool names discovery would register for ``lib`` on its own."""
    out = Discovered()
    parsed = [(i, pf) for i, p in enumerate(lib.files) if (pf := cache.parse(Path(p))) is not None]
    add_library(out, lib, parsed, lambda i, p: True)
    return set(out.routes)


def library_for_tool(dirs: list[Path], tool_name: str, cache: FileCache) -> Optional[Library]:
    """The first library in the search dirs that defines ``tool_name``."""
    for lib in iter_libraries(dirs):
        for f in lib.files:
            parsed = cache.parse(Path(f))
            if parsed is not None and any(t.spec["name"] == tool_name for t in parsed.tools):
                return lib
    return None
