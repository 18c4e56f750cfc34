"""The process that runs uv to build an environment, confined to writing where it must.

    host (backends/envs/build.py) ──stdin: {"write": [...], "steps": [{argv, stdin}]}──►
        Landlock (Linux 5.13+): read everywhere, write only beneath ``write`` (the store,
        uv's cache, its own temp dir) and to /dev/null & co., for itself and uv
        each step run in turn, stopped at the first that fails
    ◄──stdout: {"landlock": report, "results": [{"rc", "words"}]}──

It never runs a tool: it is started as a fresh interpreter of the engine (as the zygote
is), with the builder's allowlisted environment.  uv builds nothing from source here
(``--no-build``), so no package's code runs either; Landlock bounds what a flaw in uv
or a hostile wheel's paths could write.
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

_STEP_TIMEOUT_S = 1800.0


def confine(write: list[str]) -> str:
    """Landlock over this process and its children; its report (what holds)."""
    if not sys.platform.startswith("linux"):
        return "unavailable (not Linux)"
    from .confine.landlock import DEVICES, apply_landlock
    return apply_landlock(write, ["/"], DEVICES)


def run(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    results = []
    for step in steps:
        try:
            done = subprocess.run(step["argv"], input=step.get("stdin"), capture_output=True,
                                  text=True, timeout=_STEP_TIMEOUT_S, check=False)
            words = (done.stderr or done.stdout).strip()
            results.append({"rc": done.returncode, "words": words})
        except subprocess.TimeoutExpired:
            results.append({"rc": -1, "words": f"{step['argv'][0]} {step['argv'][1]} ran for "
                                               f"over {_STEP_TIMEOUT_S:g} s and was stopped"})
        except OSError as exc:
            results.append({"rc": -1, "words": f"{step['argv'][0]} could not be run: {exc}"})
        if results[-1]["rc"]:
            break
    return results


def main() -> None:
    spec = json.loads(sys.stdin.read())
    report = confine(list(spec["write"]))
    print(json.dumps({"landlock": report, "results": run(spec["steps"])}))
