"""A library gated by TOOL_LIBRARY_LOAD_FLAG."""
TOOL_LIBRARY_LOAD_FLAG = "enable_flagged_lib"
TOOL_LIBRARY_NAME = "Flagged Library"


def tool_flagged_action(x: int = 1):
    """Only loaded when enable_flagged_lib is on."""
    return {"success": True}
