"""Counts its imports in the file named by TPL_COUNTER; module state per worker."""
import os
import random
import sys

if os.environ.get("TPL_COUNTER"):
    with open(os.environ["TPL_COUNTER"], "a") as f:
        f.write("i")

STATE = {"calls": [], "config": None, "inits": 0}


def init_tools_library(config=None):
    STATE["inits"] += 1
    STATE["config"] = (config or {}).get("who")


def tool_touch(x: int = 0) -> dict:
    """Records a call and says what this worker holds."""
    STATE["calls"].append(x)
    return {"success": True, "output": {
        "pid": os.getpid(), "calls": STATE["calls"], "config": STATE["config"], "inits": STATE["inits"],
        "name": __name__, "same_module": sys.modules.get(__name__) is sys.modules[tool_touch.__module__],
        "random": random.random()}}
