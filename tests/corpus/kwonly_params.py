"""Keyword-only parameters."""


def tool_kwonly_mixed(path: str, *, recursive: bool = False, depth: int, pattern: str = "*"):
    """Lists files.

    Args:
        path (str): Where.
        recursive (bool): Recurse.
        depth (int): Max depth.
    """
    return {"success": True}


def tool_kwonly_only(*, target: str, retries: int = 2):
    """Only keyword-only parameters.

    Args:
        target (str): The target.
        retries (int): Retry count.
    """
    return {"success": True}


def tool_kwonly_after_args(name: str, *args, flag: bool = True, **kwargs):
    """Keyword-only after *args."""
    return {"success": True}
