"""Confinement of a worker (Linux): clean environment, network namespace, Landlock,
no privileges, a system call allowlist (and with it, no unix sockets with the network off).

Applied once, inside a freshly forked worker, before any tool code runs, in
this order (prepare(), below); each step needs what the later ones give up:

    environment           the host's, or (confined) the allowlisted part the host
                          sent, plus the library's env
    isolate_network()     unshare(CLONE_NEWNET): CAP_SYS_ADMIN as root, else a
                          user namespace (needs /proc writes)
    dial_from_namespace() (a network policy) dials the host's egress proxy, hands it a
                          listener on its namespace's loopback, announces HTTP_PROXY...;
                          with no namespace of its own, policy_network() by port: the
                          proxy's TCP port, held by Landlock's TCP rules (after
                          apply_landlock(), hold_tcp()) and a filter that refuses new
                          sockets (start_supply(), last: sockets come from the proxy)
    private_tmpdir()      created as the host's user, owned by the worker's uid-to-be
    join_pids_cgroup()    (max_processes) into the pids cgroup the host made for it
    own_root()            (a fresh worker, in a PID namespace of its own: the zygote
                          forked it so) its own mount namespace, its root a read-only
                          tmpfs of the allowed paths, a /proc of its namespace
    make_reachable()      (otherwise) own mount namespace if a folder above a path the
                          worker needs is private to root (mount(2) needs CAP_SYS_ADMIN)
    apply_landlock()      opens its rule paths now, while all are reachable; it can
                          only narrow what follows
    drop_privileges()     bounding set (needs CAP_SETPCAP), ambient, groups, gid,
                          uid, then every capability set to zero (a per-tenant template
                          keeps CAP_SETUID/CAP_SETGID permitted, behind handoff.py's key)
    restrict_syscalls()   seccomp: the allowlist, and with the network off the unix-
                          socket rules (needs no_new_privs; last, so the steps above
                          need none of their calls on the list); with the network on
                          and no Landlock scope, no unix socket at all.  With the network
                          off and no namespace of its own, this filter is its network
    _by_uid()             where neither its own namespaces nor Landlock hold processes
                          (and files), a uid of its tenant's own does (apart.py), checked
    _guard()              where none of those holds processes (one uid for all tenants),
                          the host's guard: a filter whose listener the host holds
                          (guard.py; handed over after prepare(), before READY)

A confined template (worker/template.py) runs all of it but the limits with the tenants'
folder as its root (prepare(shared=True)) and keeps its report in SHARED; a worker forked
from it only stacks its own Landlock layer (_stack(): its root, its temp dir), with the
ruleset its spare prepared while it waited (ready_layer()); of a per-tenant template, it
first takes its tenant's uid (handoff.take()).

Every step reports whether it took effect; nothing pretends.  The host
shows the report in ``stats()["protections"]``.  Host side (backends/local/confine/handover.py),
hand_over() gives the confinement root to the worker's uid before the worker
starts, and private_tmpdir() makes its temp dir.

    network.py      isolate_network()
    egress_dial.py  dial_from_namespace(), or by port policy_network() and hold_tcp()
    caps.py         join_pids_cgroup(), cap_tenant_processes(); disk_state(): its root's disk
    mounts.py       make_reachable()
    landlock.py     apply_landlock()  (its rules are described there)
    privileges.py   drop_privileges()
    handoff.py      lock(), take(): a uid per tenant from one shared template
    apart.py        processes_by_uid(), files_by_uid(): tenants apart by their uids
    guard.py        install(), hand_over(): the host's guard of processes
    seccomp.py      restrict_syscalls()  (the list itself: core/syscalls.py)

"""
from __future__ import annotations

import os
from typing import Any

from ... import protocol as P
from ...core.policy import (
    ENGINE_DIR,
    LANDLOCK_ABI_SWITCH,
    SWITCHED_OFF,
    SYSTEM_READ_PATHS,
    python_paths,
)

