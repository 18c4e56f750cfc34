"""
workspace_tools.py — list, read, write and find files in the agent's workspace.

The workspace is the current working directory at call time (the host changes
into it before every call).  Every path a tool receives is resolved against
``Path.cwd()`` and must stay inside it: ``..`` escapes, absolute paths outside
the workspace and symlinks whose target lies outside are refused with
``{"success": False, "error": ...}`` naming the offending path.  Listings and
searches never descend into symlinked directories.

Arguments are coerced the way LLMs tend to send them: ``max_results="20"``,
``recursive="true"``, ``append="no"``...  Invalid numbers fall back to the
default; every limit is clamped to a hard cap.

Optional host configuration (``host_tool_configs["workspace_tools"]``):

    max_read_bytes   (int)  hard cap of one read            (default 1 MiB)
    max_write_bytes  (int)  hard cap of one write           (default 5 MiB)
    max_results      (int)  hard cap of listing/find results (default 1000)
"""
from __future__ import annotations

import codecs
import fnmatch
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

TOOL_LIBRARY_NAME = "Workspace Tools"
TOOL_LIBRARY_DESC = "Lists, reads, writes and finds files inside the agent's workspace (paths cannot leave it)."
TOOL_LIBRARY_ICON = "📁"

# Hard caps (host-configurable through init_tools_library).
_LIMITS = {
    "max_read_bytes": 1024 * 1024,
    "max_write_bytes": 5 * 1024 * 1024,
    "max_results": 1000,
}
_DEFAULT_READ_BYTES = 64 * 1024
_MAX_SCANNED_ENTRIES = 50_000          # a listing/search stops walking after this many entries
_MAX_CONTAINS_FILE_BYTES = 2 * 1024 * 1024  # files larger than this are not searched for text

_IGNORED_DIRS = frozenset({
    ".git", ".svn", ".hg", "__pycache__", "node_modules", ".venv", "venv",
    ".idea", ".vscode", ".pytest_cache", ".mypy_cache", ".ruff_cache",
})

_TRUE = frozenset({"true", "1", "yes", "y", "on", "t"})
_FALSE = frozenset({"false", "0", "no", "n", "off", "f", "", "none", "null"})


def init_tools_library(config: Optional[dict] = None) -> None:
    """Applies optional host limits (see the module docstring)."""
    if not isinstance(config, dict):
        return
    for key in _LIMITS:
        if key in config:
            value = _to_int(config.get(key), _LIMITS[key], minimum=1)
            _LIMITS[key] = value


# ---------------------------------------------------------------- helpers
def _to_int(value: Any, default: int, minimum: Optional[int] = None,
            maximum: Optional[int] = None) -> int:
    """LLM-friendly int coercion: 20, "20", "20.0", 20.0 -> 20; garbage -> default."""
    if isinstance(value, bool):
        result = int(value)
    elif isinstance(value, int):
        result = value
    elif isinstance(value, float):
        result = int(value) if value == value and abs(value) != float("inf") else default
    elif isinstance(value, str):
        text = value.strip()
        try:
            result = int(text)
        except ValueError:
            try:
                f = float(text)
                result = int(f) if f == f and abs(f) != float("inf") else default
            except ValueError:
                result = default
    else:
        result = default
    if minimum is not None and result < minimum:
        result = minimum
    if maximum is not None and result > maximum:
        result = maximum
    return result


def _to_bool(value: Any, default: bool) -> bool:
    """LLM-friendly bool coercion: True, "true", "Yes", 1, "1" -> True; unknown -> default."""
    if isinstance(value, bool):
        return value
    if value is None:
        return default
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    return default


def _root() -> Path:
    return Path.cwd().resolve()


def _resolve_safe_path(name: Any, root: Optional[Path] = None) -> Path:
    """Resolve ``name`` inside the workspace or raise PermissionError naming it.

    Relative paths are taken from the workspace root; absolute paths are
    accepted only when they point inside it.  Symlinks are resolved, so a link
    inside the workspace whose target is outside is refused too."""
    root = root or _root()
    raw = "" if name is None else str(name).strip()
    if raw in ("", ".", "./"):
        return root
    if "\x00" in raw:
        raise PermissionError(f"Invalid path {raw!r}: it contains a NUL byte.")
    raw = raw.replace("\\", "/")
    candidate = Path(raw)
    if not candidate.is_absolute():
        candidate = root / candidate
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError) as exc:      # symlink loop, ...
        raise PermissionError(f"Cannot resolve path '{raw}': {exc}") from None
    if resolved != root and root not in resolved.parents:
        why = "is a symlink pointing" if _has_symlink(candidate, root) else "resolves"
        raise PermissionError(
            f"Access denied: path '{raw}' {why} outside the workspace. "
            "Only paths inside the workspace (relative paths such as 'data/file.txt') are allowed.")
    return resolved


def _has_symlink(candidate: Path, root: Path) -> bool:
    """Whether some existing component of ``candidate`` (below the root) is a symlink."""
    try:
        rel = candidate.relative_to(root)
    except ValueError:
        return False
    p = root
    for part in rel.parts:
        if part == "..":
            return False
        p = p / part
        if p.is_symlink():
            return True
    return False


