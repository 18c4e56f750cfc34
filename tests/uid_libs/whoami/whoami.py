"""Its uid, and a file of another tenant's, read."""
import os


def tool_whoami() -> dict:
    """The worker's uid and gid."""
    return {"success": True, "output": [os.getuid(), os.getgid()]}


def tool_read(path: str) -> dict:
    """Reads a file, or says the error's type.

    Args:
        path (str): the file
    """
    try:
        with open(path) as f:
            return {"success": True, "output": f.read()}
    except OSError as exc:
        return {"success": True, "output": type(exc).__name__}
