"""The process that runs uv to build an environment: as an unprivileged uid, confined to
writing where it must.

    host (backends/envs/build.py) ──stdin: {"write", "reach", "run_as", "cwd", "steps"}──►
        1. (root host) the interpreter, the engine and the paths in ``reach`` and
           ``write`` made reachable by ``run_as`` when a folder above them is private to
           root (confine/mounts.py: an own mount namespace; nothing changes for the host)
        2. Landlock (Linux 5.13+): read everywhere, write only beneath ``write`` (the
           store's build folder, uv's cache) and to /dev/null & co., for itself and uv
        3. every capability dropped and, on a root host, the uid and gid ``run_as``
           (no other groups, no_new_privs): from here on it reads only what that uid
           may read, as a tenant's worker does
        4. checked as that uid: the interpreter runs and ``write`` can be written, else
           refused (naming what it cannot reach)
        5. each step run in turn, in ``cwd``, stopped at the first that fails
    ◄──stdout: {"landlock", "runs_as", "refused", "results": [{"rc", "words"}]}──

It never runs a tool: it is started as a fresh interpreter of the engine (as the zygote
is), with the builder's allowlisted environment.  uv builds nothing from source here
(``--no-build``), so no package's code runs either; Landlock bounds what a flaw in uv
or a hostile wheel's paths could write, the uid what uv could read.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Optional

from ..core.policy import ENGINE_DIR, python_paths

_STEP_TIMEOUT_S = 1800.0


def confine(write: list[str]) -> str:
    """Landlock over this process and its children; its report (what holds)."""
    if not sys.platform.startswith("linux"):
        return "unavailable (not Linux)"
    from .confine.landlock import DEVICES, apply_landlock
    return apply_landlock(write, ["/"], DEVICES)


def reach(paths: list[str], run_as: Optional[list[int]]) -> str:
    """(root host, Linux) ``paths`` made reachable by ``run_as``; the report ("" if
    nothing was needed)."""
    if run_as is None or not sys.platform.startswith("linux"):
        return ""
    from .confine.mounts import make_reachable
    return make_reachable(paths, run_as)


def become(run_as: Optional[list[int]]) -> tuple[str, str]:
    """Drop every privilege and, on a root host, become ``run_as``: (what holds, why the
    build is refused or "")."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    if not sys.platform.startswith("linux"):
        if root:
            return "uid 0", ("environment builds never run as root, and dropping to another "
                             "uid is done on Linux only: run the host as an unprivileged user")
        return "the host's uid (not Linux: no capabilities to drop)", ""
    if root and run_as is None:
        return "uid 0", "environment builds never run as root: the host named no uid for them"
    from .confine.privileges import drop_privileges
    report = drop_privileges(run_as if root else None)
    if report.startswith("failed"):
        return report, (f"the builder could not drop its privileges ({report}): a root host "
                        f"needs CAP_SETUID and CAP_SETGID for its builds, or run the host as "
                        f"an unprivileged user")
    return report, ""


def unreachable(write: list[str], programs: list[str], covered: str) -> str:
    """Why this uid cannot build here ("" if it can): a program it cannot run, or a
    folder of ``write`` it cannot write."""
    missing = [p for p in dict.fromkeys(programs) if not os.access(p, os.X_OK)]
    missing += [p for p in write if not os.access(p, os.W_OK | os.X_OK)]
    if not missing:
        return ""
    return (f"the builder runs as uid {os.geteuid()}, which cannot use {', '.join(missing)} "
            f"(a folder above is private to another user{f': {covered}' if covered else ''}):"
            f" put the interpreter, uv and the environments' store where every user may "
            f"pass, or run the host as an unprivileged user")


def run(steps: list[dict[str, Any]], cwd: Optional[str] = None) -> list[dict[str, Any]]:
    results = []
    for step in steps:
        try:
            done = subprocess.run(step["argv"], input=step.get("stdin"), capture_output=True,
                                  text=True, timeout=_STEP_TIMEOUT_S, check=False, cwd=cwd)
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
    write, run_as = list(spec["write"]), spec.get("run_as")
    covered = reach([*python_paths(), ENGINE_DIR, *spec.get("reach", ()), *write], run_as)
    landlock = confine(write)
    runs_as, refused = become(run_as)
    if not refused:
        programs = [sys.executable, *(s["argv"][0] for s in spec["steps"]
                                      if os.path.isabs(s["argv"][0]))]
        refused = unreachable(write, programs, covered)
    results = [] if refused else run(spec["steps"], spec.get("cwd"))
    print(json.dumps({"landlock": landlock, "runs_as": runs_as, "refused": refused,
                      "results": results}))
