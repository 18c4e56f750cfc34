"""Positional-only parameters shift the defaults list."""


def tool_posonly_defaults(a: int = 1, /, b: int = 2, c: str = "three"):
    """Positional-only parameter with a default before a regular one."""
    return {"success": True}


def tool_posonly_required(a: int, /, b: int, c: int = 7):
    """Positional-only parameter without a default."""
    return {"success": True}
