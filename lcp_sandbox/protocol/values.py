"""How values and exceptions travel, on both sides.

Plain values (None, bool, numbers, str, bytes and lists / tuples / dicts of
those) travel by value; any other object a side lends travels as a reference
(see ``codec.Ref``).  An exception travels as ``[type name, args]`` and is
rebuilt on the other side as the same builtin type, or a class of the same
name: never by unpickling.
"""
from __future__ import annotations

import builtins
import pickle
from typing import Any, Callable

_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def is_plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` travels by value (no part of it needs lending)."""
    if isinstance(value, _SCALARS):
        return True
    if depth > 32:
        return False
    if type(value) in (list, tuple):
        return all(is_plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(isinstance(k, _SCALARS) and is_plain(v, depth + 1) for k, v in value.items())
    return False


def sendable(value: Any) -> bool:
    """Whether ``value`` can be sent to a worker as it is (else it is lent)."""
    if is_plain(value):
        return True
    if callable(value):
        return False
    try:
        pickle.dumps(value)
        return True
    except Exception:
        return False


def map_containers(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with every item of its (nested) dicts, lists and tuples passed
    through ``leaf``; the containers are rebuilt as the same builtin types."""
    t = type(value)
    if t is dict:
        return {k: map_containers(v, leaf) for k, v in value.items()}
    if t is list or t is tuple:
        return t(map_containers(v, leaf) for v in value)
    return leaf(value)


def error_value(exc: BaseException) -> list[Any]:
    """How an exception travels: [type name, args] (its text when args are not plain)."""
    args = exc.args
    if isinstance(exc, OSError) and exc.filename is not None:
        # The filename is not in args.
        args = (exc.errno, exc.strerror, exc.filename)
    if not is_plain(args):
        args = (str(exc),)
    return [type(exc).__name__, list(args)]


_error_classes: dict[str, type[Exception]] = {}


def rebuild_error(type_name: str, args: Any) -> BaseException:
    """The peer's exception, as the same builtin type or a class of the same name."""
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    cls = getattr(builtins, type_name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(*args)
        except Exception:
            pass
    made = _error_classes.get(type_name)
    if made is None:
        made = _error_classes[type_name] = type(type_name, (Exception,), {"__module__": "host"})
    return made(*args)
