"""Primary module of the geo_lib folder library."""
TOOL_LIBRARY_NAME = "Geo Library"
TOOL_LIBRARY_ALIASES = ["geo", "Geo-Tools"]


def tool_geo_distance(lat1: float, lon1: float, lat2: float, lon2: float, unit: str = "km"):
    """Distance between two points (primary definition)."""
    return {"success": True}


def tool_geo_area(polygon: list):
    """Area of a polygon."""
    return {"success": True}


def tool_geo_area_prompt():
    """Dynamic description for tool_geo_area, same file."""
    return "area"
