"""Tool discovery: folder rules, AST schemas and the regex fallback.

Pure code: nothing here imports or runs a tool file.  The host builds every
tool spec from source text, so constructing a binding has no side effects.

    folders / tool_files ──► iter_libraries() ──► Library(name, key, files)
                                                      │ each file
                                                      ▼
                                   FileCache.parse(path) ── (path, mtime, size) hit? reuse
                                                      │ miss
                                     ast.parse ─ok─► schema_from_function() per tool_*
                                         └─fail─► regex_tools()  (never raises)
                                                      ▼
                                   discover() ──► [spec, ...] + {tool name: Library}

A *library* is what one worker process loads: every file of one ``X/``
folder, or one loose ``.py`` file, or the code given to
``register_tool_from_code``.
"""
from __future__ import annotations

import ast
import itertools
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from .protocol import HOST_PARAMS

log = logging.getLogger("lcp_sandbox.discovery")

#: Parameters the host injects into a tool that declares them.
#: Never shown to the LLM.
HIDDEN_PARAMS = HOST_PARAMS | {"args", "kwargs"}
#: Names in a docstring that are section headers, not parameters.
_DOC_SECTION_WORDS = frozenset({"args", "parameters", "returns", "example"})

# `name (type): desc`, `name: desc`, `name - desc`, optionally bulleted.
_DOC_PARAM_RE = re.compile(r"^(?:[-*\d.]+\s*)?([A-Za-z0-9_]+)\s*(?:\(([^)]+)\))?\s*[:\-]\s*(.+)")
_REGEX_DEF_RE = re.compile(r"^[ \t]*def\s+(tool_\w+)\s*\(([^)]*)\)\s*(?:->\s*[^:]+)?:", re.MULTILINE)
_REGEX_DOC_RE = re.compile(r'"""(.*?)"""', re.DOTALL)
_LOAD_FLAG_RE = re.compile(r"^TOOL_LIBRARY_LOAD_FLAG\s*=\s*[\"']([A-Za-z0-9_]+)[\"']", re.MULTILINE)
_DISPLAY_NAME_RE = re.compile(r"^TOOL_LIBRARY_NAME\s*=\s*[\"']([^\"']+)[\"']", re.MULTILINE)
_ALIASES_RE = re.compile(r"^TOOL_LIBRARY_ALIASES\s*=\s*[\[(](.*?)[\])]", re.MULTILINE | re.DOTALL)

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


def office_library_admitted(stem: str, session_flags: Optional[dict]) -> bool:
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


def json_type(annotation: str) -> str:
    """Map an annotation's text to a JSON schema type (lower-cased substring rule)."""
    a = annotation.lower()
    if "int" in a:
        return "integer"
    if "float" in a or "number" in a:
        return "number"
    if "bool" in a:
        return "boolean"
    if "list" in a or "array" in a:
        return "array"
    if "dict" in a or "object" in a:
        return "object"
    return "string"


def _doc_type(type_text: str) -> str:
    # Docstring-declared parameters only know these three (as upstream).
    t = type_text.lower()
    if "int" in t:
        return "integer"
    if "float" in t:
        return "number"
    if "bool" in t:
        return "boolean"
    return "string"


def _doc_params(docstring: str) -> dict[str, tuple[Optional[str], str]]:
    """name -> (type text, description) for every parameter-looking line; last one wins."""
    found: dict[str, tuple[Optional[str], str]] = {}
    for line in docstring.splitlines():
        m = _DOC_PARAM_RE.match(line.strip())
        if m:
            found[m.group(1).strip()] = (m.group(2), m.group(3).strip())
    return found


@dataclass
class ToolDef:
    """What the host knows about one tool without running it."""
    spec: dict                       # the LCP spec (public keys + private `_` keys)
    literal_defaults: dict           # defaults that are real literals: filled in on call
    llm_param_count: int             # parameters the LLM can see (prompt-provider rule)


