"""The local backend: ``Supervisor`` and its process machinery on this machine.

The supervisor, one class in one module, and the worker's life it drives:

    supervisor.py   Supervisor: a call and its ends, a worker's fate, starts, leaving, reports
    slot.py         a worker's slot: FIFO lock, counters, quarantine (CrashPolicy)
    process.py      WorkerProcess: the exchange with its deadlines, kill (KillReason), reap
    spin.py         spin-then-block windows of warm calls
    watchdog.py     idle retirement, memory samples, limits of running calls
    pool.py         room for workers, the fair queue

How workers start:

    platforms.py    the start method's setting; the confinement a system lacks
    zygote.py       the zygote client (forks, reaps, kills), the worker forked ahead
    templates.py    library templates: template, base or fresh per worker
    confined.py     confined templates: which confined workers may share one, their INIT
    spawn.py        the spawn path: a fresh interpreter per worker, spares ahead
    output.py       worker stdout/stderr to logging, rate-limited
    descriptors.py  the host's open-files limit

What the host sets up around a confined worker:

    handover.py     a confinement root and temp dir made the worker's
    tenant_uids.py  run_as="per-tenant": a uid of its own per tenant, kept, given back
    extras.py       what a confined worker may get beyond its root: disk, cgroup, egress
    cgroups.py      a confined worker's pids cgroup (max_processes)
    disks.py        a tenant's root as a file system of its own (disk_mb)
    egress.py       the egress proxy of network policies: dialers, caps, decisions
    egress_conn.py  one connection through the egress proxy: head, decision, relay
    egress_port.py  the egress proxy by port, for workers with no network namespace
    pid_guard.py    the guard of processes where all tenants share one uid (seccomp notify)
    winjob.py       Windows: a worker's Job Object and socket hand-over

Host side: nothing here imports lcp_sandbox.worker (the zygote is started as a
fresh interpreter that imports it)."""
from .slot import CrashPolicy
from .supervisor import Supervisor

__all__ = ["CrashPolicy", "Supervisor"]