# Imported from here by loop and template too.
from ..portable_prepare import environment_of, set_environment, use_temp_dir  # noqa: F401
from ..rlimits import apply_in_worker
from .apart import (
    files_by_uid,
    holds_own_uid,
    namespaces_refused,
    private_umask,
    processes_by_uid,
)
from .caps import cap_tenant_processes, disk_state, join_pids_cgroup
from .egress_dial import BY_PORT, hold_placeholders, hold_tcp, policy_network, start_supply
from .guard import REPORT as GUARD_REPORT
from .guard import install as install_guard
from .guard import installed as guard_installed
from .handoff import KEEP, lock, take
from .landlock import ABI_CAP, DEVICES, SCOPED, add_rules, apply_landlock, enforce, open_ruleset
from .mounts import make_reachable, own_root
from .network import isolate_network
from .privileges import drop_privileges
from .seccomp import (
    ON_WITHOUT_UNIX,
    POLICY,
    POLICY_BY_PORT,
    UNIX_BLOCKED,
    Network,
    restrict_syscalls,
)

#: In a confined template (worker/template.py): what it applied for every worker it forks
#: (its report, and "covered": make_reachable()'s).  A worker forked from it finds it here
#: and only stacks its own Landlock layer.
SHARED: dict[str, Any] = {}


#: In a spare of a confined template: its own Landlock ruleset, read rules added while it
#: waits (ready_layer()), ((fd, ABI), the read set); INIT adds its root and temp dir.
_LAYER: list[tuple[tuple[int, int], list[str]]] = []


def ready_layer() -> tuple[int, ...]:
    """(A spare of a confined template, while it waits for its descriptors) open this
    process's own ruleset and add the read rules its layer will have (the template's
    read set, with its own /proc/self): its INIT then only adds its root and temp dir.
    Returns the descriptor to keep open (none when there is nothing to prepare)."""
    conf = SHARED.get("confine")
    if not isinstance(conf, dict) or str(SHARED.get("filesystem")).startswith(SWITCHED_OFF):
        return ()
    got = open_ruleset()
    if isinstance(got, str):
        return ()
    ro = _read_only(conf)
    add_rules(*got, (), ro, DEVICES)
    _LAYER[:] = [(got, ro)]
    return (got[0],)


def _read_only(conf: dict, shared: bool = False) -> list[str]:
    """What a confined worker reads.  A template's layer reads all of /proc instead of
    /proc/self: a rule holds an inode, and each worker's /proc/self is its own (its own
    layer narrows that to it)."""
    system = [("/proc" if shared and p == "/proc/self" else p) for p in SYSTEM_READ_PATHS]
    return [*conf.get("read_paths", ()), *python_paths(), *system, ENGINE_DIR]


def prepare(init: P.Init, shared: bool = False) -> dict:
    """Environment, confinement and limits of this worker, before any tool code runs.

    ``shared``: this is a confined template (worker/template.py), whose INIT names the
    tenants' folder as its root and the temp-dir parent of its workers as its temp dir;
    it applies everything but the process limits, and keeps its report in SHARED.
    Returns what is in force, for the host's stats()."""
    lim = init.limits
    conf = init.confine
    extra = lim.get("env")
    # A confined worker's was filtered by the host (allowlist)
    if init.env is not None:
        set_environment(environment_of(init))
    report: dict = {"env": "host environment" if conf is None else
                    "clean (allowlist" + (" + library env)" if extra else ")")}
    # lcp_sandbox.testing.protections_off()
    disabled = set(init.disabled or ())
    # (not a spare's rehearsal, unconfined: a template's cap holds for its spares)
    if conf is not None:
        ABI_CAP[:] = [int(d.split("=")[1]) for d in disabled
                      if d.startswith(LANDLOCK_ABI_SWITCH)]
    if conf is not None and SHARED:
        # Forked from a confined template.
        _stack(init, report, disabled)
        apply_in_worker(lim)
        return report
    network = lim.get("network", True)
    if network is True:
        report["network"] = "host network"
    else:
        report["network"] = _own_network(conf, network, disabled)
        if isinstance(network, dict):
            report["network"] = _egress(conf, network, report["network"], disabled)
            if report["network"].startswith("policy") and init.tmpdir:
                report["network"] += hold_placeholders((conf or {}).get("egress") or {},
                                                       init.tmpdir)
    if conf is not None:
        _confine(init, report, disabled, shared)
        if shared:
            SHARED.update(report)
            SHARED["confine"] = {"read_paths": list(conf.get("read_paths", ()))}
            return report
    else:
        report["filesystem"] = "unrestricted"
        report["processes"] = "not scoped (not confined)"
        report["privileges"] = f"the host's (uid {os.geteuid()}, not confined)"
        report["unix_sockets"] = "not blocked (not confined)"
        report["syscalls"] = "not confined"
    apply_in_worker(lim)
    start_supply()
    return report


