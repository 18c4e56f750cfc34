"""A throwaway tool library: spares rehearse a first call on it (worker/loop.py rehearse())."""


def tool_rehearse(a: int, b: str = "", tool_context=None) -> dict:
    """Nothing."""
    return {"success": True, "output": {"a": a, "b": b}}
