"""Every row of the annotation -> JSON type table, and the substring quirks."""
from typing import Any, Dict, List, Optional


def tool_typed_scalars(count: int, ratio: float, amount: "number", flag: bool, name: str, anything):
    """Scalars of every kind."""
    return {"success": True}


def tool_typed_containers(items: list, tags: List[str], vec: "array", meta: dict,
                          table: Dict[str, str], blob: object, thing: Any):
    """Containers of every kind."""
    return {"success": True}


def tool_typed_quirks(ints: List[int], maybe: Optional[float], point: "Point",
                      flags: Dict[str, bool], path: "Path", upper: "INT"):
    """Substring rule: the first matching row wins, case-insensitively."""
    return {"success": True}
