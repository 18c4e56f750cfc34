def tool_misc_from_init():
    """Never discovered."""
