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

Pure: files are read, nothing is run.  Requirements are kept as written, one per
entry, whitespace collapsed, sorted and unique: two libraries declaring the same set
in another order share one environment.  Options in a requirements file (``-r``,
``-e``, ``--index-url``...) are refused: an index is the host's choice (uv's own
settings), and an editable or local source would be built, which never happens.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

_BLOCK = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$")
_CACHE: dict[str, tuple[int, int, Optional["Declared"]]] = {}


class Declared(NamedTuple):
    requirements: tuple[str, ...]     # normalised: sorted, unique
    where: str                        # the file that declared them


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
    if Path(primary).parent != Path(folder) or Path(folder).name != Path(primary).stem:
        return None                      # a loose file: only its own block counts
    for name, reader in (("requirements.txt", _requirements_txt), ("pyproject.toml", _pyproject)):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            found = _cached(path, reader)
            if found is not None:
                return found
    return None


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
    else:                                # Python 3.10
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
    """Requirements as one spelling: whitespace collapsed, sorted, unique."""
    out = set()
    for req in requirements:
        text = " ".join(req.split())
        if not text:
            continue
        spec = text.split(";", 1)[0]
        if ("://" in text or "@" in spec or text.startswith((".", "/", "\\"))
                or any(token.startswith("-") for token in text.split())):
            raise DeclarationError(f"{where}: {text!r} is not a requirement from an index "
                                   f"(URLs, direct references, paths and options are refused: "
                                   f"the index is the host's, nothing is built from source)")
        out.add(text)
    return tuple(sorted(out))


def env_key(requirements: Sequence[str], interpreter: dict[str, str]) -> str:
    """The environment's name in the store: a hash of what decides its content."""
    blob = json.dumps({"requirements": list(requirements), "interpreter": interpreter},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]
