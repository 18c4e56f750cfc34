"""Tools of the MCP load tests: a quick call, and a call held until the test releases it."""
import os
import time

CALLS = {"n": 0}


def tool_quick() -> dict:
    """Answers at once with how many calls this worker served (a dict: {"calls": n})."""
    CALLS["n"] += 1
    return {"calls": CALLS["n"]}


def tool_held(release: str, max_s: float = 30.0) -> dict:
    """Waits until the file ``release`` exists (at most ``max_s`` seconds).

    Args:
        release (str): absolute path of the file that ends the wait.
        max_s (float): the longest wait, so the tool always ends.
    """
    deadline = time.monotonic() + max_s
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"released": os.path.exists(release)}
