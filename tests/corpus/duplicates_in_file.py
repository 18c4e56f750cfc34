"""The same name twice in one file: the first definition wins."""


def tool_twice(a: int):
    """First definition."""
    return {"success": True}


def tool_twice(b: str):  # noqa: F811
    """Second definition."""
    return {"success": True}
