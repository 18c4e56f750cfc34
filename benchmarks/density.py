"""DENSITY: one Supervisor holding many live workers (250 tenants x 4 small libraries).

    start the workers of the first tenants (200 live), let them settle
        ─► the whole pool's CPU while they sit idle (host threads, zygote, templates, workers)
    start the rest (1,000 live), let them settle
        ─► host descriptors per worker; USS of workers, templates, zygote, host
        ─► the host's threads' CPU while all sit idle, and the pool's
        ─► stats() and pool_stats() over all of them
    warm calls of one worker (t0, bench_dense_a): 1 live vs all live, interleaved
        (routing.alternate: the others stopped / started between batches; each batch
        after the watchdog's trailing work of that transition is done)
    close ─► no process of the pool (within 10 s), no descriptor, no temporary directory left

One library imports numpy: its workers after the first tenant's fork from its
library template (backends/local/templates.py).  CPU is read from /proc schedstat (ns on a
CPU, and how many times a thread ran: a timer that wakes and finds nothing to do
counts); the bench's own thread is left out of the host's figure.
"""
from __future__ import annotations

import compileall
import os
import random
import shutil
import tempfile
import threading
import time
from typing import Any

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local.watchdog import SAMPLE_DELAY_S, SHUTDOWN_GRACE_S
from lcp_sandbox.system.proc import memory, process_tree, tree_memory

from .harness import LIBS, latency_rows, percentile, pin_thread, sched, secs
from .memory import parent_pid
from .routing import SETTLE_S, Others, alternate, ratios, replaced
from .warm import SandboxPath

LIBRARIES = ("bench_dense_a", "bench_dense_b", "bench_dense_c", "bench_dense_np")
TOOLS = {"bench_dense_a": "tool_dense_a_noop", "bench_dense_b": "tool_dense_b_noop",
         "bench_dense_c": "tool_dense_c_noop", "bench_dense_np": "tool_dense_np_sum"}
STATS_REPS = 20


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _tmpdirs() -> set:
    """The engine's temp dirs in this section's own temp folder (another run on the
    machine makes its own in the system's, and must not count here)."""
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("lcp-sandbox-")}


def _alive(pids: list) -> list:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                    out.append(pid)
        except (OSError, IndexError):
            pass
    return out


def _alive_after(pids: list, timeout: float) -> tuple[int, float]:
    """(processes of ``pids`` still alive, seconds until none was), polled up to ``timeout``:
    the zygote SIGKILLs its tree as it exits, and a killed process takes a moment to go."""
    t0 = time.monotonic()
    while _alive(pids) and time.monotonic() - t0 < timeout:
        time.sleep(0.01)
    return len(_alive(pids)), time.monotonic() - t0


def idle_cpu(zygote: int, seconds: float) -> dict:
    """CPU of the host's threads (the bench's own thread left out) and of the pool (the
    zygote's tree: workers, templates, its spare) over ``seconds`` of nobody calling."""
    me, tid = os.getpid(), threading.get_native_id()
    pool = process_tree(zygote)

    def read() -> tuple:
        h = sched(me, exclude_tid=tid) or (0, 0, 0)
        p = [sched(pid) or (0, 0, 0) for pid in pool]
        return h[0], h[2], sum(v[0] for v in p), sum(v[2] for v in p)
    a = read()
    t0 = time.monotonic()
    time.sleep(seconds)
    span = time.monotonic() - t0
    b = read()
    host_ns, host_runs, pool_ns, pool_runs = (y - x for x, y in zip(a, b))
    return {"seconds": span, "processes": len(pool),
            "host_cpu_fraction": host_ns / (span * 1e9), "host_runs": host_runs,
            "pool_cpu_fraction": pool_ns / (span * 1e9), "pool_runs": pool_runs}


def uss_split(sup: Supervisor, zygote: int) -> dict:
    """USS (MB) of the workers' trees, the library templates, the zygote (and its spare),
    this host process; read now, not the engine's samples."""
    workers = [s["pid"] for s in sup.stats() if s["pid"]]
    templates = [t["pid"] for t in sup.pool_stats()["templates"] if t["pid"] and t["state"] == "ok"]
    counted: set = set()
    out = {"workers": 0.0, "templates": 0.0}
    for key, pids in (("workers", workers), ("templates", templates)):
        for pid in pids:
            tree = process_tree(pid)
            counted.update(tree)
            out[key] += tree_memory(pid)[1] / 1048576
    out["zygote"] = sum(memory(p)[1] for p in process_tree(zygote) if p not in counted) / 1048576
    out["host"] = memory(os.getpid())[1] / 1048576
    out["total"] = sum(out.values())
    out["per_worker"] = out["workers"] / max(1, len(workers))
    out["live_workers"], out["template_count"] = len(workers), len(templates)
    return out


def timed(fn: Any, reps: int) -> dict:
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t0) * 1000)
    xs.sort()
    return {"n": reps, "p50": percentile(xs, 50), "p90": percentile(xs, 90), "max": xs[-1], "unit": "ms"}


