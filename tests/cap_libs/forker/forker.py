"""A tool that forks as many children as it is allowed (bounded, self-limiting)."""
import os
import time

open("imported.txt", "w").close()        # (its workspace: the import ran)
STATE = {"calls": 0}


def tool_fork_many(count: int = 60) -> dict:
    """Forks up to ``count`` children that sleep a moment; how many it got, and the error.

    Args:
        count (int): children to try
    """
    STATE["calls"] += 1
    kids, error = [], None
    for _ in range(count):
        try:
            pid = os.fork()
        except OSError as exc:
            error = type(exc).__name__ + f" {exc.errno}"
            break
        if pid == 0:
            time.sleep(0.5)
            os._exit(0)
        kids.append(pid)
    for pid in kids:
        os.waitpid(pid, 0)
    return {"success": True, "output": {"forked": len(kids), "error": error,
                                        "calls": STATE["calls"]}}
