"""A library with module state, host config, handlers and host objects: the core behaviours."""
import os
import time
from pathlib import Path

TOOL_LIBRARY_NAME = "Stateful"
COUNTER = 0
CONFIG = None
INIT_CALLS = 0
_CONFIRM_HANDLER = None
_UI_HANDLER = None


def set_confirm_handler(handler):
    global _CONFIRM_HANDLER
    _CONFIRM_HANDLER = handler


def set_user_interaction_handler(handler):
    global _UI_HANDLER
    _UI_HANDLER = handler


def init_tools_library(config=None):
    global CONFIG, INIT_CALLS
    INIT_CALLS += 1
    CONFIG = config


def tool_increment(step: int = 1) -> dict:
    """Adds step to a module-level counter and returns it.

    Args:
        step (int): amount to add
    """
    global COUNTER
    COUNTER += int(step)
    return {"success": True, "output": COUNTER}


def tool_whoami() -> dict:
    """Returns pid, cwd and how often init ran."""
    return {"success": True, "output": {"pid": os.getpid(), "cwd": os.getcwd(), "init_calls": INIT_CALLS}}


def tool_config() -> dict:
    """Returns the plain part of the host config this library got."""
    plain = {k: v for k, v in (CONFIG or {}).items() if isinstance(v, (str, int, float, bool, list, dict))}
    handlers = {k: CONFIG[k] is not None for k in ("confirm_handler", "user_interaction_handler") if k in (CONFIG or {})}
    return {"success": True, "output": {"plain": plain, "handlers": handlers}}


def tool_confirm(shape: str = "tuple") -> dict:
    """Asks the confirm handler, in several call shapes.

    Args:
        shape (str): tuple | argv | dict | single | keywords | module | none
    """
    h = (CONFIG or {}).get("confirm_handler")
    if shape == "module":
        h = _CONFIRM_HANDLER
    if h is None:
        return {"success": True, "output": "no handler"}
    if shape == "tuple":
        answer = h("rm -rf build", "shell")
    elif shape == "argv":
        answer = h("rm -rf build", "shell", ["rm", "-rf", "build"])
    elif shape == "dict":
        answer = h({"action": "delete", "path": "build"})
    elif shape == "single":
        answer = h("delete build?")
    elif shape == "keywords":
        answer = h(source="rm -rf build", script_label="shell", argv=["rm"])
    else:
        answer = h("rm -rf build", "shell")
    return {"success": True, "output": list(answer) if isinstance(answer, tuple) else answer}


def tool_ask(prompt: str, user_interaction_handler=None) -> dict:
    """Asks the user through the injected handler.

    Args:
        prompt (str): the question
    """
    if user_interaction_handler is None:
        return {"success": False, "error": "no user interaction handler"}
    answer = user_interaction_handler({"type": "text", "title": "Question", "prompt": prompt,
                                       "options": [], "default": None})
    return {"success": True, "output": answer}


def tool_wait_for(path: str, seconds: float = 10.0) -> dict:
    """Waits (bounded) until a file exists, then reports the cwd.

    Args:
        path (str): absolute path to wait for
        seconds (float): give up after this long
    """
    end = time.monotonic() + float(seconds)
    while not Path(path).exists():
        if time.monotonic() > end:
            return {"success": False, "error": f"{path} never appeared"}
        time.sleep(0.005)
    return {"success": True, "output": os.getcwd()}


def tool_touch(path: str) -> dict:
    """Creates a file and reports the cwd.

    Args:
        path (str): absolute path to create
    """
    Path(path).write_text("x")
    return {"success": True, "output": os.getcwd()}


def tool_echo(value=None, **kwargs) -> dict:
    """Echoes what it got, including unknown parameters (it declares **kwargs)."""
    return {"success": True, "output": {"value": value, "kwargs": sorted(kwargs)}}


def tool_strict(a: str, b: int = 2) -> dict:
    """Only takes a and b; anything else must be dropped before the call.

    Args:
        a (str): first
        b (int): second
    """
    return {"success": True, "output": [a, b]}


def tool_context_use(tool_context=None, lollms_client_instance=None, discussion_instance=None) -> dict:
    """Reports which host objects it received."""
    return {"success": True, "output": {
        "tool_context": tool_context if isinstance(tool_context, (dict, str, int)) else type(tool_context).__name__,
        "client": None if lollms_client_instance is None else type(lollms_client_instance).__name__,
        "discussion": None if discussion_instance is None else type(discussion_instance).__name__}}


def tool_files(names: list) -> dict:
    """Returns context_files and pass-through keys.

    Args:
        names (list): file names
    """
    for n in names[:1]:
        Path(n).write_text("data")
    return {"success": True, "output": "ok", "context_files": names, "prompt_injection": "look",
            "image_filename": "x.png", "extra": "dropped"}


def tool_raise(message: str = "boom") -> dict:
    """Raises ValueError.

    Args:
        message (str): the message
    """
    raise ValueError(message)


def tool_unpicklable() -> dict:
    """Returns an object the protocol cannot carry (it arrives as its repr)."""
    import threading
    return {"success": True, "output": threading.Lock()}


def tool_too_deep() -> dict:
    """Returns lists nested 300 deep: more than the protocol carries."""
    v = []
    for _ in range(300):
        v = [v]
    return {"success": True, "output": v}


def tool_lambda_output() -> dict:
    """Returns a lambda: a function never crosses to the host, its repr does."""
    return {"success": True, "output": {"fn": lambda x: x + 1}}
