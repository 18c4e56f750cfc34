"""A library whose import kills its process."""
import ctypes
ctypes.string_at(0)


def tool_never() -> dict:
    """Never runs."""
    return {"success": True, "output": "unreachable"}
