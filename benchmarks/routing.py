"""ROUTING: a warm call to one worker with 1 live worker in the pool vs N live.

One Supervisor of its own (started while the host thread is unpinned) shared by N/4
tenants' bindings over 4 generated one-tool libraries; the measured worker is
(tenant t0, bench_route_0).  The other N-1 workers are started (new bindings, one
call each) or stopped (their bindings closed: a binding sharing a supervisor stops
its workers) between batches, never while timing; the conditions alternate
(N, 1 | 1, N | N, 1...), so every round has one transition and each condition
follows one half of the time.  A batch is spread over ``routing_window_s`` in runs
of SUB_BATCH calls at random moments: the supervisor's periodic work (its
watchdog's sweeps, whose length grows with the live workers) is sampled at every
phase, not at one that the schedule of the transitions happens to lock onto.
"""
from __future__ import annotations

import compileall
import concurrent.futures
import random
import time
from typing import Any

from lcp_sandbox import SandboxedBinding, Supervisor

from .harness import CpuAccount, latency_rows, pin_process, pin_thread, secs, share
from .warm import SandboxPath

LIBRARIES = 4                # small libraries per tenant
SUB_BATCH = 125              # calls back to back, at a random moment of the window
SETTLE_S = 0.5               # pause after the other workers were started / stopped

LIB_SOURCE = '''"""Generated tool library {j} for the routing benchmark: one tool that does nothing."""


def tool_route{j}_noop() -> dict:
    """Does nothing and returns a tiny result.

    Returns:
        dict: {{"ok": True}}
    """
    return {{"ok": True}}
'''


def run(ctx: Any, prog: Any) -> None:
    cfg = ctx.cfg
    n_many = max(2, cfg.routing_workers)
    n_tenants = -(-n_many // LIBRARIES)
    rounds = max(1, cfg.routing_rounds)
    window = max(0.0, cfg.routing_window_s)
    rng = random.Random(cfg.seed + 1)     # its own: the other sections' orders stay as they were
    host, worker = ctx.placements[ctx.headline]
    folder = ctx.tmp / "routing"
    folder.mkdir()
    files = [folder / f"bench_route_{j}.py" for j in range(LIBRARIES)]
    for j, f in enumerate(files):
        f.write_text(LIB_SOURCE.format(j=j))
    compileall.compile_dir(str(folder), quiet=1)
    # (tenant, library) of every worker but the measured one (t0, bench_route_0)
    others = [(i, j) for i in range(n_tenants) for j in range(LIBRARIES)][1:n_many]
    live_of = {"one": 1, "many": 1 + len(others)}

    pin_thread(ctx.all_cpus)        # the zygote, and so every worker, inherits this affinity
    sup = Supervisor()
    ctx.cleanup.append(sup.close)
    try:
        sup.start()
        path = SandboxPath("routing", SandboxedBinding(tool_files=[files[0]], workspace=ctx.ws, supervisor=sup,
                                                       tenant="t0"), "tool_route0_noop", {}, "bench_route_0")
        pid = path.pid()
        started: list = []           # the other workers' bindings while they live

        def one_call(call: tuple) -> None:
            b, tool = call
            r = b.execute_tool(tool, {})
            if r.get("status_code") != 200:
                raise RuntimeError(f"{tool} failed for tenant {b.tenant}: {r.get('error')}")

        def start_others() -> float:
            calls = []
            for i in sorted({i for i, _ in others}):
                libs = [j for t, j in others if t == i]
                b = SandboxedBinding(tool_files=[files[j] for j in libs], workspace=ctx.ws, supervisor=sup,
                                     tenant=f"t{i}")
                started.append(b)
                calls += [(b, f"tool_route{j}_noop") for j in libs]
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(4) as ex:
                list(ex.map(one_call, calls))
            return time.perf_counter() - t0

        def stop_others() -> float:
            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda b: b.close(), started))
            started.clear()
            return time.perf_counter() - t0

        transitions: dict = {"start_others": [start_others()], "stop_others": []}
        time.sleep(SETTLE_S)
        prog.step("routing", f"{n_many} workers started")
        samples: dict = {c: [] for c in live_of}
        seen: dict = {c: set() for c in live_of}
        cpu = CpuAccount()
        state = "many"
        try:
            for r in range(rounds):
                for cond in (("many", "one") if r % 2 == 0 else ("one", "many")):
                    if cond != state:
                        pin_thread(ctx.all_cpus)
                        if cond == "many":
                            transitions["start_others"].append(start_others())
                        else:
                            transitions["stop_others"].append(stop_others())
                        state = cond
                        time.sleep(SETTLE_S)     # the zygote's spare forked again...
                    live = sup.pool_stats()["live_workers"]
                    seen[cond].add(live)
                    if live != live_of[cond]:
                        raise RuntimeError(f"{live} live workers where {live_of[cond]} were expected")
                    n = share(cfg.routing_calls, rounds, r)
                    if n <= 0:
                        continue
                    pin_thread(host)
                    pin_process(pid, worker)
                    k = -(-n // SUB_BATCH)
                    offsets = sorted(rng.uniform(0.0, window) for _ in range(k))
                    xs: list = []
                    start = time.perf_counter()
                    for i, off in enumerate(offsets):
                        delay = start + off - time.perf_counter()
                        if delay > 0:
                            time.sleep(delay)
                        path.run(path.warmup)   # untimed: the first calls after a pause are slower
                        xs += cpu.batch(cond, [pid], path.run, share(n, k, i))
                    samples[cond].append((r, xs))
                    prog.step("routing", f"round {r + 1}/{rounds} {live_of[cond]} live")
        finally:
            pin_thread(ctx.all_cpus)
            pin_process(pid, ctx.all_cpus)
        measured = next((s for s in sup.stats(tenant="t0") if s["library"] == "bench_route_0"), {})
        if measured.get("pid") != pid or measured.get("restarts"):
            raise RuntimeError(f"the measured worker was replaced during the run ({measured})")
    finally:
        sup.close()

    rows = latency_rows(samples, ctx.overhead_ns, "one", "one", (50, 90, 99), cpu)
    labels = {"one": "1 live worker in the pool",
              "many": f"{live_of['many']} live workers ({n_tenants} tenants x {LIBRARIES} libraries"
                      + (")" if live_of["many"] == 200 else "; the full run uses 200)")}
    for cond, row in rows.items():
        row.update(label=labels[cond], live_workers=live_of[cond], live_workers_seen=sorted(seen[cond]))
    many = rows["many"]
    ctx.result["routing"] = {
        "workers": live_of["many"], "tenants": n_tenants, "libraries": LIBRARIES, "rounds": rounds,
        "window_s": window, "sub_batch": SUB_BATCH, "settle_s": SETTLE_S,
        "placement": ctx.headline, "host_cpus": sorted(host) if host else None,
        "worker_cpus": sorted(worker) if worker else None,
        "measured": {"tenant": "t0", "library": "bench_route_0", "tool": path.tool, "pid": pid,
                     "calls": measured.get("calls"), "restarts": measured.get("restarts")},
        "rows": rows,
        "ratio": {f"p{q}{s}": many[f"x_one_p{q}{s}"] for q in (50, 90, 99) for s in ("", "_paired")},
        "transitions_s": {k: secs(v) for k, v in transitions.items() if v},
    }
    prog.step("routing", "closed")
