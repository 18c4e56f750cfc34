"""Fills its workspace, as a runaway tool would (self-limiting: at most `mb` MiB)."""
import errno
import os


def tool_fill(name: str, mb: int) -> dict:
    """Write up to mb MiB into the file name, 1 MiB at a time, until a write fails.

    Args:
        name (str): file name
        mb (int): at most this many MiB
    """
    chunk, written, failed = b"x" * 2**20, 0, None
    with open(name, "wb") as f:
        for _ in range(mb):
            try:
                f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
                written += 1
            except OSError as exc:
                failed = errno.errorcode.get(exc.errno, str(exc.errno))
                break
    if failed:
        os.unlink(name)               # (what it could not finish: the room is free again)
    return {"success": True, "output": {"written_mb": written, "error": failed}}


def tool_files() -> dict:
    """The files of its workspace and their sizes."""
    return {"success": True, "output": [[n, os.path.getsize(n)] for n in sorted(os.listdir("."))
                                        if os.path.isfile(n)] or "none"}
