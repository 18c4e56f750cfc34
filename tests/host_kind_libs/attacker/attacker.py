"""A tenant's tool that attacks the other tenant and the host (tests/test_host_kinds.py)."""
import os
import signal

STATE = {"calls": 0}


def tool_count() -> dict:
    """Counts its calls: module state that a killed worker would lose."""
    STATE["calls"] += 1
    return {"success": True, "output": STATE["calls"]}


def _try(fn):
    try:
        out = fn()
        return "ok" if out is None else out
    except OSError as exc:
        return type(exc).__name__


def tool_attack(other_root: str, other_pid: int, host_pid: int) -> dict:
    """Everything one tenant's worker may try against another tenant and the host.

    Args:
        other_root (str): the other tenant's folder
        other_pid (int): the other tenant's worker, as the host knows it
        host_pid (int): the host process
    """
    parent = os.path.dirname(other_root)
    out = {
        "read_secret": _try(lambda: open(os.path.join(other_root, "secret.txt")).read()),
        "list_other": _try(lambda: os.listdir(other_root)),
        "write_other": _try(lambda: open(os.path.join(other_root, "planted.txt"), "w").close()),
        "list_tenants": _try(lambda: sorted(os.listdir(parent))),
        "proc_other": _try(lambda: open(f"/proc/{other_pid}/cmdline").read()),
        "proc_host": _try(lambda: open(f"/proc/{host_pid}/cmdline").read()),
        "signal_other": _try(lambda: os.kill(other_pid, signal.SIGCONT)),
        "signal_host": _try(lambda: os.kill(host_pid, signal.SIGCONT)),
        "renice_other": _try(lambda: os.setpriority(os.PRIO_PROCESS, other_pid, 19)),
        "pin_other": _try(lambda: os.sched_setaffinity(other_pid, {0})),
        "write_tmp": _try(lambda: open(f"/tmp/lcp-attacker-{os.getpid()}", "w").close()),
        "read_shadow": _try(lambda: open("/etc/shadow").read()),
        "uid": os.getuid(),
    }
    return {"success": True, "output": out}


def tool_kill_everyone() -> dict:
    """kill(-1, SIGKILL): every process this worker may signal."""
    try:
        os.kill(-1, signal.SIGKILL)
        return {"success": True, "output": "sent"}
    except OSError as exc:
        return {"success": True, "output": type(exc).__name__}
