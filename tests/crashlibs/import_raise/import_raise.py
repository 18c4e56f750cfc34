"""A library whose init fails."""


def init_tools_library(config=None):
    raise RuntimeError("database unreachable")


def tool_never_raise() -> dict:
    """Never runs."""
    return {"success": True, "output": "unreachable"}
