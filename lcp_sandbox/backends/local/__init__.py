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
    zygote_client.py the zygote client (forks, reaps, kills), the worker forked ahead
    templates.py    library templates: template, base or fresh per worker
    spawn.py        the spawn path: a fresh interpreter per worker, spares ahead
    spawned_child.py one spawned process: BOOTED, its interrupt, kill, output and end
    winjob.py       Windows: a spawned worker's Job Object and socket hand-over
    output.py       worker stdout/stderr to logging, rate-limited
    descriptors.py  the host's open-files limit

What the host sets up around a confined worker: confine/ (its own index), as
worker/confine/ is what the worker applies to itself.

Host side: nothing here imports lcp_sandbox.worker (the zygote is started as a
fresh interpreter that imports it)."""
from .slot import CrashPolicy
from .supervisor import Supervisor

__all__ = ["CrashPolicy", "Supervisor"]
