"""A tool that returns at once and leaves child processes that take memory later.

Bounded: each child exits by itself after BOUND_S, sandbox or not."""
import subprocess
import sys

BOUND_S = 20.0


def tool_late_hogs(count: int = 3, mb: int = 120, after_s: float = 1.5) -> dict:
    """Starts child processes that each allocate mb after after_s, hold it, then exit.

    Args:
        count (int): how many children
        mb (int): memory per child
        after_s (float): how long each child waits before allocating
    """
    code = (f"import time; time.sleep({min(float(after_s), BOUND_S)}); b = b'x' * ({int(mb)} * 1024 * 1024); "
            f"time.sleep({BOUND_S})")
    kids = [subprocess.Popen([sys.executable, "-c", code]).pid for _ in range(min(int(count), 8))]
    return {"children": kids}
