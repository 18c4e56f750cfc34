"""What a setting holds, checked exactly: a bool is no number, 1.0 is no whole number,
"1" is no number, a list of two bools is no uid.

    check_kind(name, value, kind) ─► the value (a whole number as an int, another real
                                     number as a float), or TypeError/ValueError naming
                                     the setting, what it must be and what it was

A kind is one of the words below, optionally followed by "|None" (None allowed too):

    number     a finite real number, not negative        positive   a finite number above 0
    int        a whole number (int), not negative        count      a whole number, 1 or more
    bool       True or False                             str        a non-empty string
    path       a non-empty string or os.PathLike         paths      a list of non-empty strings
    folders    a path, or a list of paths                strings    a list of non-empty strings
    env        a dict of names to string or number values
    callable   anything callable                         dict       a dict
    Name       (a capitalised word) an instance of a class of that name
"""
from __future__ import annotations

import math
import numbers
import os
from typing import Any, Callable


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _path(value: Any) -> bool:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return isinstance(value, str) and value != "" and "\0" not in value


def _strings(value: Any) -> bool:
    return (isinstance(value, (list, tuple))
            and all(isinstance(v, str) and v and "\0" not in v for v in value))


def _env(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and k and "=" not in k and "\0" not in k
        and (isinstance(v, str) and "\0" not in v or _real(v) and math.isfinite(v))
        for k, v in value.items())


#: kind -> (test, what the message says the setting must be)
_TESTS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "number": (_real, "a number"),
    "positive": (_real, "a number"),
    "int": (_whole, "a whole number"),
    "count": (_whole, "a whole number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "path": (_path, "a path (a non-empty string)"),
    "paths": (_strings, "a list of paths (strings)"),
    "folders": (lambda v: _path(v) or isinstance(v, (list, tuple)) and all(map(_path, v)),
                "a path or a list of paths"),
    "strings": (_strings, "a list of strings"),
    "env": (_env, "a dict of names to string (or number) values"),
    "callable": (callable, "callable"),
    "dict": (lambda v: isinstance(v, dict), "a dict"),
}


def _instance_of(value: Any, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(value).__mro__)


def check_kind(name: str, value: Any, kind: str) -> Any:
    """``value`` if it is of ``kind`` (ints kept, other real numbers as floats), else
    TypeError (the wrong type) or ValueError (a number out of range) naming ``name``."""
    base, _, none_ok = kind.partition("|")
    if value is None:
        if none_ok:
            return None
        raise TypeError(f"{name!r} must not be None")
    if base[:1].isupper():
        if not _instance_of(value, base):
            raise TypeError(f"{name!r} must be a {base}, not {value!r} "
                            f"({type(value).__name__})")
        return value
    test, wanted = _TESTS[base]
    if not test(value):
        raise TypeError(f"{name!r} must be {wanted}, not {value!r} ({type(value).__name__})")
    if base in ("number", "positive", "int", "count"):
        return _in_range(name, value, base)
    return value


def _in_range(name: str, value: Any, base: str) -> Any:
    if not math.isfinite(value):
        raise ValueError(f"{name!r} is {value!r}: it must be a finite number")
    if value < 0:
        raise ValueError(f"{name!r} is {value!r}: it cannot be negative")
    if base == "positive" and value == 0:
        raise ValueError(f"{name!r} is {value!r}: it must be above 0")
    if base == "count" and value < 1:
        raise ValueError(f"{name!r} is {value!r}: at least 1, or None for no cap")
    if isinstance(value, int):
        return value
    return int(value) if base in ("int", "count") else float(value)
