"""Confirmation, questions, progress and a long wait that can be cancelled."""
import os
import time

TOOL_LIBRARY_NAME = "Interact"
_CONFIRM_HANDLER = None
ALWAYS = False
STATE = {"interrupted": 0, "finished": 0}


def set_confirm_handler(handler):
    global _CONFIRM_HANDLER
    _CONFIRM_HANDLER = handler


def tool_guarded(action: str) -> dict:
    """Does an action once the operator allowed it (as risky_ops: allow, always, reject).

    Args:
        action (str): what to do
    """
    global ALWAYS
    if ALWAYS:
        return {"success": True, "output": {"done": action, "asked": False}}
    if _CONFIRM_HANDLER is None:
        return {"success": False, "error": "no confirm handler", "output": "no confirm handler"}
    decision, reason = _CONFIRM_HANDLER(f"This would {action} now.", f"interact: {action}", ["do", action])
    if decision == "always":
        ALWAYS = True
    elif decision != "allow":
        return {"success": False, "error": f"rejected: {reason}", "output": f"rejected: {reason}"}
    return {"success": True, "output": {"done": action, "asked": True, "decision": decision, "reason": reason}}


def tool_ask(prompt: str, kind: str = "text", options: list = None, user_interaction_handler=None) -> dict:
    """Asks the user a question.

    Args:
        prompt (str): the question
        kind (str): text, select or secret
        options (list): the choices of a select
    """
    if user_interaction_handler is None:
        return {"success": False, "error": "no user interaction handler"}
    answer = user_interaction_handler({"type": kind, "title": "Question", "prompt": prompt,
                                       "options": options or [], "default": None})
    return {"success": True, "output": {"answer": answer}}


def tool_progress(steps: int = 3, tool_context=None) -> dict:
    """Reports progress at each step.

    Args:
        steps (int): how many steps
    """
    sent = [tool_context.emit_progress(f"step {i + 1} of {steps}", {"progress": i + 1, "total": steps})
            for i in range(steps)]
    return {"success": True, "output": {"steps": steps, "emitted": sent,
                                        "workspace": str(tool_context.workspace_path)}}


def tool_wait(seconds: float = 30.0, tool_context=None) -> dict:
    """Says it started (progress), then waits; an interruption is counted in the module state.

    Args:
        seconds (float): how long to wait
    """
    try:
        tool_context.emit_progress("started")
        time.sleep(seconds)
    except BaseException:
        STATE["interrupted"] += 1
        raise
    STATE["finished"] += 1
    return {"success": True, "output": "waited"}


def tool_state() -> dict:
    """The module state and the worker's pid."""
    return {"success": True, "output": {**STATE, "pid": os.getpid()}}
