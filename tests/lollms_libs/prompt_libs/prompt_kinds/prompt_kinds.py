"""Tools whose descriptions come from prompt providers of every kind
(tests/test_lollms_surface.py runs them through LCPBinding and SandboxedBinding).

tool_counted's provider reports module state that only a call of tool_counted changes,
so its text says in which process the provider ran."""
import os

CALLS = 0


def tool_counted(step: int = 1) -> dict:
    """Count calls in this module.

    step: how much to add"""
    global CALLS
    CALLS += step
    return {"output": CALLS}


def tool_counted_prompt() -> str:
    return f"Counts calls; {CALLS} so far, CWD {os.getcwd()}."


def tool_number(x: int) -> dict:
    """Echo a number."""
    return {"output": x}


def tool_number_prompt():
    return 42


def tool_broken() -> dict:
    """A tool whose provider raises."""
    return {"output": "ran"}


def tool_broken_prompt() -> str:
    raise RuntimeError("no description today")


def tool_nothing() -> dict:
    """A tool whose provider returns None."""
    return {"output": "ran"}


def tool_nothing_prompt():
    return None


def tool_wants_args() -> dict:
    """A tool whose provider needs an argument (so it cannot be called as a provider)."""
    return {"output": "ran"}


def tool_wants_args_prompt(detail: str) -> str:
    return f"detail {detail}"


def tool_static(text: str = "hi") -> dict:
    """A tool without a provider."""
    return {"output": text}