def schema_from_function(node: ast.FunctionDef) -> ToolDef:
    """Build the LCP spec of one ``def tool_*`` node: description from the docstring's
    first paragraph, a JSON-schema property per parameter the LLM may pass."""
    docstring = ast.get_docstring(node) or ""
    description = docstring.strip().split("\n\n")[0].strip() if docstring else "No description provided."
    doc = _doc_params(docstring) if docstring else {}

    properties: dict[str, dict] = {}
    required: list[str] = []
    literal_defaults: dict[str, Any] = {}

    a = node.args
    # Defaults cover the last positional parameters, positional-only ones included;
    # those cannot be passed by keyword, so they are not in the schema. Keyword-only
    # parameters follow (upstream drops them; we show them, see README "Differences").
    positional = a.posonlyargs + a.args
    pos_defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = list(zip(positional, pos_defaults))[len(a.posonlyargs):] + list(zip(a.kwonlyargs, a.kw_defaults))
    for arg, default in params:
        name = arg.arg
        if name in HIDDEN_PARAMS:
            continue
        kind = json_type(ast.unparse(arg.annotation).strip()) if arg.annotation else "string"
        prop: dict[str, Any] = {"type": kind, "description": doc.get(name, (None, f"Parameter '{name}'"))[1]}
        if default is not None:
            try:
                value = ast.literal_eval(default)
                literal_defaults[name] = value
            except Exception:
                value = ast.unparse(default).strip("'\"")
            prop["default"] = value
        else:
            required.append(name)
        properties[name] = prop
    llm_param_count = len(properties)

    if not properties and docstring:
        # A function with no visible parameters (e.g. only **kwargs) may declare
        # them in its docstring.
        for name, (type_text, desc) in doc.items():
            if name.lower() in _DOC_SECTION_WORDS or name in HIDDEN_PARAMS:
                continue
            type_text = (type_text or "string").lower().strip()
            properties[name] = {"type": _doc_type(type_text), "description": desc}
            if "optional" not in type_text and "default" not in type_text:
                required.append(name)

    spec = {
        "name": node.name,
        "description": description,
        "input_schema": {"type": "object", "properties": properties, "required": required},
    }
    return ToolDef(spec, literal_defaults, llm_param_count)


def regex_tools(text: str) -> list[ToolDef]:
    """Lossy extraction for files ``ast`` cannot parse.  Never raises."""
    tools: list[ToolDef] = []
    try:
        for m in _REGEX_DEF_RE.finditer(text):
            name, params_text = m.group(1), m.group(2)
            doc_m = _REGEX_DOC_RE.search(text[m.end():m.end() + 4000])
            docstring = doc_m.group(1).strip() if doc_m else ""
            description = docstring.split("\n\n")[0].strip() if docstring else f"Executes {name}."
            properties: dict[str, dict] = {}
            required: list[str] = []
            for raw in params_text.split(","):
                param = raw.strip()
                if not param or param.startswith("*") or param == "/":
                    continue
                if ":" in param:
                    pname, rest = (x.strip() for x in param.split(":", 1))
                    entry = {"type": json_type(rest), "description": f"Parameter '{pname}'"}
                    default_m = re.search(r"=\s*(.+)$", param)
                    if default_m:
                        entry["default"] = default_m.group(1).strip().strip("'\"")
                else:
                    pname = param.split("=")[0].strip()
                    entry = {"type": "string", "description": f"Parameter '{pname}'"}
                if not pname or pname in HIDDEN_PARAMS:
                    continue
                if "=" not in param:
                    required.append(pname)
                properties[pname] = entry
            spec = {
                "name": name,
                "description": description,
                "input_schema": {"type": "object", "properties": properties, "required": required},
                "_parsed_via_regex_fallback": True,
            }
            tools.append(ToolDef(spec, {}, len(properties)))
    except Exception as exc:  # the fallback must never raise
        log.warning("regex fallback stopped early: %s", exc)
    return tools


@dataclass
class ParsedFile:
    """Everything discovery needs from one file, cached by (mtime, size)."""
    tools: list[ToolDef]
    function_names: frozenset        # every def name in the file (prompt providers)
    load_flag: Optional[str]
    display_name: str
    aliases: list[str]
    via_regex: bool = False


def parse_source(text: str, path: Any = None) -> ParsedFile:
    """Tools and metadata of one file's source; ``path`` only names it in warnings."""
    load_flag = _LOAD_FLAG_RE.search(text)
    display = _DISPLAY_NAME_RE.search(text)
    aliases_m = _ALIASES_RE.search(text)
    aliases = re.findall(r"[\"']([^\"']+)[\"']", aliases_m.group(1)) if aliases_m else []
    meta = dict(load_flag=load_flag.group(1) if load_flag else None,
                display_name=display.group(1) if display else "", aliases=aliases)
    try:
        tree = ast.parse(text)
        tools, names = [], set()
        _walk_defs(tree, tools, names)
        return ParsedFile(tools, frozenset(names), **meta)
    except Exception as exc:
        where = path or "tool source"
        if isinstance(exc, SyntaxError) and exc.lineno:
            log.warning("%s, line %d: %s; its tools are read with the regex fallback",
                        where, exc.lineno, exc.msg)
        else:
            log.warning("%s: cannot be parsed (%s); its tools are read with the regex fallback", where, exc)
        tools = regex_tools(text)
        names = frozenset(t.spec["name"] for t in tools)
        return ParsedFile(tools, names, via_regex=True, **meta)


