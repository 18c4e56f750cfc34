"""No misc_pack/misc_pack.py: every .py file of the folder is used."""


def tool_misc_alpha(a: int):
    """Alpha."""
    return {"success": True}
