"""JSON that refuses a key given twice in one object.

``json.loads`` keeps the last of two equal keys, silently: in a configuration,
``{"sandbox": {"network": false, "network": true}}`` reads as network on, and a reader that
keeps the first (or a reviewer who reads the first) sees it off.  Every configuration the
engine reads, and the JSON-RPC bodies the MCP front checks, go through ``loads``:

    loads(text) ─► the value, as json.loads would give it
               ─► DuplicateKey(key, path): the key and where, e.g. lib.sandbox.network
               ─► json.JSONDecodeError for text that is no JSON

The objects are read by the C scanner with an ``object_pairs_hook``: an object with a key
twice is marked, and only then is the value walked to say where the first marked one is.
"""
from __future__ import annotations

import json
import re
from typing import IO, Any, Union

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


class DuplicateKey(ValueError):
    """A JSON object with ``key`` twice, at ``path`` (the key's own place: ``a.b[0].key``)."""

    def __init__(self, key: str, path: str) -> None:
        self.key, self.path = key, path
        super().__init__(f"the key {key!r} is given twice at {path}: JSON readers keep one of "
                         f"the two silently (Python's the last); give each key once")


class _Twice(dict[str, Any]):
    """An object that had a key twice (``twice``), the last value kept."""
    twice: str


def _hook(found: list[_Twice]) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) == len(items):
            return out
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                break
            seen.add(key)
        marked = _Twice(out)
        marked.twice = key
        found.append(marked)
        return marked
    return pairs


def loads(text: Union[str, bytes]) -> Any:
    """``text`` as JSON, as ``json.loads`` reads it; DuplicateKey for an object that gives
    a key twice (at any depth)."""
    found: list[_Twice] = []
    value = json.loads(text, object_pairs_hook=_hook(found))
    if found:
        raise _located(value)
    return value


def load(f: IO[str]) -> Any:
    """The JSON of the open file ``f`` (loads())."""
    return loads(f.read())


def _step(path: str, key: Union[str, int]) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if not _PLAIN.fullmatch(key):
        return f"{path}[{json.dumps(key)}]"
    return f"{path}.{key}" if path else key


def _located(value: Any) -> DuplicateKey:
    """The first object (in document order) that gave a key twice, as a DuplicateKey.  An
    object dropped for a duplicate key sits under a marked one, which comes first."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, _Twice):
            return DuplicateKey(node.twice, _step(path, node.twice))
        if isinstance(node, dict):
            stack.extend((_step(path, k), v) for k, v in reversed(list(node.items())))
        elif isinstance(node, list):
            stack.extend((_step(path, i), v) for i, v in reversed(list(enumerate(node))))
    raise AssertionError("a duplicate key was seen and is nowhere")  # pragma: no cover