def run(ctx: Any, prog: Any) -> None:
    cfg = ctx.cfg
    tenants = max(2, cfg.density_tenants)
    idle_tenants = max(1, min(tenants - 1, cfg.density_idle_tenants))
    rounds = max(1, cfg.density_rounds)
    rng = random.Random(cfg.seed + 2)
    folder = ctx.tmp / "density"
    shutil.copytree(LIBS / "density", folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    compileall.compile_dir(str(folder), quiet=1)
    file = {lib: folder / f"{lib}.py" for lib in LIBRARIES}
    groups = [(f"t{i}", [(file[lib], TOOLS[lib]) for lib in LIBRARIES if (i, lib) != (0, LIBRARIES[0])])
              for i in range(tenants)]
    n_all = 1 + sum(len(libs) for _, libs in groups)
    n_idle = 1 + sum(len(libs) for _, libs in groups[:idle_tenants])
    res: dict = {"tenants": tenants, "libraries": list(LIBRARIES), "workers": n_all, "idle_pool_workers": n_idle,
                 "rounds": rounds, "window_s": cfg.density_window_s}
    ctx.result["density"] = res

    system_tmp = tempfile.tempdir
    tempfile.tempdir = tempfile.mkdtemp(prefix="density-tmp-", dir=ctx.tmp)
    ctx.cleanup.append(lambda: setattr(tempfile, "tempdir", system_tmp))    # (on a failure)
    tmp0, fds0 = _tmpdirs(), _fds()
    pin_thread(ctx.all_cpus)        # the zygote, and so every worker, inherits this affinity
    sup = Supervisor()
    ctx.cleanup.append(sup.close)
    pool: list = []
    try:
        sup.start()
        path = SandboxPath("density", SandboxedBinding(tool_files=[file[LIBRARIES[0]]], workspace=ctx.ws,
                                                       supervisor=sup, tenant="t0"), TOOLS[LIBRARIES[0]], {},
                           LIBRARIES[0])
        pid = path.pid()
        zygote = parent_pid(pid)        # the library's first worker: forked by the zygote itself
        fds1 = _fds()
        others = Others(sup, ctx.ws, groups)
        start_s = [others.start(idle_tenants)]
        time.sleep(SAMPLE_DELAY_S + SETTLE_S)      # the watchdog's after-call samples taken
        res["idle_pool"] = idle_cpu(zygote, cfg.density_idle_s)
        prog.step("density", f"{n_idle} idle workers measured")
        start_s.append(others.start())
        live = sup.pool_stats()["live_workers"]
        res["answered"] = live
        res["start_s"] = sum(start_s)
        res["start_ms_per_worker"] = sum(start_s) * 1000 / (n_all - 1)
        time.sleep(SAMPLE_DELAY_S + SETTLE_S)
        fds = _fds()
        res["fds"] = {"before": fds0, "one_live": fds1, "all_live": fds,
                      "per_worker": (fds - fds1) / (n_all - 1),
                      "open_files_soft_limit": sup.pool_stats()["open_files"]["soft"]}
        res["uss_mb"] = uss_split(sup, zygote)
        res["idle_all"] = idle_cpu(zygote, cfg.density_idle_s)
        res["stats_ms"] = timed(sup.stats, STATS_REPS)
        res["pool_stats_ms"] = timed(sup.pool_stats, STATS_REPS)
        pool = process_tree(zygote)
        prog.step("density", f"{live} live workers measured")
        transitions: dict = {}
        # settled: the watchdog's after-call samples and retiring workers' graces are past
        samples, seen, cpu = alternate(ctx, prog, "density", path, others, rounds, cfg.density_calls,
                                       cfg.density_window_s, rng, transitions, SHUTDOWN_GRACE_S + SETTLE_S)
        # Right after a burst of calls: metrics() reads counters; stats() then reads /proc
        # for every worker called since its last sample.
        res["after_burst_ms"] = {"metrics": timed(sup.metrics, STATS_REPS),
                                 "stats": timed(sup.stats, 1)}
        replaced(path, pid, "t0")
        res["transitions_s"] = {k: secs(v) for k, v in transitions.items()}
    finally:
        t0 = time.perf_counter()
        sup.close()
        close_s = time.perf_counter() - t0
    rows = latency_rows(samples, ctx.overhead_ns, "one", "one", (50, 90, 99), cpu)
    labels = {"one": "1 live worker in the pool", "many": f"{n_all} live workers ({tenants} tenants x 4 libraries)"}
    for cond, row in rows.items():
        row.update(label=labels[cond], live_workers_seen=seen[cond])
    alive, gone_s = _alive_after(pool, 10.0)
    res.update(rows=rows, ratio=ratios(rows), close_s=close_s, processes_gone_s=gone_s,
               left={"processes": alive, "fds": _fds() - fds0, "tmpdirs": len(_tmpdirs() - tmp0)})
    tempfile.tempdir = system_tmp
    prog.step("density", "closed")