def _confine(init: P.Init, report: dict, disabled: set, shared: bool) -> None:
    """A fresh worker's (or a template's) confinement, in the package docstring's order."""
    lim, conf = init.limits, init.confine or {}
    # The namespace above and Landlock's rule paths need the host's privileges
    # (as root: CAP_SYS_ADMIN, opening anything); the privileges are dropped after
    # them, seccomp last.  The temp dir was made by the host.
    tmp = init.tmpdir
    assert tmp is not None, "the host makes a confined worker's temp dir before it starts"
    use_temp_dir(tmp)
    # First: its tree's processes, all counted.
    if lim.get("max_processes"):
        report["max_processes"] = join_pids_cgroup(conf.get("pids_cgroup"),
                                                   lim["max_processes"], conf.get("pids_why"))
    if lim.get("disk_mb"):
        report["disk"] = disk_state(conf["root"], lim["disk_mb"])
    ro = _read_only(conf, shared)
    # (asked before anything narrows: its own filter refuses unshare too)
    report["namespaces"] = "refused" if namespaces_refused() else "allowed"
    # in a PID namespace of its own (a fresh worker): its own /proc and its own root
    own, root = own_root([conf["root"], tmp], ro, DEVICES, build="root" not in disabled)
    covered = "" if root.startswith("own root") else make_reachable(
        [conf["root"], tmp, *ro], conf.get("run_as"))
    landlock = (SWITCHED_OFF if "landlock" in disabled
                else apply_landlock([conf["root"], tmp], ro, DEVICES))
    if BY_PORT:
        report["network"] = hold_tcp(report["network"])
    # Its workers: each tenant's uid.
    handing = shared and bool(conf.get("handoff"))
    report["privileges"] = drop_privileges(conf.get("run_as"), KEEP if handing else 0)
    _cap_tenant(conf, report)
    _restrict(init, report, disabled, scoped=_scoped(landlock))
    by_uid = _by_uid(conf, report, handing, root if root.startswith("own root") else landlock,
                     tmp)
    report["filesystem"] = _filesystem(root, landlock, by_uid[0])
    # (a template only where its fresh workers could have no namespaces of their own)
    guarded = "" if shared and report["namespaces"] != "refused" else _guard(
        conf, own, landlock, by_uid[1], report["unix_sockets"])
    report["processes"] = _processes(own, landlock, by_uid[1], report["unix_sockets"], guarded)
    if covered:
        report["filesystem"] += "; " + covered
    report["covered"] = covered
    if handing and report["privileges"].startswith("uid "):
        why = lock(os.uname().machine)
        if why:
            report["privileges"] = f"failed (the key filter for its workers' uids: {why})"
        else:
            report["handoff"] = "on"


def _guard(conf: dict, own: str, layer: str, by_uid: str, unix: str) -> str:
    """(A fresh worker or a template the host offered its guard: ``conf["pid_guard"]``)
    where nothing else keeps its signals in its own tree (no PID namespace of its own, no
    Landlock scope, no uid of its tenant's own) and its unix rule holds, install the
    filter whose listener goes to the host (guard.py); its report, "" when not installed.
    A template's workers inherit it (_stack()); a template installs it only where a filter
    refuses namespaces (elsewhere its workers start fresh, in namespaces of their own)."""
    if (not conf.get("pid_guard") or own.startswith("own PID namespace:")
            or _scoped(layer) or by_uid.startswith("on") or not unix.startswith("blocked")
            or layer.startswith(SWITCHED_OFF)):
        return ""
    failed = install_guard(os.uname().machine)
    return failed or GUARD_REPORT


def _scoped(filesystem: str) -> bool:
    """Whether a Landlock layer's report (or a filesystem report that carries it) says
    signals and abstract unix sockets are scoped to its domain (ABI 6+)."""
    return filesystem.startswith("on") and SCOPED in filesystem


