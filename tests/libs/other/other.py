"""A second, independent library."""
import os

VALUE = "untouched"


def tool_other_set(value: str) -> dict:
    """Sets a module-level value.

    Args:
        value (str): new value
    """
    global VALUE
    VALUE = value
    return {"success": True, "output": VALUE}


def tool_other_get() -> dict:
    """Returns the module-level value and the pid."""
    return {"success": True, "output": {"value": VALUE, "pid": os.getpid()}}
