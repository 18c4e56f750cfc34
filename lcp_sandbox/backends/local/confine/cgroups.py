"""Caps on a confined worker's processes: a pids cgroup of its own (``"max_processes"``).

    make(limit)     a new cgroup below this host's own, pids.max = limit; its folder goes
                    to the worker in INIT (confine["pids_cgroup"]), which moves itself there
                    in prepare(), as root, before any tool code (worker/confine/caps.py)
    remove(path)    when the worker is gone (the host's record, never a worker's word)

The pids controller counts processes and threads: a tool's fork() or a new thread past
the limit fails with EAGAIN inside it, other workers are untouched.  cgroup v1 (a
hierarchy with the pids controller) and v2 (the controller enabled for this host's cgroup
or enabled now in its subtree) are both used; unavailable means refused (503) unless the
host said confine="best-effort".
"""
from __future__ import annotations

import functools
import os
import uuid
from typing import TYPE_CHECKING, Optional

from .... import protocol as P

if TYPE_CHECKING:
    from ..slot import Slot


@functools.lru_cache(maxsize=1)
def _parent() -> tuple[Optional[str], str]:
    """(the folder this host's worker cgroups go in, None when there is none; why not)."""
    mounts = {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fstype, _, options = (right.split() + ["", "", ""])[:3]
                if fstype == "cgroup" and "pids" in options.split(","):
                    mounts["v1"] = left.split()[4]
                elif fstype == "cgroup2":
                    mounts.setdefault("v2", left.split()[4])
        with open("/proc/self/cgroup") as f:
            own = dict(line.rstrip("\n").split(":", 2)[1:] for line in f if line.count(":") >= 2)
    except OSError as exc:
        return None, f"cannot read the cgroups of this host ({exc})"
    if "v1" in mounts and "pids" in own:
        return _host_folder(os.path.join(mounts["v1"], own["pids"].lstrip("/")), v2=False)
    if "v2" in mounts and "" in own:
        return _host_folder(os.path.join(mounts["v2"], own[""].lstrip("/")), v2=True)
    return None, "no pids cgroup controller is mounted (cgroup v1 pids, or cgroup v2)"


def _host_folder(base: str, v2: bool) -> tuple[Optional[str], str]:
    """This host's folder for worker cgroups below ``base`` (its own cgroup), made now."""
    folder = os.path.join(base, f"lcp-sandbox-{os.getpid()}")
    try:
        if v2:
            with open(os.path.join(base, "cgroup.controllers")) as f:
                if "pids" not in f.read().split():
                    return None, f"cgroup v2: the pids controller is not delegated to {base}"
        os.makedirs(folder, exist_ok=True)
        if v2:
            with open(os.path.join(folder, "cgroup.subtree_control"), "w") as f:
                f.write("+pids")
    except OSError as exc:
        return None, (f"cannot make a pids cgroup below {base} ({exc.strerror or exc}): a root "
                      f"host, or a cgroup v2 subtree delegated to this user, provides one")
    return folder, ""


def make(limit: int) -> str:
    """A pids cgroup for one worker, at most ``limit`` processes and threads (OSError: why
    there is none)."""
    parent, why = _parent()
    if parent is None:
        raise OSError(why)
    path = os.path.join(parent, f"w-{uuid.uuid4().hex[:12]}")
    os.mkdir(path)
    try:
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(int(limit)))
    except OSError:
        remove(path)
        raise
    return path


def remove(path: Optional[str]) -> None:
    """Remove a worker's cgroup (its processes are gone; a straggler keeps it: left)."""
    if path:
        try:
            os.rmdir(path)
        except OSError:
            pass


class WorkerCgroups:
    """A supervisor's worker cgroups: one made for each worker with max_processes, removed
    when its worker is gone (a worker still ending keeps it until a later start or close)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def give(self, init: P.Init, slot: "Slot") -> P.Init:
        """The INIT of ``slot``'s next worker with its own pids cgroup, or why there is none
        (the worker then says max_processes is not in force)."""
        for path in [p for p in self.paths if p != slot.cgroup]:
            remove(path)
            if not os.path.isdir(path):
                self.paths.remove(path)
        try:
            slot.cgroup = make(slot.limits.max_processes or 0)
        except OSError as exc:
            return init._replace(confine={**(init.confine or {}), "pids_cgroup": None,
                                          "pids_why": str(exc)})
        self.paths.append(slot.cgroup)
        return init._replace(confine={**(init.confine or {}), "pids_cgroup": slot.cgroup})

    def close(self) -> None:
        for path in self.paths:
            remove(path)
        parent = _parent()[0]
        if self.paths and parent is not None:
            try:
                # Another supervisor's workers keep it.
                os.rmdir(parent)
                _parent.cache_clear()
            except OSError:
                pass
