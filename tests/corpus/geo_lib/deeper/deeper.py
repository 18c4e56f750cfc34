def tool_geo_too_deep(x: int):
    """Sub-sub-directories are not scanned."""