def _rel(path: Path, root: Path) -> str:
    if path == root:
        return "."
    return path.relative_to(root).as_posix()


def _fail(message: str) -> Dict[str, Any]:
    """The failure shape; ``output`` repeats the error so the LLM never sees a success text."""
    return {"success": False, "error": message, "output": f"Error: {message}"}


def _walk(base: Path, recursive: bool, include_hidden: bool) -> Iterator[Tuple[Path, os.DirEntry]]:
    """Entries under ``base`` (sorted, directories before descending); never follows symlinks."""
    stack = [base]
    scanned = 0
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            scanned += 1
            if scanned > _MAX_SCANNED_ENTRIES:
                return
            if not include_hidden and entry.name.startswith("."):
                continue
            yield Path(entry.path), entry
            if recursive and entry.is_dir(follow_symlinks=False) and entry.name not in _IGNORED_DIRS:
                subdirs.append(Path(entry.path))
        stack.extend(reversed(subdirs))


def _entry_info(path: Path, entry: os.DirEntry, root: Path) -> Dict[str, Any]:
    info: Dict[str, Any] = {"path": _rel(path, root)}
    try:
        if entry.is_symlink():
            info["type"] = "symlink"
            try:
                target = path.resolve()
                inside = target == root or root in target.parents
            except (OSError, RuntimeError):
                inside = False
            info["points_outside_workspace"] = not inside
        elif entry.is_dir(follow_symlinks=False):
            info["type"] = "directory"
        else:
            info["type"] = "file"
            info["size"] = entry.stat(follow_symlinks=False).st_size
    except OSError:
        info["type"] = "unknown"
    return info


def _looks_binary(chunk: bytes) -> bool:
    return b"\x00" in chunk


# ---------------------------------------------------------------- tools
def tool_list_files(directory: str = ".", recursive: bool = False, max_results: int = 200,
                    include_hidden: bool = False) -> Dict[str, Any]:
    """
    Lists the files and folders of a workspace directory.

    Args:
        directory (str): Workspace-relative directory to list ('.' for the workspace root).
        recursive (bool): Whether to list sub-directories recursively.
        max_results (int): Maximum number of entries to return (capped by the host).
        include_hidden (bool): Whether to include entries whose name starts with a dot.
    """
    try:
        root = _root()
        base = _resolve_safe_path(directory, root)
    except PermissionError as exc:
        return _fail(str(exc))
    if not base.exists():
        return _fail(f"Directory '{directory}' not found in the workspace.")
    if not base.is_dir():
        return _fail(f"'{directory}' is not a directory; use tool_read_file to read a file.")
    recursive = _to_bool(recursive, False)
    include_hidden = _to_bool(include_hidden, False)
    limit = _to_int(max_results, 200, minimum=1, maximum=_LIMITS["max_results"])

    entries: List[Dict[str, Any]] = []
    truncated = False
    for path, entry in _walk(base, recursive, include_hidden):
        if len(entries) >= limit:
            truncated = True
            break
        entries.append(_entry_info(path, entry, root))
    return {
        "success": True,
        "output": {
            "directory": _rel(base, root),
            "recursive": recursive,
            "entries": entries,
            "count": len(entries),
            "truncated": truncated,
        },
    }


def tool_read_file(file_name: str, max_bytes: int = 65536, offset: int = 0) -> Dict[str, Any]:
    """
    Reads a text file of the workspace (large files are read in chunks).

    Args:
        file_name (str): Workspace-relative path of the file to read.
        max_bytes (int): Maximum number of bytes to read (capped by the host).
        offset (int): Byte offset to start reading at, to continue a truncated read.
    """
    try:
        root = _root()
        path = _resolve_safe_path(file_name, root)
    except PermissionError as exc:
        return _fail(str(exc))
    if not path.exists():
        return _fail(f"File '{file_name}' not found in the workspace.")
    if not path.is_file():
        return _fail(f"'{file_name}' is not a regular file.")
    # At least 4 bytes, so that one UTF-8 character always fits in a chunk.
    limit = _to_int(max_bytes, _DEFAULT_READ_BYTES, minimum=4, maximum=max(4, _LIMITS["max_read_bytes"]))
    start = _to_int(offset, 0, minimum=0)
    rel = _rel(path, root)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(start)
            data = fh.read(limit)
    except OSError as exc:
        return _fail(f"Cannot read '{file_name}': {exc}")

    if _looks_binary(data[:8192]):
        return {
            "success": True,
            "output": f"[Binary file '{rel}' ({size:,} bytes): its content cannot be shown as text.]",
            "context_files": [rel],
        }
    end = start + len(data)
    truncated = end < size
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=not truncated)
    pending = len(decoder.getstate()[0])      # bytes of a character cut by the limit
    end -= pending
    if truncated:
        text += (f"\n\n[... truncated: showed bytes {start}-{end} of {size}. "
                 f"Call tool_read_file again with offset={end} to continue.]")
    elif start and not data:
        text = f"[Offset {start} is at or past the end of '{rel}' ({size} bytes).]"
    return {"success": True, "output": text, "context_files": [rel]}


