"""Sibling that sorts before the primary: the primary still loads first."""


def tool_geo_distance(a: str):
    """Sibling duplicate of tool_geo_distance: ignored."""
    return {"success": True}


def tool_geo_bearing(lat1: float, lon1: float, lat2: float, lon2: float):
    """Initial bearing between two points."""
    return {"success": True}
