"""What a library declares it needs: its requirements, read from where it lives.

    declared(files, root) ─► Declared(requirements, where) | None (the host's environment)
        1. a PEP 723 block in the primary module (``name.py``, or ``X/X.py`` of a folder)
               # /// script
               # dependencies = ["requests>=2", ...]
               # ///
        2. a folder library: ``requirements.txt`` beside it (requirement lines only)
        3. a folder library: ``pyproject.toml``'s ``[project] dependencies``
    declared_in(path) ─► what that one file declares (``envs prune`` checks a user still does)
    env_key(requirements, interpreter) ─► the name of the environment in the store

Pure: files are read, nothing is run.  A requirement is a PEP 508 name with optional
extras, version specifiers and a marker, as ``packaging.requirements`` parses it, and
nothing else (requirement() says why anything else is refused):

    "Alpha_X [Fast] >=1.0,<2 ; python_version>='3.8'"
        ─►  'alpha-x[fast]<2,>=1.0; python_version >= "3.8"'
    "alpha-1.0-py3-none-any.whl", "A/../x.whl", "file:/x.whl", "x @ https://...",
    "-e .", "--index-url ..."
        ─►  DeclarationError naming it and why

Each is kept in one spelling, rebuilt from what was parsed: the canonical name, sorted
extras and specifiers, the marker as packaging writes it.  That spelling is what uv
reads (backends/envs/build.py), so no path, URL or option of the declaring text can
reach it; and two libraries declaring one set in other spellings share one environment.
An index is the host's choice (uv's own settings); a local or editable source would be
built, which never happens.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple, NoReturn, Optional, Sequence

_BLOCK = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$")
_CACHE: dict[str, tuple[int, int, Optional["Declared"]]] = {}


class Declared(NamedTuple):
    # Normalised: sorted, unique.
    requirements: tuple[str, ...]
    # The file that declared them.
    where: str


class DeclarationError(ValueError):
    """A declaration that cannot be read; the message names the file."""


def declared(files: Sequence[str], root: Optional[str]) -> Optional[Declared]:
    """The requirements of the library whose files are ``files`` (its primary first) in
    the folder ``root``; None when it declares none."""
    if not files:
        return None
    primary = str(files[0])
    found = _cached(primary, _pep723)
    if found is not None or not root:
        return found
    folder = str(root)
    if not _folder_library(primary, folder):
        # A loose file: only its own block counts.
        return None
    for name, reader in (("requirements.txt", _requirements_txt), ("pyproject.toml", _pyproject)):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            found = _cached(path, reader)
            if found is not None:
                return found
    return None


@functools.lru_cache(maxsize=4096)
def _folder_library(primary: str, folder: str) -> bool:
    """Whether ``primary`` is the module named after ``folder`` inside it: a folder
    library's primary module (a question of the two strings alone: kept, as a new worker's
    INIT asks it on every start)."""
    return Path(primary).parent == Path(folder) and Path(folder).name == Path(primary).stem


def declared_in(path: str) -> Optional[Declared]:
    """What the file ``path`` (a module, requirements.txt or pyproject.toml) declares."""
    name = os.path.basename(path)
    reader = {"requirements.txt": _requirements_txt, "pyproject.toml": _pyproject}.get(name)
    found = _cached(path, reader or _pep723)
    return found if found is not None and found.requirements else None


def _cached(path: str, reader: Any) -> Optional[Declared]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    hit = _CACHE.get(path)
    if hit is not None and hit[0] == st.st_mtime_ns and hit[1] == st.st_size:
        return hit[2]
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DeclarationError(f"{path} cannot be read: {exc}") from None
    reqs = reader(text, path)
    found = None if reqs is None else Declared(normalise(reqs, path), path)
    if len(_CACHE) > 10_000:
        _CACHE.clear()
    _CACHE[path] = (st.st_mtime_ns, st.st_size, found)
    return found


def _pep723(text: str, path: str) -> Optional[list[str]]:
    blocks = [m for m in _BLOCK.finditer(text) if m.group("type") == "script"]
    if not blocks:
        return None
    if len(blocks) > 1:
        raise DeclarationError(f"{path} has {len(blocks)} '# /// script' blocks (one is allowed)")
    body = "".join(line[2:] if line.startswith("# ") else line[1:]
                   for line in blocks[0].group("content").splitlines(keepends=True))
    data = _toml(body, path)
    deps = data.get("dependencies", [])
    return _strings(deps, path, "dependencies")


def _requirements_txt(text: str, path: str) -> list[str]:
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-") or "://" in line or line.startswith((".", "/")):
            raise DeclarationError(
                f"{path}, line {number}: {line!r} is not a requirement (only requirement lines "
                f"are read: indexes are the host's uv settings, and nothing is built from "
                f"source)")
        out.append(line)
    return out


def _pyproject(text: str, path: str) -> Optional[list[str]]:
    project = _toml(text, path).get("project")
    if not isinstance(project, dict) or "dependencies" not in project:
        return None
    return _strings(project["dependencies"], path, "[project] dependencies")


def _toml(text: str, path: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib as toml
    # Python 3.10.
    else:
        try:
            import tomli as toml  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise DeclarationError(f"{path}: reading TOML needs Python 3.11+ or the tomli "
                                   f"package") from None
    try:
        return dict(toml.loads(text))
    except Exception as exc:
        raise DeclarationError(f"{path} is not valid TOML: {exc}") from None


def _strings(value: Any, path: str, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DeclarationError(f"{path}: {what} must be a list of requirement strings")
    return list(value)


def normalise(requirements: Sequence[str], where: str = "") -> tuple[str, ...]:
    """Requirements in their one spelling (requirement()), sorted and unique; a blank
    entry is skipped.  DeclarationError naming the first that is not a requirement."""
    out = set()
    for req in requirements:
        if req.strip():
            out.add(requirement(req, where))
    return tuple(sorted(out))


#: File names uv and pip take for a local archive rather than a project's name.
_ARCHIVES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz",
             ".tlz", ".tar.lz", ".tar.lzma", ".tar", ".egg")
#: What the rebuilt spelling may hold: a marker's strings and an arbitrary (===) version
#: are free text, and uv reads its requirements as a requirements file, which expands
#: ${VARIABLES} and has comments and line continuations.
_SPELLING = re.compile(r"[A-Za-z0-9 ._\-\[\],;<>=!~*+()'\"]*")
#: (two letters at least: "C:" begins a path)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")
_WHAT = ("a requirement is a project's name on the host's index, with optional [extras], "
         "version specifiers and a '; marker' (PEP 508): paths, file names, URLs, "
         "'name @' references and options are refused, the index is the host's and "
         "nothing is built from source")


def requirement(text: str, where: str = "") -> str:
    """The one spelling of the requirement ``text`` (see the module's docstring), or
    DeclarationError naming it and why it is none."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    line = " ".join(text.split())
    try:
        req = Requirement(line)
    except InvalidRequirement as exc:
        _refuse(where, line, _kind(line) or f"not PEP 508: {str(exc).splitlines()[0]}")
    if req.url:
        _refuse(where, line, "a direct reference (name @ URL)")
    if req.name.lower().endswith(_ARCHIVES):
        _refuse(where, line, "a file's name, not a project's")
    extras = ",".join(sorted({canonicalize_name(e) for e in req.extras}))
    spelled = (canonicalize_name(req.name) + (f"[{extras}]" if extras else "")
               + str(req.specifier) + (f"; {req.marker}" if req.marker else ""))
    odd = _SPELLING.sub("", spelled)
    if odd:
        _refuse(where, line, f"its marker or version holds {odd[0]!r} (only letters, digits, "
                             f"spaces and . _ - [ ] , ; < > = ! ~ * + ( ) ' \" are passed on)")
    return spelled


def _kind(line: str) -> str:
    """What a text that is no requirement looks like, for the message ("" if nothing)."""
    head = line.split(";", 1)[0]
    if any(word.startswith("-") for word in line.split()):
        return "an option"
    if "://" in line or _SCHEME.match(head):
        return "a URL"
    if "/" in head or "\\" in head or line.startswith((".", "~")):
        return "a path"
    return ""


def _refuse(where: str, line: str, why: str) -> NoReturn:
    raise DeclarationError(f"{where}: {line!r} is not a requirement from an index ({why}): "
                           f"{_WHAT}")


def env_key(requirements: Sequence[str], interpreter: dict[str, str]) -> str:
    """The environment's name in the store: a hash of what decides its content."""
    blob = json.dumps({"requirements": list(requirements), "interpreter": interpreter},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]
