"""Near misses: a name one slip away from a name the engine knows.

    near_miss("Confine", names)      -> "confine"     case
    near_miss("confine_", names)     -> "confine"     separators (_ - . spaces) anywhere
    near_miss("confined", names)     -> "confine"     one letter more (or less, or changed)
    near_miss("netwrok", names)      -> "network"     two neighbours swapped
    near_miss("enable_x", names)     -> None          far from every name

Names are compared folded (case-folded, letters and digits only); then one edit (a letter
added, dropped, changed, or two neighbours swapped) is still a slip, unless the known name
has fewer than five letters and digits: a short name is one edit from too many words.
Pure functions, nothing else.
"""
from __future__ import annotations

import difflib
from typing import Any, Iterable, Optional

#: Known names shorter than this (folded) count as missed only when they fold alike.
MIN_EDITABLE = 5


def folded(name: str) -> str:
    """``name`` case-folded, with its letters and digits only."""
    return "".join(c for c in name.casefold() if c.isalnum())


def one_edit(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with one letter added, dropped, changed, or two neighbours
    swapped (``a != b``)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
    if len(a) < len(b):
        return a[i:] == b[i + 1:]
    swapped = i + 1 < len(a) and a[i] == b[i + 1] and a[i + 1] == b[i]
    return a[i + 1:] == b[i + 1:] or (swapped and a[i + 2:] == b[i + 2:])


def near_miss(name: Any, known: Iterable[str]) -> Optional[str]:
    """The known name ``name`` is a slip of (None when it is one of them exactly, or
    none is near)."""
    if not isinstance(name, str):
        return None
    names = list(known)
    if name in names:
        return None
    mine = folded(name)
    for candidate in names:
        theirs = folded(candidate)
        if mine == theirs or (len(theirs) >= MIN_EDITABLE and one_edit(mine, theirs)):
            return candidate
    return None


def closest(name: Any, known: Iterable[str]) -> Optional[str]:
    """The known name to suggest for ``name`` in a message: its near miss, else the most
    alike by ``difflib`` (folded), else None."""
    names = list(known)
    near = near_miss(name, names)
    if near is not None or not isinstance(name, str):
        return near
    by_fold = {folded(n): n for n in names}
    close = difflib.get_close_matches(folded(name), list(by_fold), 1, 0.75)
    return by_fold[close[0]] if close else None
