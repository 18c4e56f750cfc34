"""Tool discovery: folder rules, the parse cache, specs and routes.

Pure code: nothing here imports or runs a tool file.  The host builds every
tool spec from source text, so constructing a binding has no side effects.

    folders / tool_files ──► iter_libraries() ──► Library(name, key, files)
                                                      │ each file
                                                      ▼
                                   FileCache.parse(path) ── (path, mtime, size) hit? reuse
                                                      │ miss
                                   schemas.parse_source()  (AST, or the regex fallback)
                                                      ▼
                                   discover() ──► [spec, ...] + {tool name: Library}

A *library* is what one worker process loads: every file of one ``X/``
folder, or one loose ``.py`` file, or the code given to
``register_tool_from_code``.
"""
from __future__ import annotations

import functools
import itertools
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from .schemas import ParsedFile, parse_code, parse_source

log = logging.getLogger("lcp_sandbox.discovery")

# Office-family libraries are only admitted when a session flag enables them
# (fail-closed), as lollms_client does.
OFFICE_LIBRARY_STEMS = frozenset({
    "as_is_document_tools", "document_editor", "pptx_builder", "docx_mastery",
    "pptx_mastery", "xlsx_mastery", "powerpoint_tools", "word_tools", "excel_tools",
})
_PER_SOFTWARE_GATES = {
    "powerpoint_tools": "enable_powerpoint",
    "word_tools": "enable_word",
    "excel_tools": "enable_excel",
}


def office_library_admitted(stem: str, session_flags: Optional[dict[str, Any]]) -> bool:
    """Whether the library ``stem`` may load under ``session_flags``.  Only
    office-family libraries are gated: ``powerpoint_tools``, ``word_tools`` and
    ``excel_tools`` need their own flag (``enable_powerpoint``...), the others
    ``enable_office_files`` or any of those three flags."""
    if stem not in OFFICE_LIBRARY_STEMS:
        return True
    flags = session_flags if isinstance(session_flags, dict) else {}
    own = _PER_SOFTWARE_GATES.get(stem)
    if own is not None:
        return bool(flags.get(own))
    return bool(flags.get("enable_office_files")) or any(
        bool(flags.get(g)) for g in _PER_SOFTWARE_GATES.values())


class FileCache:
    """Parsed files keyed by path; an entry is reused while (mtime_ns, size) match.
    Also the libraries of a folder, reused while the folder and its sub-folders
    keep their mtimes (adding, removing or renaming a file changes them).

    One cache serves every binding of the process (``SHARED``): a host that makes a
    binding per tenant (an MCP session, a chat) parses each file once, not once per
    tenant.  Its entries are never changed, only replaced (specs are copied out of
    them), and a dict's get and set are atomic, so threads may share it."""

    # A host discovering more files starts again.
    MAX_ENTRIES = 50_000

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, int, ParsedFile]] = {}
        # folder -> (the directories looked into, their mtimes, its libraries)
        self._folders: dict[str, tuple[list[str], tuple[Optional[int], ...], list[Library]]] = {}

    def folder(self, base: str) -> list[Library]:
        hit = self._folders.get(base)
        if hit is not None and _mtimes(hit[0]) == hit[1]:
            return hit[2]
        dirs: list[str] = []
        libs = list(_scan_folder(base, dirs))
        if len(self._folders) >= self.MAX_ENTRIES:
            self._folders.clear()
        self._folders[base] = (dirs, _mtimes(dirs), libs)
        return libs

    def parse(self, path: Path) -> Optional[ParsedFile]:
        key = str(path)
        try:
            st = os.stat(key)
        except OSError:
            return None
        hit = self._entries.get(key)
        if hit and hit[0] == st.st_mtime_ns and hit[1] == st.st_size:
            return hit[2]
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            log.error("cannot read tool file %s: %s", path, exc)
            return None
        parsed = parse_source(text, path=key)
        if len(self._entries) >= self.MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = (st.st_mtime_ns, st.st_size, parsed)
        return parsed


#: The parse cache of every binding of this process.
SHARED = FileCache()


