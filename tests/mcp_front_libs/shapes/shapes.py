"""Results of every shape, module state, the workspace, and a schema of every parameter kind."""
import os
from pathlib import Path

TOOL_LIBRARY_NAME = "Shapes"
DEFAULT_MODE = "fast"
COUNTER = 0
# A 1x1 transparent PNG.
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


def tool_echo(text: str) -> str:
    """Returns the text unchanged.

    Args:
        text (str): what to send back
    """
    return text


def tool_structured() -> dict:
    """Returns an output that is not a string, with values JSON does not have."""
    return {"success": True, "output": {"numbers": (1, 2), "tags": {"b", "a"}, "raw": b"\xff\x00",
                                        "text": b"hi", "nan": float("nan")}}


def tool_fails() -> dict:
    """Fails the way the bundled tools do: the output repeats the error."""
    return {"success": False, "error": "the disk is full", "output": "Error: the disk is full"}


def tool_fails_bare() -> dict:
    """Fails with an error only (LCP fills the output with a success text)."""
    return {"success": False, "error": "bad input"}


def tool_raises() -> dict:
    """Raises an exception."""
    raise ValueError("boom")


def tool_image() -> dict:
    """Returns an image and a prompt injection (LCP pass-through keys)."""
    return {"success": True, "output": "one pixel", "image_b64": PIXEL, "image_media_types": ["image/png"],
            "prompt_injection": "look at the pixel"}


def tool_count(step: int = 1) -> dict:
    """Adds step to a counter kept in the module and returns it.

    Args:
        step (int): how much to add
    """
    global COUNTER
    COUNTER += step
    return {"success": True, "output": {"counter": COUNTER, "pid": os.getpid()}}


def tool_where(file_name: str = "", content: str = "") -> dict:
    """Writes a file in the workspace when content is given; returns the workspace and its files.

    Args:
        file_name (str): file to write
        content (str): its content
    """
    if file_name and content:
        Path(file_name).write_text(content)
    return {"success": True, "output": {"cwd": os.getcwd(), "files": sorted(os.listdir(".")), "pid": os.getpid()}}


def tool_schema(count: int, ratio: float = 0.5, flag: bool = False, items: list = None, options: dict = None,
                mode: str = DEFAULT_MODE, label: str = "plain", path: Path = Path("."), *, limit: int = 10) -> dict:
    """Takes one parameter of every kind.

    Args:
        count (int): how many
        ratio (float): a fraction
        flag (bool): a switch
        items (list): some items
        options (dict): some options
        mode (str): a mode whose default is a constant (not a literal)
        label (str): a label
        path (Path): a path whose default is an expression (not a literal)
        limit (int): a keyword-only limit
    """
    return {"success": True, "output": {"count": count, "ratio": ratio, "flag": flag, "items": items,
                                        "options": options, "mode": mode, "label": label, "path": str(path),
                                        "limit": limit}}


def tool_dynamic() -> dict:
    """Static description (replaced by tool_dynamic_prompt)."""
    return {"success": True, "output": "dynamic"}


def tool_dynamic_prompt() -> str:
    return f"Dynamic description, computed in the worker (counter {COUNTER})."
