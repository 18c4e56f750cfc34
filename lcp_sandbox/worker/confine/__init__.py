"""Confinement of a worker (Linux): clean environment, network namespace, Landlock,
no privileges, a system call allowlist (and with it, no unix sockets with the network off).

Applied once, inside a freshly forked worker, before any tool code runs, in
this order (prepare(), below); each step needs what the later ones give up:

    environment           the host's, or (confined) the allowlisted part the host
                          sent, plus the library's env
    isolate_network()     unshare(CLONE_NEWNET): CAP_SYS_ADMIN as root, else a
                          user namespace (needs /proc writes)
    private_tmpdir()      created as the host's user, owned by the worker's uid-to-be
    make_reachable()      own mount namespace if a folder above a path the worker
                          needs is private to root (mount(2) needs CAP_SYS_ADMIN)
    apply_landlock()      opens its rule paths now, while all are reachable; it can
                          only narrow what follows
    drop_privileges()     bounding set (needs CAP_SETPCAP), ambient, groups, gid,
                          uid, then every capability set to zero
    restrict_syscalls()   seccomp: the allowlist, and with the network off the unix-
                          socket rules (needs no_new_privs; last, so the steps above
                          need none of their calls on the list)

Every step reports whether it took effect; nothing pretends.  The host
shows the report in ``stats()["protections"]``.  Host side (host/handover.py),
hand_over() gives the confinement root to the worker's uid before the worker
starts, and private_tmpdir() makes its temp dir.

    network.py      isolate_network()
    mounts.py       make_reachable()
    landlock.py     apply_landlock()  (its rules are described there)
    privileges.py   drop_privileges()
    seccomp.py      restrict_syscalls()  (the list itself: core/syscalls.py)

"""
from __future__ import annotations

import os
import tempfile

from ... import protocol as P
from ...core.policy import ENGINE_DIR, SWITCHED_OFF, SYSTEM_READ_PATHS, python_paths
from ..portable import environment_of, set_environment  # noqa: F401  (also for loop, template)
from ..rlimits import apply_in_worker
from .landlock import DEVICES, apply_landlock
from .mounts import make_reachable
from .network import isolate_network
from .privileges import drop_privileges
from .seccomp import restrict_syscalls


def prepare(init: P.Init) -> dict:
    """Environment, confinement and limits of this worker, before any tool code runs.

    Returns what is in force, for the host's stats()."""
    lim = init.limits
    conf = init.confine
    extra = lim.get("env")
    if init.env is not None:       # a confined worker's was filtered by the host (allowlist)
        set_environment(environment_of(init))
    report: dict = {"env": "host environment" if conf is None else
                    "clean (allowlist" + (" + library env)" if extra else ")")}
    disabled = set(init.disabled or ())        # lcp_sandbox.testing.protections_off()
    if lim.get("network", True):
        report["network"] = "host network"
    else:
        report["network"] = SWITCHED_OFF if "netns" in disabled else isolate_network()
    if conf is not None:
        # The namespace above and Landlock's rule paths need the host's privileges
        # (as root: CAP_SYS_ADMIN, opening anything); the privileges are dropped after
        # them, seccomp last.  The temp dir was made by the host.
        tmp = init.tmpdir
        assert tmp is not None, "the host makes a confined worker's temp dir before it starts"
        os.environ["TMPDIR"] = tempfile.tempdir = tmp
        ro = [*conf.get("read_paths", ()), *python_paths(), *SYSTEM_READ_PATHS, ENGINE_DIR]
        covered = make_reachable([conf["root"], tmp, *ro], conf.get("run_as"))
        if "landlock" in disabled:
            report["filesystem"] = SWITCHED_OFF
        else:
            report["filesystem"] = apply_landlock([conf["root"], tmp], ro, DEVICES)
        if covered:
            report["filesystem"] += "; " + covered
        report["privileges"] = drop_privileges(conf.get("run_as"))
        wanted = lim.get("syscalls") or {}
        report["syscalls"], report["unix_sockets"] = restrict_syscalls(
            lim.get("network", True), tuple(wanted.get("allow", ())),
            bool(wanted.get("allow_dangerous")), allowlist="syscalls" not in disabled)
    else:
        report["filesystem"] = "unrestricted"
        report["privileges"] = f"the host's (uid {os.geteuid()}, not confined)"
        report["unix_sockets"] = "not blocked (not confined)"
        report["syscalls"] = "not confined"
    apply_in_worker(lim)
    return report