def _walk_defs(node: ast.AST, tools: list, names: set) -> None:
    # Source order, nested functions included (depth first).
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(child.name)
        if isinstance(child, ast.FunctionDef) and child.name.startswith("tool_"):
            tools.append(schema_from_function(child))
        _walk_defs(child, tools, names)


class FileCache:
    """Parsed files keyed by path; an entry is reused while (mtime_ns, size) match.
    Also the libraries of a folder, reused while the folder and its sub-folders
    keep their mtimes (adding, removing or renaming a file changes them)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, int, ParsedFile]] = {}
        self._folders: dict[str, tuple[list, tuple, list]] = {}

    def folder(self, base: str) -> list:
        hit = self._folders.get(base)
        if hit is not None and _mtimes(hit[0]) == hit[1]:
            return hit[2]
        dirs: list = []
        libs = list(_scan_folder(base, dirs))
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
        self._entries[key] = (st.st_mtime_ns, st.st_size, parsed)
        return parsed


@dataclass(frozen=True)
class Library:
    """The unit a worker loads.  ``key`` is unique across folders; ``name`` is the stem."""
    name: str
    key: str
    files: tuple = ()                # Paths, in load order
    source: Optional[str] = None     # code of a dynamic library
    root: Optional[Path] = None      # the library's folder (read access, display)

    @property
    def dynamic(self) -> bool:
        return self.source is not None


def _entries(folder: str) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def _real(entry: os.DirEntry) -> str:
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


def _scan_folder(base: str, dirs: Optional[list] = None) -> Iterable[Library]:
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
            files = [_real(e) for e in py if e.path == primary] + [_real(e) for e in py if e.path != primary]
            if files:
                yield Library(entry.name, path, tuple(Path(f) for f in files), root=Path(path))
        elif entry.name.endswith(".py") and entry.name != "__init__.py" and entry.is_file():
            path = _real(entry)
            yield Library(entry.name[:-3], path, (Path(path),), root=Path(os.path.dirname(path)))


def _mtimes(dirs: list) -> tuple:
    out = []
    for d in dirs:
        try:
            out.append(os.stat(d).st_mtime_ns)
        except OSError:
            out.append(None)
    return tuple(out)


def _copy_spec(spec: dict) -> dict:
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
    defaults: dict


@dataclass
class Discovered:
    specs: list[dict] = field(default_factory=list)
    routes: dict[str, Route] = field(default_factory=dict)                 # tool name -> Route
    libraries: dict[str, Library] = field(default_factory=dict)           # key -> Library with tools
    prompt_providers: dict[str, tuple[Library, str, int]] = field(default_factory=dict)  # stem -> (lib, fn, file)


def file_permitted(parsed: ParsedFile, stem: str, host_tool_configs: dict,
                   load_flags: dict) -> bool:
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
                    continue                       # describes tool_<target>
                if target == lib.name:
                    out.prompt_providers[lib.name] = (lib, name, index)
                    continue                       # the library's dynamic context
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
             host_tool_configs: Optional[dict] = None, session_flags: Optional[dict] = None,
             load_flags: Optional[dict] = None,
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
        parsed = [(i, pf) for i, p in enumerate(lib.files) if (pf := cache.parse(p)) is not None]

        def admit(index: int, pf: ParsedFile, lib: Library = lib) -> bool:
            stem = Path(lib.files[index]).stem
            return (office_library_admitted(stem, session_flags)
                    and file_permitted(pf, stem, host_tool_configs, load_flags))
        add_library(out, lib, parsed, admit)
    return out


def dynamic_library(prefix: str, code: str) -> tuple[Library, ParsedFile]:
    """A library made of in-memory code (``register_tool_from_code``); parsed, never run here."""
    tree = ast.parse(code)            # a syntax error is reported to the caller
    tools, names = [], set()
    _walk_defs(tree, tools, names)
    lib = Library(prefix, f"dynamic:{prefix}", (), source=code)
    return lib, ParsedFile(tools, frozenset(names), None, "", [])


def normalize_library_name(raw: str) -> str:
    """A library name as written by a person or an LLM, as a stem: lower case,
    spaces and dashes as ``_``, without a ``tool_`` prefix."""
    name = re.sub(r"[\s\-]+", "_", (raw or "").strip().lower())
    return name[5:] if name.startswith("tool_") else name
