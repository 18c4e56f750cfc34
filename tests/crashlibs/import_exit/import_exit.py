"""A library that calls sys.exit at import."""
import sys
sys.exit(3)


def tool_never_exit() -> dict:
    """Never runs."""
    return {"success": True, "output": "unreachable"}
