"""A module with a top-level side effect: it writes a marker when imported."""
from pathlib import Path

Path(__file__).with_suffix(".imported").write_text("imported")


def tool_marker() -> dict:
    """Says hello."""
    return {"success": True, "output": "hello"}
