"""Defaults of many kinds: literals are evaluated, anything else is source text."""
import os
from pathlib import Path


def tool_literal_defaults(a: int = 3, b: float = -2.5, c: str = "hello", d: bool = True,
                          e=None, f: list = [1, "two", 3.0], g: dict = {"k": [1, 2]},
                          h: tuple = (1, 2), i: str = '', j: int = 0x10, k=1e3, m=False):
    """Literal defaults."""
    return {"success": True}


def tool_source_defaults(sep: str = os.sep, here=Path("."), fn=len, total: int = 2 * 3,
                         joined: str = "a" + "b", lst=list(), comp=[x for x in range(3)],
                         attr=os.path.curdir):
    """Non-literal defaults fall back to the source text."""
    return {"success": True}


def tool_mixed_required(first, second: int, third: str = "x", fourth: int = -1):
    """Required parameters are those without a default."""
    return {"success": True}
