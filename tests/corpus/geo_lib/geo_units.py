"""Another sibling."""


def tool_geo_convert(value: float, from_unit: str = "km", to_unit: str = "mi"):
    """Converts a distance."""
    return {"success": True}


def tool_geo_lib_prompt():
    """Dynamic context for the whole geo_lib library (sibling file)."""
    return "geo"


def tool_geo_bearing_prompt():
    """Dynamic description of tool_geo_bearing, defined in another file of the library."""
    return "bearing"
