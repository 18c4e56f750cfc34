def tool_geo_from_init():
    """Never discovered."""
