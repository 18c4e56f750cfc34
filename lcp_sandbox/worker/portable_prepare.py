"""What a worker does before tool code runs, with only what every OS has.

    set_environment(env)    the environment made exactly INIT's (both paths)
    environment_of(init)    INIT's environment plus the library's own ``env`` (both paths)
    prepare(init)           a spawned worker where Linux's mechanisms do not exist (macOS,
                            Windows): the environment, the process limits the OS has
                            (``resource``: RLIMIT_DATA is refused on recent macOS, nothing on
                            Windows: there the host puts the worker in a Job Object), and a
                            report that says what is not in force.  On Linux every worker,
                            spawned or forked, runs worker/confine/'s prepare() instead.

The host refuses a confined worker on such a system unless it asked for
``confine="best-effort"`` (backends/local/platforms.py): this prepare() is what runs then.
Written to portable APIs; it runs on this project's machines (Linux) only in tests
that call it directly.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from .. import protocol as P


def set_environment(env: dict) -> None:
    """Make the environment exactly ``env`` (bytes names and values, as INIT carries
    them; str ones are encoded), touching only what differs: most of it is usually
    the zygote's allowlisted environment already (putenv is not free in a process
    that was just forked), and os.environb spares encoding every name and value."""
    # Windows: str names and values (untested)
    if not os.supports_bytes_environ:
        env = {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
        os.environ.clear()
        os.environ.update(env)
        return
    if env and type(next(iter(env))) is not bytes:
        env = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    current = os.environb
    for key in [k for k in current if k not in env]:
        del current[key]
    get = current.get
    for key, value in env.items():
        if get(key) != value:
            current[key] = value


def use_temp_dir(path: str) -> None:
    """Make ``path`` the worker's temp dir: TMPDIR, and tempfile's cached choice where
    tempfile is imported already (a template's library may have used it).  A spawned
    worker starts without tempfile (about 5 ms of its start): its first use reads TMPDIR."""
    os.environ["TMPDIR"] = path
    tempfile: Any = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = path


def environment_of(init: P.Init) -> dict:
    """The environment INIT gives the worker: the host's (filtered when confined) and
    the library's own ``env`` over it."""
    extra = init.limits.get("env") or {}
    own = {os.fsencode(str(k)): os.fsencode(str(v)) for k, v in extra.items()}
    return {**(init.env or {}), **own}


def prepare(init: P.Init) -> dict:
    """Environment and limits of a spawned worker on a system without Linux's
    confinement; what is in force, for the host's stats()."""
    lim, conf = init.limits, init.confine
    if init.env is not None:
        set_environment(environment_of(init))
    missing = f"unavailable (not on {sys.platform})"
    report = {"env": "host environment" if conf is None else
              "clean (allowlist" + (" + library env)" if lim.get("env") else ")"),
              "network": "host network" if lim.get("network", True) else missing,
              "filesystem": missing if conf is not None else "unrestricted",
              "processes": missing if conf is not None else "not scoped (not confined)",
              "privileges": "the host's (" + ("not confined)" if conf is None else missing + ")"),
              "unix_sockets": "not blocked (not confined)" if conf is None else missing,
              "syscalls": "not confined" if conf is None else missing}
    if conf is not None and init.tmpdir:
        use_temp_dir(init.tmpdir)
    try:
        from .rlimits import apply_in_worker
    # Windows: no resource module.
    except ImportError:
        return report
    apply_in_worker(lim)
    return report
