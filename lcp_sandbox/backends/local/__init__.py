"""The local backend: ``Supervisor`` and its process machinery on this machine.

    supervisor.py   routing, spawn, lifecycle
    endings.py      what each end of a call means: the worker's fate, the caller's answer
    slot.py         a worker's slot: FIFO lock, counters, quarantine
    process.py      WorkerProcess: the exchange with its deadlines, kill, reap
    zygote.py       the zygote client (forks, reaps, kills), the worker forked ahead
    templates.py    library templates
    watchdog.py     idle retirement, memory samples, limits of running calls
    pool.py         room for workers, the fair queue
    spin.py         spin-then-block windows of warm calls
    handover.py     a confinement root and temp dir made the worker's
    output.py       worker stdout/stderr to logging
    descriptors.py  the host's open-files limit

Host side: nothing here imports lcp_sandbox.worker (the zygote is started as a
fresh interpreter that imports it)."""
from .slot import CrashPolicy
from .supervisor import Supervisor

__all__ = ["CrashPolicy", "Supervisor"]
