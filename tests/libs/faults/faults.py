"""Tools that misbehave for real, each bounded so it stops by itself even with no sandbox."""
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

STATE = {"value": "initial"}
BOUND_S = 30.0          # nothing here runs longer than this, sandbox or not


def tool_set_state(value: str) -> dict:
    """Stores a value in module state.

    Args:
        value (str): the value
    """
    STATE["value"] = value
    return {"success": True, "output": value}


def tool_get_state() -> dict:
    """Returns the module state and the pid."""
    return {"success": True, "output": {"value": STATE["value"], "pid": os.getpid()}}


def tool_segfault() -> dict:
    """Dereferences a null pointer."""
    ctypes.string_at(0)


def tool_abort() -> dict:
    """Calls abort()."""
    os.abort()


def tool_os_exit(code: int = 3) -> dict:
    """Leaves the process at once.

    Args:
        code (int): exit code
    """
    os._exit(int(code))


def tool_sys_exit(code: int = 4) -> dict:
    """Raises SystemExit.

    Args:
        code (int): exit code
    """
    sys.exit(int(code))


def tool_keyboard_interrupt() -> dict:
    """Raises KeyboardInterrupt."""
    raise KeyboardInterrupt("pressed")


def tool_busy(seconds: float = BOUND_S) -> dict:
    """Spins the CPU in Python code (bounded).

    Args:
        seconds (float): spin this long at most
    """
    end = time.monotonic() + min(float(seconds), BOUND_S)
    n = 0
    while time.monotonic() < end:
        n += 1
    return {"success": True, "output": n}


def tool_sleep(seconds: float = BOUND_S) -> dict:
    """Sleeps with time.sleep (bounded).

    Args:
        seconds (float): how long
    """
    time.sleep(min(float(seconds), BOUND_S))
    return {"success": True, "output": "slept"}


def tool_stubborn(seconds: float = BOUND_S) -> dict:
    """Replaces the worker's interrupt handler with its own, then sleeps (bounded).

    Args:
        seconds (float): how long at most
    """
    signal.signal(signal.SIGUSR1, lambda *a: None)      # swallows every interruption
    time.sleep(min(float(seconds), BOUND_S))
    return {"success": True, "output": "survived"}


def tool_c_sleep(seconds: int = 20) -> dict:
    """Sleeps inside C with the interrupt signal blocked (bounded).

    Args:
        seconds (int): how long
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        ctypes.CDLL(None).sleep(min(int(seconds), int(BOUND_S)))
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    return {"success": True, "output": "woke"}


def tool_memory_hog(mb: int = 2048, catch: bool = False) -> dict:
    """Allocates and touches memory in 16 MB steps, up to mb (bounded).

    Args:
        mb (int): total to allocate
        catch (bool): catch MemoryError and report it
    """
    chunks = []
    try:
        for _ in range(min(int(mb), 4096) // 16):
            chunks.append(b"x" * (16 * 1024 * 1024))
    except MemoryError:
        if catch:
            got = len(chunks) * 16
            chunks.clear()
            return {"success": True, "output": f"caught MemoryError after {got} MB"}
        raise
    return {"success": True, "output": f"allocated {len(chunks) * 16} MB"}


def tool_spawn_hogs(count: int = 3, mb: int = 150, seconds: float = 20.0) -> dict:
    """Starts child processes that each hold mb of memory for a while, then waits for them.

    Args:
        count (int): how many children
        mb (int): memory per child
        seconds (float): how long each child lives
    """
    code = (f"import time; b = b'x' * ({int(mb)} * 1024 * 1024); "
            f"time.sleep({min(float(seconds), BOUND_S)})")
    kids = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(min(int(count), 8))]
    for k in kids:
        k.wait()
    return {"success": True, "output": "children done"}


def tool_leave_child(new_session: bool = False) -> dict:
    """Starts a child process that outlives the call (bounded to 60 s) and returns its pid.

    Args:
        new_session (bool): the child escapes into its own session
    """
    p = subprocess.Popen(["sleep", "60"], start_new_session=bool(new_session))
    return {"success": True, "output": p.pid}


def tool_leave_thread() -> dict:
    """Starts a non-daemon thread that keeps running (bounded) after the call."""
    def loop():
        end = time.monotonic() + BOUND_S
        while time.monotonic() < end:
            time.sleep(0.05)
    threading.Thread(target=loop, daemon=False).start()
    return {"success": True, "output": threading.active_count()}


def tool_big_result(mb: int = 300) -> dict:
    """Returns a string of mb megabytes.

    Args:
        mb (int): size
    """
    return {"success": True, "output": "x" * (min(int(mb), 1024) * 1024 * 1024)}


def tool_recurse(depth: int = 100000) -> dict:
    """Recurses until Python stops it.

    Args:
        depth (int): recursion depth
    """
    def down(n):
        return 0 if n == 0 else 1 + down(n - 1)
    return {"success": True, "output": down(int(depth))}


def tool_print_flood(mb: int = 10) -> dict:
    """Prints mb megabytes to stdout and stderr, line by line.

    Args:
        mb (int): how much
    """
    line = "y" * 1023
    for i in range(int(mb) * 1024):
        print(line, file=sys.stderr if i % 2 else sys.stdout)
    return {"success": True, "output": "printed"}


def tool_open_files(limit: int = 100000) -> dict:
    """Opens files until the system refuses (bounded), then closes them.

    Args:
        limit (int): stop after this many
    """
    handles = []
    try:
        for _ in range(int(limit)):
            handles.append(open(os.devnull))
    except OSError as exc:
        return {"success": True, "output": {"opened": len(handles), "error": type(exc).__name__}}
    finally:
        for h in handles:
            h.close()
    return {"success": True, "output": {"opened": len(handles), "error": None}}


def tool_write_file(mb: int = 8) -> dict:
    """Writes mb megabytes to big.bin in the workspace.

    Args:
        mb (int): size
    """
    try:
        with open("big.bin", "wb") as f:
            for _ in range(int(mb)):
                f.write(b"z" * 1048576)
    except OSError as exc:
        return {"success": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"success": True, "output": "written"}


def tool_limits() -> dict:
    """Reports the worker's resource limits."""
    import resource
    return {"success": True, "output": {
        "core": resource.getrlimit(resource.RLIMIT_CORE)[0],
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[0],
        "cpu": resource.getrlimit(resource.RLIMIT_CPU)[0],
        "data": resource.getrlimit(resource.RLIMIT_DATA)[0]}}


def tool_raise_limits() -> dict:
    """Tries to lift its own limits back to unlimited (as a hostile tool would)."""
    import resource
    out = {}
    for name in ("RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_CPU"):
        which = getattr(resource, name)
        soft, hard = resource.getrlimit(which)
        try:
            resource.setrlimit(which, (hard, hard))
            resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            out[name] = "raised"
        except (ValueError, OSError):
            out[name] = resource.getrlimit(which)[0] == soft
    return {"success": True, "output": out}


def tool_token(token: str) -> dict:
    """Returns its token and the pid.

    Args:
        token (str): anything
    """
    return {"success": True, "output": {"token": token, "pid": os.getpid()}}


def tool_fail(message: str = "planned") -> dict:
    """Raises RuntimeError.

    Args:
        message (str): the message
    """
    raise RuntimeError(message)
