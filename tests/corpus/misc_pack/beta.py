def tool_misc_beta(b: bool = True):
    """Beta."""
    return {"success": True}
