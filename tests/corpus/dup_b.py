"""Both dup_a.py and dup_b.py define the same tool with the same schema."""


def tool_shared_echo(text: str, times: int = 1):
    """Echoes text.

    Args:
        text (str): What to echo.
        times (int): How many times.
    """
    return {"success": True, "output": text * times}