def tool_write_file(file_name: str, content: str, append: bool = False, overwrite: bool = True) -> Dict[str, Any]:
    """
    Writes text to a file of the workspace, creating parent folders as needed.

    Args:
        file_name (str): Workspace-relative path of the file to write.
        content (str): The text to write.
        append (bool): Append to the file instead of replacing its content.
        overwrite (bool): Whether an existing file may be replaced (ignored when appending).
    """
    try:
        root = _root()
        path = _resolve_safe_path(file_name, root)
    except PermissionError as exc:
        return _fail(str(exc))
    if path == root or path.is_dir():
        return _fail(f"'{file_name}' is a directory, not a file.")
    append = _to_bool(append, False)
    overwrite = _to_bool(overwrite, True)
    if content is None:
        content = ""
    if not isinstance(content, str):
        content = str(content)
    data = content.encode("utf-8")
    if len(data) > _LIMITS["max_write_bytes"]:
        return _fail(f"Content for '{file_name}' is {len(data):,} bytes, over the "
                     f"{_LIMITS['max_write_bytes']:,}-byte write limit.")
    existed = path.exists()
    if existed and not append and not overwrite:
        return _fail(f"File '{file_name}' already exists and overwrite is false.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # The parent may have been swapped for a symlink meanwhile: check again.
        _resolve_safe_path(_rel(path, root), root)
        flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        flags |= os.O_APPEND if append else os.O_TRUNC
        fd = os.open(path, flags, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except PermissionError as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"Cannot write '{file_name}': {exc}")
    rel = _rel(path, root)
    verb = "Appended" if append else ("Overwrote" if existed else "Created")
    return {"success": True, "output": f"{verb} '{rel}' ({len(data):,} bytes written)."}


def tool_find_files(pattern: str, directory: str = ".", max_results: int = 50, contains: str = "",
                    case_sensitive: bool = False) -> Dict[str, Any]:
    """
    Finds workspace files by glob pattern, optionally only those containing a text.

    Args:
        pattern (str): Glob pattern matched against file names, e.g. '*.py' ('*' for all). A pattern with '/' is matched against the workspace-relative path, e.g. 'src/*.py' or 'src/**/*.py'.
        directory (str): Workspace-relative directory to search under ('.' for the whole workspace).
        max_results (int): Maximum number of matches to return (capped by the host).
        contains (str): Only return text files containing this string (empty: no content filter).
        case_sensitive (bool): Whether the pattern and the contains text are case sensitive.
    """
    try:
        root = _root()
        base = _resolve_safe_path(directory, root)
    except PermissionError as exc:
        return _fail(str(exc))
    if not base.is_dir():
        return _fail(f"Directory '{directory}' not found in the workspace.")
    pattern = (str(pattern) if pattern is not None else "").strip().replace("\\", "/") or "*"
    limit = _to_int(max_results, 50, minimum=1, maximum=_LIMITS["max_results"])
    case_sensitive = _to_bool(case_sensitive, False)
    needle = "" if contains is None else str(contains)
    match = fnmatch.fnmatchcase if case_sensitive else (lambda s, p: fnmatch.fnmatchcase(s.lower(), p.lower()))
    by_path = "/" in pattern
    while by_path and pattern.startswith("./"):
        pattern = pattern[2:]
    pattern_parts = [p for p in pattern.split("/") if p]

    matches: List[str] = []
    truncated = False
    for path, entry in _walk(base, True, include_hidden=pattern.startswith(".")):
        if not entry.is_file(follow_symlinks=False):
            continue
        rel = _rel(path, root)
        if by_path:
            if not _glob_parts(rel.split("/"), pattern_parts, match):
                continue
        elif not match(entry.name, pattern):
            continue
        if needle and not _file_contains(path, needle, case_sensitive):
            continue
        if len(matches) >= limit:
            truncated = True
            break
        matches.append(rel)
    return {
        "success": True,
        "output": {
            "pattern": pattern,
            "directory": _rel(base, root),
            "contains": needle or None,
            "matches": matches,
            "count": len(matches),
            "truncated": truncated,
        },
    }


def _glob_parts(parts: List[str], pats: List[str], match) -> bool:
    """Component-wise glob: '*' stays inside one folder, '**' spans any number of folders."""
    if not pats:
        return not parts
    if pats[0] == "**":
        return any(_glob_parts(parts[i:], pats[1:], match) for i in range(len(parts) + 1))
    return bool(parts) and match(parts[0], pats[0]) and _glob_parts(parts[1:], pats[1:], match)


def _file_contains(path: Path, needle: str, case_sensitive: bool) -> bool:
    try:
        if path.stat().st_size > _MAX_CONTAINS_FILE_BYTES:
            return False
        data = path.read_bytes()
    except OSError:
        return False
    if _looks_binary(data[:8192]):
        return False
    text = data.decode("utf-8", errors="replace")
    if case_sensitive:
        return needle in text
    return needle.lower() in text.lower()
