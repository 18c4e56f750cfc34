"""THROUGHPUT: calls per second, K libraries (one worker each) driven by T host threads,
and the machine's own ceiling for the same CPU work.

    rounds × blocks in random order × configurations of a block in random order

A block holds the configurations whose ratios are read together, so they run back to
back in every round: the parallel block is the sandbox's ``tool_cpu`` at (K, T) =
(1, 1), (1, 2), (2, 2) and the ceiling: the same ``tool_cpu`` called in a loop in 1
and in 2 processes started from the host, no IPC at all.  What 2 processes give over 1
there is what this machine gives in this run (at most the number of CPUs); the
sandbox's 2 x 2 scaling is read against it.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from lcp_sandbox import SandboxedBinding

from .harness import paired_ratio, percentile, pin_thread, ratio, sched
from .loader import child_code

CEILING_BODY = '''
import sys, time
burn = load_tool_file(sys.argv[1], "lcp_bench_ceiling").tool_cpu
ms = float(sys.argv[2])
clock = time.perf_counter
print("ready", flush=True)
for line in sys.stdin:
    end = clock() + float(line)
    n = 0
    while clock() < end:
        burn(ms)
        n += 1
    print(n, flush=True)
'''


class Ceiling:
    """Processes that call ``tool_cpu`` in a loop on request: the same CPU work as the
    sandbox's rows, with no IPC, no host thread, no engine."""

    def __init__(self, path: str, ms: float, k: int) -> None:
        argv = [sys.executable, "-I", "-c", child_code(CEILING_BODY), path, str(ms)]
        # Each in a session of its own, as the sandbox's workers are: with autogroup scheduling
        # (Linux's default on desktops and many VMs) the CPU is shared between sessions first.
        self.procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       start_new_session=True) for _ in range(k)]
        for p in self.procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a ceiling process did not start")

    def measure(self, k: int, duration: float) -> dict:
        """The first k processes run for ``duration`` s at once: calls per second."""
        procs = self.procs[:k]
        pids = [p.pid for p in procs]
        w0 = sum((sched(pid) or (0, 0))[1] for pid in pids)
        t0 = time.perf_counter()
        for p in procs:
            p.stdin.write(f"{duration}\n")
            p.stdin.flush()
        calls = sum(int(p.stdout.readline()) for p in procs)
        elapsed = time.perf_counter() - t0
        w1 = sum((sched(pid) or (0, 0))[1] for pid in pids)
        return {"calls": calls, "seconds": elapsed, "calls_per_s": calls / elapsed if elapsed else 0.0,
                "host_wait_ns": 0, "workers_wait_ns": w1 - w0}

    def close(self) -> None:
        procs, self.procs = self.procs, []
        for p in procs:
            p.stdin.close()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            p.stdout.close()


def drive(fns: list, duration: float, pids: list) -> dict:
    """Run each fn in its own thread in a loop for ``duration`` s: calls per second, and the
    run-queue wait (ns) of the driving threads and of ``pids`` meanwhile."""
    n = len(fns)
    stop = [False]
    counts, ends, waits = [0] * n, [0.0] * n, [0] * n
    errors: list = []
    barrier = threading.Barrier(n + 1)
    me = os.getpid()

    def loop(i: int) -> None:
        fn = fns[i]
        c = 0
        tid = threading.get_native_id()
        barrier.wait()
        w0 = sched(me, tid=tid)
        try:
            while not stop[0]:
                fn()
                c += 1
        except Exception as exc:                               # noqa: BLE001
            errors.append(exc)
        w1 = sched(me, tid=tid)
        counts[i] = c
        ends[i] = time.perf_counter()
        waits[i] = w1[1] - w0[1] if w0 and w1 else 0

    def workers_wait() -> int:
        return sum((sched(p) or (0, 0))[1] for p in pids)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    ww0 = workers_wait()
    barrier.wait()
    t0 = time.perf_counter()
    time.sleep(duration)
    stop[0] = True
    for t in threads:
        t.join()
    ww1 = workers_wait()
    if errors:
        raise errors[0]
    elapsed = max(ends) - t0
    return {"calls": sum(counts), "seconds": elapsed, "calls_per_s": sum(counts) / elapsed if elapsed else 0.0,
            "host_wait_ns": sum(waits), "workers_wait_ns": ww1 - ww0}


