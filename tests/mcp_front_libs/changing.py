"""A library the tests rewrite while a server serves it (list_changed)."""
COUNTER = 0


def tool_version() -> dict:
    """Returns the version of this file and a counter kept in the module."""
    global COUNTER
    COUNTER += 1
    return {"success": True, "output": {"version": 1, "counter": COUNTER}}