def _restrict(init: P.Init, report: dict, disabled: set, scoped: bool) -> None:
    """The system call filter.  With the network on and no Landlock scope, no unix socket
    at all (abstract ones would reach the host's and other tenants'); with it off and no
    network namespace of its own, the filter is what keeps it off the network."""
    lim = init.limits
    wanted = lim.get("syscalls") or {}
    network = lim.get("network", True)
    rule: Network = ((POLICY_BY_PORT if BY_PORT else POLICY) if isinstance(network, dict) else
                     ON_WITHOUT_UNIX if network is True and not scoped else network)
    report["syscalls"], report["unix_sockets"] = restrict_syscalls(
        rule, tuple(wanted.get("allow", ())), bool(wanted.get("allow_dangerous")),
        allowlist="syscalls" not in disabled)
    if network is False:
        report["network"] = _off_by_filter(report["network"], report["unix_sockets"])


def _off_by_filter(namespace: str, unix: str) -> str:
    """A network-off confined worker's network report: its own namespace (isolate_network()'s
    report, ``namespace``) as a second layer where there is one; where there is none, the
    system call filter (``unix``, its socket rule's report) is the protection."""
    if unix != UNIX_BLOCKED:
        return namespace
    if namespace.startswith("on"):
        return namespace[:-1] + "; the system call filter: no socket but NETLINK_ROUTE)"
    return ("on (the system call filter: no socket but AF_NETLINK's NETLINK_ROUTE, so no TCP, "
            f"UDP, raw or unix socket; own network namespace: {namespace})")


def _by_uid(conf: dict, report: dict, handing: bool, layer: str,
            tmp: str) -> tuple[str, str]:
    """(files, processes) kept apart by a uid of the tenant's own (apart.py), where Landlock
    and its own namespaces do not hold them (``layer``: its own root's report, else its
    Landlock layer's); ("", "") when they are not asked of the uid.  A template that hands
    each worker its tenant's uid (``handing``) says its workers will hold them."""
    own = holds_own_uid(conf, report["privileges"])
    if own:
        private_umask()
    if layer.startswith("own root") or _scoped(layer):
        return "", ""
    # Files by the uid alone only where a root of its own cannot be had (a filter refuses
    # namespaces): a fresh worker's own root hides the host's world-readable files too.
    files_wanted = not layer.startswith("on") and report.get("namespaces") == "refused"
    if handing and report["privileges"].startswith("uid "):
        pending = ("on (each of its workers takes its tenant's own uid, no capabilities, and "
                   "checks it)")
        return (pending if files_wanted else ""), pending
    if not own:
        return "", ""
    files = (files_by_uid(conf["root"], tmp, [*python_paths(), ENGINE_DIR],
                          conf.get("open_siblings", ["(not checked by the host)"]))
             if files_wanted else "")
    return files, processes_by_uid()


def _cap_tenant(conf: dict, report: dict) -> None:
    """With a uid of its tenant's own (and not before: the count is the uid's), the
    tenant's process cap."""
    if conf.get("nproc") and report["privileges"].startswith("uid "):
        report["tenant_processes"] = cap_tenant_processes(conf["nproc"])


def _own_network(conf: Any, network: Any, disabled: set) -> str:
    """isolate_network()'s report; for a network policy the host sent by port (its egress
    ``no_namespace``: why there is none), that reason, and no namespace is made."""
    egress = (conf or {}).get("egress") if isinstance(network, dict) else None
    if egress and egress.get("no_namespace"):
        return str(egress["no_namespace"])
    return SWITCHED_OFF if "netns" in disabled else isolate_network()


def _egress(conf: Any, rules: dict, namespace: str, disabled: set) -> str:
    """A network policy: the way to the host's egress proxy, in the namespace just made
    (``namespace``: isolate_network()'s report), else by port (egress_dial.py)."""
    egress = (conf or {}).get("egress")
    if not egress:
        return "unavailable (a network policy needs a confined worker, and the host's proxy)"
    count = len(rules.get("allow", ())) + len(rules.get("deny", ()))
    return policy_network(egress, count, namespace, "landlock" in disabled)