def run(ctx: Any, prog: Any) -> None:
    cfg = ctx.cfg
    pin_thread(ctx.all_cpus)
    bindings: list = []
    blocks: list = []        # [[(path, tool, K, T, measure(duration) -> dict), ...], ...]

    def sandbox_block(tool: str, params: dict, folder: str, tag: str, shapes: tuple) -> list:
        pools = {}
        for k in sorted({k for k, _ in shapes}):
            fns = []
            for i in range(k):
                b = SandboxedBinding(tools_folders=[folder], workspace=ctx.ws, supervisor=ctx.sup,
                                     tenant=f"bench-tp-{tag}{k}-{i}",
                                     **(cfg.binding_kwargs if tag == "user" else {}))
                bindings.append(b)
                ctx.cleanup.append(b.close)
                r = b.execute_tool(tool, dict(params))
                if r.get("status_code") != 200:
                    raise RuntimeError(f"{tool} failed: {r.get('error')}")
                fns.append(lambda b=b: b.execute_tool(tool, params))
            pools[k] = (fns, bindings[-k:])
        return [("sandbox", tool, k, t, _driven([pools[k][0][i % k] for i in range(t)], pools[k][1]))
                for k, t in shapes]

    cpu = {"ms": cfg.cpu_ms}
    libs = str(ctx.libs)
    ceiling = Ceiling(ctx.noop_path, cfg.cpu_ms, 2)
    ctx.cleanup.append(ceiling.close)
    blocks.append(sandbox_block("tool_cpu", cpu, libs, "cpu", ((1, 1), (1, 2), (2, 2)))
                  + [("ceiling", "tool_cpu", k, k, lambda d, k=k: ceiling.measure(k, d)) for k in (1, 2)])
    blocks.append(sandbox_block("tool_noop", {}, libs, "noop", ((1, 1), (2, 2))))
    if ctx.lcp_cls is not None:
        lcp = ctx.lcp_cls(tools_folders=[libs])
        lcp.execute_tool("tool_cpu", dict(cpu))
        blocks.append([("inprocess", "tool_cpu", 1, t,
                        _driven([lambda: lcp.execute_tool("tool_cpu", dict(cpu))] * t, [])) for t in (1, 2)])
    u = ctx.user
    if u:
        blocks.append(sandbox_block(u["tool"], u["params"], u["folder"], "user", ((1, 1), (2, 2))))

    configs = [c for block in blocks for c in block]
    runs: dict = {id(c): [] for c in configs}
    for r in range(max(1, cfg.throughput_rounds)):
        for block in ctx.rng.sample(blocks, len(blocks)):
            for c in ctx.rng.sample(block, len(block)):
                path, tool, k, t, measure = c
                gc.collect()
                runs[id(c)].append(measure(cfg.duration_s))
                prog.step("throughput", f"round {r + 1} {path} {tool} K={k} T={t}")
    rows = []
    for c in configs:
        path, tool, k, t, _ = c
        xs = runs[id(c)]
        calls = sum(x["calls"] for x in xs) or 1
        rows.append({"path": path, "tool": tool, "libraries": k, "threads": t,
                     "calls_per_s": percentile(sorted(x["calls_per_s"] for x in xs), 50), "rounds": xs,
                     "runq_wait_us_per_call": {
                         "host_threads": (sum(x["host_wait_ns"] for x in xs) / calls / 1000.0
                                          if path != "ceiling" else None),
                         "workers": (sum(x["workers_wait_ns"] for x in xs) / calls / 1000.0
                                     if path != "inprocess" else None)}})
    for row in rows:
        base = next(x for x in rows if x["path"] == row["path"] and x["tool"] == row["tool"]
                    and x["libraries"] == 1 and x["threads"] == 1)
        row["x_one"] = ratio(row["calls_per_s"], base["calls_per_s"])
        row["x_one_paired"] = paired_ratio(dict(enumerate(x["calls_per_s"] for x in row["rounds"])),
                                           dict(enumerate(x["calls_per_s"] for x in base["rounds"])))
    ctx.result["throughput"] = rows
    for b in bindings:
        b.close()
    ceiling.close()


def _driven(fns: list, bindings: list) -> Callable[[float], dict]:
    """A configuration's measurement: its threads drive ``fns``; its workers are the bindings'."""
    def measure(duration: float) -> dict:
        return drive(fns, duration, [st["pid"] for b in bindings for st in b.stats() if st["pid"]])
    return measure
