"""Another tenant's (or library's) well-behaved tools."""
import os

_calls = 0


def tool_count() -> dict:
    """Counts its calls (module state)."""
    global _calls
    _calls += 1
    return {"success": True, "output": {"pid": os.getpid(), "calls": _calls}}
