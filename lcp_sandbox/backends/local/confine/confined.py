"""Confined workers and the templates they may share, host side (local/templates.py asks).

A confined worker's rights depend on its tenant only through its root and its temp dir;
everything else (uid, network, environment, read set, system calls) is the library's.
A *confined template* applies all of that once, before it imports (worker/template.py):

    Supervisor(tenants_root=T): roots beneath T may start from a shared template
        why_fresh()    templates off, no T declared, a root outside T  ─► fresh, and why
        untrusted()    code registered at run time, "trusted_import": false, files
                       beneath T  ─► never imported in a template: the *base* (the same
                       template without a library) forks it, it imports after its layer
        compiled_by_host()  (every worker, confined or not) the files compiled once by the
                       host, sent in INIT, unless untrusted(): the host compiles no file it
                       would not import in a template
        key()          what its workers share: files (library only), sys.path, the
                       environment, network, read set, run_as (per-tenant: one template
                       for every tenant, each worker takes its own uid), system calls, T,
                       test switches, best effort or not
        template_init()  the INIT a template is made with: T as its root (a Landlock layer
                       writing beneath T and beneath its temp-dir parent), nothing of a tenant

Each worker forked from one stacks its own layer (its root, its own temp dir beneath the
template's parent, the same read set): it reaches what a fresh confined worker reaches.
The import of a library template runs with write access beneath T: the host trusts its
own tool folders at import, never code registered at run time, never files a tenant
could have written (beneath T), and never a library marked ``"trusted_import": false``.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from .... import protocol as P
from ....core.code_cache import compiled
from ....core.limits import Limits
from ....core.policy import BEST_EFFORT, DEFAULT_RUN_AS, PER_TENANT, path_within
from .temp_dirs import TMP_PREFIX, give_made_dir, made_dir

# The library name of a template without a library.
BASE = "(base)"


def why_fresh(tenants_root: Optional[str], limits: Limits, init: P.Init) -> str:
    """Why a confined worker starts fresh ("" when a shared template may fork it)."""
    if limits.template is False:
        return "templates off for this library"
    if limits.max_processes:
        return "max_processes: a worker of its own pids cgroup starts fresh"
    if limits.disk_mb:
        return "disk_mb: a root on a file system of its own starts fresh"
    if isinstance(limits.network, dict):
        return "a network policy: a worker of its own network namespace starts fresh"
    if tenants_root is None:
        return "confined, and the host declared no tenants_root"
    root = os.path.realpath((init.confine or {})["root"])
    if not path_within(root, tenants_root):
        return "confined, its root is outside tenants_root"
    return ""


def untrusted(limits: Limits, init: P.Init, tenants_root: Optional[str]) -> str:
    """Why the library must not be imported in a shared template ("" when it may)."""
    if not init.files:
        return "code registered at run time imports after its own confinement"
    if limits.trusted_import is False:
        return "not trusted at import: it imports after its own confinement"
    if tenants_root and any(path_within(os.path.realpath(f), tenants_root) for f in init.files):
        return "its files lie beneath tenants_root (a tenant could have written them)"
    return ""


def compiled_by_host(init: P.Init, limits: Limits, tenants_root: Optional[str]) -> P.Init:
    """``init`` with its files as the host compiled them (core/code_cache.py), when the host
    trusts them at import as it would in a template: what a tenant could have written, or
    what is not trusted at import, its worker compiles, never the host."""
    if untrusted(limits, init, tenants_root):
        return init
    return init._replace(code=[compiled(f) for f in init.files])


def key(init: P.Init, tenants_root: str, library: bool) -> tuple[Any, ...]:
    """What the workers of one confined template share (library False: its base's)."""
    conf, lim = init.confine or {}, init.limits
    files: tuple[Any, ...] = ()
    if library:
        stats = [(f, os.stat(f)) for f in init.files]
        files = tuple((f, st.st_mtime_ns, st.st_size) for f, st in stats)
    calls = lim.get("syscalls") or {}
    return (init.library if library else BASE, files, "confined", tuple(init.sys_path or ()),
            tuple(sorted((init.env or {}).items())),
            tuple(sorted((str(k), str(v)) for k, v in (lim.get("env") or {}).items())),
            bool(lim.get("network", True)), tuple(conf.get("read_paths", ())),
            PER_TENANT if conf.get("per_tenant") else tuple(conf["run_as"]),
            tuple(sorted(calls.get("allow", ()))),
            bool(calls.get("allow_dangerous")), tenants_root, tuple(init.disabled or ()),
            lim.get("confine") == BEST_EFFORT)


def template_init(init: P.Init, tenants_root: str, library: bool) -> P.Init:
    """The INIT of a confined template (its temp dir is set when it is made)."""
    conf = init.confine or {}
    # run_as="per-tenant": the template is DEFAULT_RUN_AS's, and keeps the right to give
    # each worker its tenant's uid behind a key (worker/confine/handoff.py)
    per_tenant = bool(conf.get("per_tenant"))
    return init._replace(library=init.library if library else BASE,
                         files=list(init.files) if library else [], source=None, configs={},
                         code=init.code if library else None,
                         handlers=0, tmpdir=None,
                         confine={"root": tenants_root, "read_paths": conf.get("read_paths", []),
                                  "run_as": list(DEFAULT_RUN_AS) if per_tenant else
                                  conf["run_as"], "handoff": per_tenant})


def tmp_parent(run_as: tuple[int, int], uids_apart: bool = False) -> str:
    """The folder the temp dirs of one template's workers are made in: its uid's (the
    template's own temp dir, for its import); removed by the host with the template.
    ``uids_apart`` (its workers take their tenants' uids): others may pass, not list."""
    path = made_dir(TMP_PREFIX + "tpl-")
    give_made_dir(path, run_as, 0o711 if uids_apart else None)
    return path
