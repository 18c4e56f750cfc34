"""THROUGHPUT: calls per second, K libraries (one worker each) driven by T host threads.

    rounds × configurations (tool, libraries K, host threads T) in random order
"""
from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any, Callable

from lcp_sandbox import SandboxedBinding

from .harness import percentile, pin_thread, ratio, sched

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
    blocks.append(sandbox_block("tool_cpu", cpu, libs, "cpu", ((1, 1), (1, 2), (2, 2))))
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
        for c in ctx.rng.sample(configs, len(configs)):
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
                         "host_threads": sum(x["host_wait_ns"] for x in xs) / calls / 1000.0,
                         "workers": (sum(x["workers_wait_ns"] for x in xs) / calls / 1000.0
                                     if path == "sandbox" else None)}})
    for row in rows:
        base = next(x for x in rows if x["path"] == row["path"] and x["tool"] == row["tool"]
                    and x["libraries"] == 1 and x["threads"] == 1)
        row["x_one"] = ratio(row["calls_per_s"], base["calls_per_s"])
    ctx.result["throughput"] = rows
    for b in bindings:
        b.close()


def _driven(fns: list, bindings: list) -> Callable[[float], dict]:
    """A configuration's measurement: its threads drive ``fns``; its workers are the bindings'."""
    def measure(duration: float) -> dict:
        return drive(fns, duration, [st["pid"] for b in bindings for st in b.stats() if st["pid"]])
    return measure