@dataclass(frozen=True)
class Library:
    """The unit a worker loads.  ``key`` is unique across folders; ``name`` is the stem."""
    name: str
    key: str
    # In load order.
    files: tuple[Path, ...] = ()
    # Code of a dynamic library.
    source: Optional[str] = None
    # The library's folder (read access, display)
    root: Optional[Path] = None

    @property
    def dynamic(self) -> bool:
        return self.source is not None

    @functools.cached_property
    def stems(self) -> tuple[str, ...]:
        """The names its ``host_tool_configs`` entries go by: its files' stems, in load
        order (a dynamic library: its name).  Computed once per Library: a new tenant's
        first call reads it twice."""
        return tuple(f.stem for f in self.files) or (self.name,)


def _entries(folder: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def _real(entry: os.DirEntry[str]) -> str:
    # A DirEntry's type is cached from readdir: only symlinks cost a resolve.
    return os.path.realpath(entry.path) if entry.is_symlink() else entry.path


def iter_libraries(folders: Iterable[Path], tool_files: Iterable[Path] = (),
                   cache: Optional["FileCache"] = None) -> Iterable[Library]:
    """The libraries of ``folders`` (each ``X/`` folder with ``.py`` files, its
    ``X.py`` first, and each loose ``.py`` file but ``__init__.py``), then of
    ``tool_files``, in sorted order so "first wins" is deterministic.

    Paths are absolute and symlink-free (as upstream's resolved file paths), so a
    worker can import them whatever its CWD is.  With a ``cache``, a folder whose
    directories did not change (mtimes) is not scanned again."""
    for folder in folders:
        if not folder:
            continue
        base = os.path.realpath(folder)
        if cache is not None:
            yield from cache.folder(base)
        else:
            yield from _scan_folder(base)
    for f in tool_files:
        path = os.path.realpath(f)
        if path.endswith(".py") and os.path.isfile(path):
            yield Library(Path(path).stem, path, (Path(path),), root=Path(os.path.dirname(path)))
        else:
            log.warning("tool file %s skipped: %s", path,
                        "not a .py file" if os.path.isfile(path) else "it does not exist")


def _scan_folder(base: str, dirs: Optional[list[str]] = None) -> Iterable[Library]:
    """The libraries of one folder; ``dirs`` collects the directories looked into."""
    if dirs is not None:
        dirs.append(base)
    if not os.path.isdir(base):
        log.warning("tools folder %s skipped: %s", base,
                    "not a folder" if os.path.exists(base) else "it does not exist")
        return
    for entry in _entries(base):
        if entry.is_dir():
            if dirs is not None:
                dirs.append(entry.path)
            path = _real(entry)
            primary = os.path.join(entry.path, entry.name + ".py")
            py = [e for e in _entries(entry.path)
                  if e.name.endswith(".py") and e.name != "__init__.py" and e.is_file()]
            files = ([_real(e) for e in py if e.path == primary]
                     + [_real(e) for e in py if e.path != primary])
            if files:
                yield Library(entry.name, path, tuple(Path(f) for f in files), root=Path(path))
        elif entry.name.endswith(".py") and entry.name != "__init__.py" and entry.is_file():
            path = _real(entry)
            yield Library(entry.name[:-3], path, (Path(path),), root=Path(os.path.dirname(path)))


def _mtimes(dirs: list[str]) -> tuple[Optional[int], ...]:
    out: list[Optional[int]] = []
    for d in dirs:
        try:
            out.append(os.stat(d).st_mtime_ns)
        except OSError:
            out.append(None)
    return tuple(out)


def _copy_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A copy the caller may change without touching the parse cache (deepcopy is slow)."""
    schema = spec["input_schema"]
    out = dict(spec)
    out["input_schema"] = {"type": schema["type"], "required": list(schema["required"]),
                           "properties": {k: dict(v) for k, v in schema["properties"].items()}}
    return out


@dataclass
class Route:
    """Where a tool lives: its library, which file of it, and the defaults to fill in."""
    library: Library
    index: int
    defaults: dict[str, Any]


@dataclass
class Discovered:
    specs: list[dict[str, Any]] = field(default_factory=list)
    # Tool name -> Route.
    routes: dict[str, Route] = field(default_factory=dict)
    # Key -> Library with tools.
    libraries: dict[str, Library] = field(default_factory=dict)
    # stem -> (lib, fn, file)
    prompt_providers: dict[str, tuple[Library, str, int]] = field(default_factory=dict)


def file_permitted(parsed: ParsedFile, stem: str, host_tool_configs: dict[str, Any],
                   load_flags: dict[str, Any]) -> bool:
    """TOOL_LIBRARY_LOAD_FLAG gate: a library declaring a flag loads only when it is on."""
    if not parsed.load_flag:
        return True
    cfg = host_tool_configs.get(stem) or {}
    raw = cfg.get(parsed.load_flag, load_flags.get(parsed.load_flag, False))
    if isinstance(raw, str):
        return raw.strip().lower() in ("true", "1", "yes", "on")
    return bool(raw)


def add_library(out: Discovered, lib: Library, parsed_files: list[tuple[int, ParsedFile]],
                admit: Callable[[int, ParsedFile], bool]) -> int:
    """Register the tools of one library into ``out``; returns how many were added.

    ``parsed_files`` pairs each file's index in ``lib.files`` with its parse."""
    tool_names = {t.spec["name"] for _, p in parsed_files for t in p.tools}

    def file_of(fn: str) -> int:
        return next((i for i, p in parsed_files if fn in p.function_names), 0)

    added = 0
    for index, parsed in parsed_files:
        if not admit(index, parsed):
            continue
        path = str(lib.files[index]) if lib.files else None
        for tool in parsed.tools:
            name = tool.spec["name"]
            base = name[5:]
            if name.endswith("_prompt") and tool.llm_param_count == 0:
                target = base[: -len("_prompt")]
                if f"tool_{target}" in tool_names:
                    # Describes tool_<target>.
                    continue
                if target == lib.name:
                    out.prompt_providers[lib.name] = (lib, name, index)
                    # The library's dynamic context.
                    continue
            if name in out.routes:
                first = out.routes[name].library
                log.warning("tool %s in %s ignored: already provided by %s", name, path or lib.key,
                            first.files[out.routes[name].index] if first.files else first.key)
                continue
            spec = _copy_spec(tool.spec)
            spec["_python_file_path"] = path
            spec["_library"] = lib.name
            provider = f"tool_{base}_prompt"
            if provider != name and any(provider in p.function_names for _, p in parsed_files):
                spec["_has_dynamic_prompt"] = True
                spec["_dynamic_prompt_fn_name"] = provider
                spec["_dynamic_prompt_file_index"] = file_of(provider)
            out.specs.append(spec)
            out.routes[name] = Route(lib, index, tool.literal_defaults)
            added += 1
    if added or lib.name in out.prompt_providers:
        out.libraries[lib.key] = lib
    return added


def discover(folders: Iterable[Path], tool_files: Iterable[Path] = (), *, cache: FileCache,
             host_tool_configs: Optional[dict[str, Any]] = None,
             session_flags: Optional[dict[str, Any]] = None,
             load_flags: Optional[dict[str, Any]] = None,
             dynamic: Iterable[tuple[Library, ParsedFile]] = (),
             mounted: Iterable[Library] = ()) -> Discovered:
    """All tools of the folders and files.  ``dynamic`` libraries (registered from
    code) come first, so they win over file tools of the same name; libraries
    mounted by name from other folders come last."""
    host_tool_configs = host_tool_configs or {}
    load_flags = load_flags or {}
    out = Discovered()
    for lib, parsed in dynamic:
        add_library(out, lib, [(0, parsed)], lambda i, p: True)
    seen = set()
    for lib in itertools.chain(iter_libraries(folders, tool_files, cache), mounted):
        if lib.key in seen:
            continue
        seen.add(lib.key)
        files = [(i, pf) for i, p in enumerate(lib.files) if (pf := cache.parse(p)) is not None]

        def admit(index: int, pf: ParsedFile, lib: Library = lib) -> bool:
            stem = Path(lib.files[index]).stem
            return (office_library_admitted(stem, session_flags)
                    and file_permitted(pf, stem, host_tool_configs, load_flags))
        add_library(out, lib, files, admit)
    return out


def dynamic_library(prefix: str, code: str) -> tuple[Library, ParsedFile]:
    """A library made of in-memory code (``register_tool_from_code``); parsed, never run here."""
    # A syntax error is reported to the caller.
    parsed = parse_code(code)
    return Library(prefix, f"dynamic:{prefix}", (), source=code), parsed


def normalize_library_name(raw: str) -> str:
    """A library name as written by a person or an LLM, as a stem: lower case,
    spaces and dashes as ``_``, without a ``tool_`` prefix."""
    name = re.sub(r"[\s\-]+", "_", (raw or "").strip().lower())
    return name[5:] if name.startswith("tool_") else name