def _stack(init: P.Init, report: dict, disabled: set) -> None:
    """A worker forked from a confined template: the template's namespace, privileges
    and system call filter are in force already (inherited, they only narrow); the
    worker adds its own Landlock layer (its root, its temp dir, the same read set), so
    what it reaches is what a fresh worker reaches, and its Landlock domain (signals,
    abstract sockets) is its own, not its siblings'."""
    conf = init.confine or {}
    report.update({k: v for k, v in SHARED.items() if k not in ("env", "confine", "handoff")})
    # First: a tenant's uid, taken with the key.
    if SHARED.get("handoff"):
        report["privileges"] = take(*conf["run_as"])
        _cap_tenant(conf, report)
    tmp = init.tmpdir
    assert tmp is not None, "the host makes a confined worker's temp dir before it starts"
    use_temp_dir(tmp)
    ready, _LAYER[:] = _LAYER[:], []
    ro = _read_only(conf)
    layer = SWITCHED_OFF
    try:
        if "landlock" in disabled:
            pass
        # Its ruleset, read rules added while it waited.
        elif ready and ready[0][1] == ro:
            fd, abi = ready[0][0]
            add_rules(fd, abi, [conf["root"], tmp], (), ())
            layer = enforce(fd, abi)
        else:
            layer = apply_landlock([conf["root"], tmp], ro, DEVICES)
    finally:
        for (fd, _), _ in ready:
            os.close(fd)
    files, processes = _by_uid(conf, report, False, layer, tmp)
    report["processes"] = _processes("", layer, processes, report["unix_sockets"],
                                     GUARD_REPORT if guard_installed() else "")
    report["filesystem"] = _filesystem("", layer, files)
    if "landlock" not in disabled:
        if SHARED.get("covered"):
            report["filesystem"] += "; " + SHARED["covered"]


def _filesystem(root: str, landlock: str, by_uid: str = "") -> str:
    """What a worker reaches of the file system: its own root (own_root()) and Landlock's
    layer, each enough alone; else its uid's own files (``by_uid``: apart.files_by_uid()'s
    report, "" when not asked); either report when none holds."""
    if root.startswith("own root"):
        return f"on ({root}; Landlock: {landlock})"
    if by_uid:
        return f"{by_uid[:-1]}; Landlock: {landlock})" if by_uid.startswith("on") else \
            f"{by_uid}; Landlock: {landlock}"
    return landlock + (f"; {root}" if root else "")


def _processes(own: str, filesystem: str, by_uid: str = "", unix: str = "",
               guarded: str = "") -> str:
    """Whether the worker can reach processes outside its own tree: not in a PID namespace
    of its own (``own``: own_root()'s first report, "" without one), not to signal them
    under Landlock ABI 6's scope (read off its layer's report, ``filesystem``), and not by
    its uid's rights (``by_uid``: apart.processes_by_uid(), "" when it is not its tenant's
    own), nor past the host's guard (``guarded``: _guard()'s report, "" without it).
    Without the scope, nor the abstract unix sockets of others: the system call filter's
    unix rule (``unix``, its report) must hold too."""
    scoped = _scoped(filesystem)
    if not scoped and not unix.startswith("blocked"):
        return ("unavailable (abstract unix sockets of the host and of other tenants within "
                f"reach: no Landlock scope, and the system call filter's unix rule: {unix})")
    sockets = "" if scoped else "; abstract unix sockets: no unix socket at all (the filter)"
    if own.startswith("own PID namespace:"):
        return f"on ({own}" + ("; Landlock scope too)" if scoped else f"{sockets})")
    if scoped:
        return ("on (Landlock scope: no signal nor abstract socket outside its own domain; "
                "no PID namespace: priorities and affinity of itself only, by the system "
                "call filter)")
    if by_uid.startswith("on"):
        return f"{by_uid[:-1]}{sockets})"
    if guarded.startswith("on"):
        return f"{guarded[:-1]}{sockets})"
    why = own or "in no PID namespace of its own"
    if guarded:
        why += f"; the host's guard (seccomp user notification): {guarded}"
    if filesystem.startswith(SWITCHED_OFF):
        return f"{SWITCHED_OFF}; {why}"
    if filesystem.startswith("on"):
        abi = filesystem[len("on (ABI "):].split(")")[0].split(",")[0]
        return (f"unavailable ({why}; Landlock ABI {abi} has no scope: it came with ABI 6, "
                "Linux 6.12; and no uid of its tenant's own)")
    return f"unavailable ({why}; no Landlock layer: {filesystem}; and no uid of its tenant's own)"
