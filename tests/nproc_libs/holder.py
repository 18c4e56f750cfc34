"""Tools that hold forked children (bounded, self-limiting), to meet a process cap."""
import os


HELD: dict = {}


def tool_hold(count: int = 30) -> dict:
    """Forks up to ``count`` children that stay until ``tool_release`` (or until this worker
    ends: they wait for the end of a pipe only it holds open); how many it got.

    Args:
        count (int): children to try
    """
    r, w = os.pipe()
    kids, error = [], None
    for _ in range(count):
        try:
            pid = os.fork()
        except OSError as exc:
            error = type(exc).__name__ + f" {exc.errno}"
            break
        if pid == 0:
            os.close(w)
            os.read(r, 1)                     # b"" once the writer is gone
            os._exit(0)
        kids.append(pid)
    os.close(r)
    HELD.update(w=w, kids=kids)
    return {"success": True, "output": {"held": len(kids), "error": error}}


def tool_release() -> dict:
    """Lets the held children go and reaps them."""
    os.close(HELD.pop("w"))
    for pid in HELD.pop("kids"):
        os.waitpid(pid, 0)
    return {"success": True, "output": "released"}


def tool_ping() -> dict:
    """Answers (a worker started, nothing else)."""
    return {"success": True, "output": "pong"}
