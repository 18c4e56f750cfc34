"""Density benchmark library c: one tool that does nothing."""


def tool_dense_c_noop() -> dict:
    """Does nothing and returns a tiny result.

    Returns:
        dict: {"ok": True}
    """
    return {"ok": True}
