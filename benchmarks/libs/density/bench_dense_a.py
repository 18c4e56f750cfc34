"""Density benchmark library a: one tool that does nothing."""


def tool_dense_a_noop() -> dict:
    """Does nothing and returns a tiny result.

    Returns:
        dict: {"ok": True}
    """
    return {"ok": True}
