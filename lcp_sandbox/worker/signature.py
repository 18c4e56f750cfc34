"""What a library function accepts, read from its code object when it is a plain
function (inspect.signature costs about 20 us per function, on a cold start's
critical path twice: init_tools_library and the tool), else from inspect.

    accepts(fn)     (names it takes by keyword, whether it takes **kwargs)
    positional(fn)  whether it takes a positional argument
"""
from __future__ import annotations

import types
from typing import Any, Optional

# inspect.CO_VARARGS and CO_VARKEYWORDS (CPython's code flags): inspect itself, about 5 ms
# of a spawned worker's start with what it imports, is imported only for what is no plain
# function.
_VARARGS, _VARKEYWORDS = 0x04, 0x08


def _code(fn: Any) -> Optional[types.CodeType]:
    """The code object of a plain function whose signature is its code's; else None
    (a wrapper's __wrapped__ or an explicit __signature__ is what inspect reports)."""
    if (type(fn) is not types.FunctionType or "__wrapped__" in fn.__dict__
            or "__signature__" in fn.__dict__):
        return None
    return fn.__code__


def accepts(fn: Any) -> tuple[frozenset, bool]:
    """(the parameter names ``fn`` takes by keyword, whether it takes **kwargs)."""
    code = _code(fn)
    if code is None:
        import inspect
        params = inspect.signature(fn).parameters.values()
        by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return (frozenset(p.name for p in params if p.kind in by_keyword),
                any(p.kind == p.VAR_KEYWORD for p in params))
    names = code.co_varnames[code.co_posonlyargcount:code.co_argcount + code.co_kwonlyargcount]
    return frozenset(names), bool(code.co_flags & _VARKEYWORDS)


def positional(fn: Any) -> bool:
    """Whether ``fn`` takes an argument by position."""
    code = _code(fn)
    if code is None:
        import inspect
        return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
                   for p in inspect.signature(fn).parameters.values())
    return code.co_argcount > 0 or bool(code.co_flags & _VARARGS)
