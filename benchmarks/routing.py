"""ROUTING: a warm call to one worker with 1 live worker in the pool vs N live.

One Supervisor of its own (started while the host thread is unpinned) shared by N/4
tenants' bindings over 4 generated one-tool libraries; the measured worker is
(tenant t0, bench_route_0).  The other N-1 workers are started (new bindings, one
call each) or stopped (their bindings closed: a binding sharing a supervisor stops
its workers) between batches, never while timing; the conditions alternate
(N, 1 | 1, N | N, 1...), so every round has one transition and each condition
follows one half of the time.  A batch is spread over ``routing_window_s`` in runs
of SUB_BATCH calls at random moments: any periodic work of the supervisor is
sampled at every phase, not at one that the schedule of the transitions happens
to lock onto.

``Others`` and ``alternate`` are shared with the density section (1 vs 1,000 live).
"""
from __future__ import annotations

import compileall
import concurrent.futures
import random
import time
from pathlib import Path
from typing import Any, Callable, Optional

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


class Others:
    """The other workers of a shared Supervisor, in groups: one binding per group (a
    tenant and its libraries), one call per library starts them, closing it stops them."""

    def __init__(self, sup: Supervisor, ws: str, groups: list[tuple[str, list[tuple[Path, str]]]]) -> None:
        self.sup, self.ws, self.groups = sup, ws, groups     # [(tenant, [(file, tool), ...]), ...]
        self.bindings: dict[int, SandboxedBinding] = {}     # group index -> its binding while it lives

    def live(self) -> int:
        return sum(len(self.groups[i][1]) for i in self.bindings)

    def start(self, upto: Optional[int] = None) -> float:
        """Start the groups (the first ``upto``) not running; seconds it took."""
        calls = []
        for i, (tenant, libs) in enumerate(self.groups[:upto]):
            if i not in self.bindings:
                b = self.bindings[i] = SandboxedBinding(tool_files=[f for f, _ in libs], workspace=self.ws,
                                                        supervisor=self.sup, tenant=tenant)
                calls += [(b, tool) for _, tool in libs]
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            failed = [r for r in ex.map(_one_call, calls) if r]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(calls)} workers did not answer their first call: {failed[0]}")
        return time.perf_counter() - t0

    def stop(self, keep: int = 0) -> float:
        """Stop every group but the first ``keep``; seconds it took."""
        going = [self.bindings.pop(i) for i in sorted(self.bindings) if i >= keep]
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda b: b.close(), going))
        return time.perf_counter() - t0


def _one_call(call: tuple) -> str:
    b, tool = call
    r = b.execute_tool(tool, {})
    return "" if r.get("status_code") == 200 else f"{tool} failed for tenant {b.tenant}: {r.get('error')}"


def alternate(ctx: Any, prog: Any, section: str, path: SandboxPath, others: Others, rounds: int,
              calls: int, window: float, rng: random.Random, transitions: dict,
              settle: float = SETTLE_S) -> tuple[dict, dict, CpuAccount]:
    """Warm calls of ``path`` with its supervisor holding 1 live worker ("one") or 1 +
    all ``others`` ("many", the state it starts in); ``rounds`` rounds, the conditions
    alternating, each batch spread over ``window`` in runs of SUB_BATCH calls at random
    moments, ``settle`` seconds after each start / stop of the others.  Returns (samples
    per condition, live counts seen, the CPU account); ``transitions`` gets the seconds
    each start / stop took."""
    host, worker = ctx.placements[ctx.headline]
    pid = path.pid()
    live_of = {"one": 1, "many": 1 + sum(len(libs) for _, libs in others.groups)}
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
                        transitions.setdefault("start_others", []).append(others.start())
                    else:
                        transitions.setdefault("stop_others", []).append(others.stop())
                    state = cond
                    time.sleep(settle)       # the zygote's spare forked again...
                live = others.sup.pool_stats()["live_workers"]
                seen[cond].add(live)
                if live != live_of[cond]:
                    raise RuntimeError(f"{live} live workers where {live_of[cond]} were expected")
                n = share(calls, rounds, r)
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
                prog.step(section, f"round {r + 1}/{rounds} {live_of[cond]} live")
    finally:
        pin_thread(ctx.all_cpus)
        pin_process(pid, ctx.all_cpus)
    return samples, {c: sorted(v) for c, v in seen.items()}, cpu


def replaced(path: SandboxPath, pid: Optional[int], tenant: str) -> dict:
    """The measured worker's stats(); raises if it is not the one measured from the start."""
    measured = next((s for s in path.b.supervisor.stats(tenant=tenant) if s["library"] == path.library), {})
    if measured.get("pid") != pid or measured.get("restarts"):
        raise RuntimeError(f"the measured worker was replaced during the run ({measured})")
    return measured


def ratios(rows: dict) -> dict:
    many = rows["many"]
    return {f"p{q}{s}": many[f"x_one_p{q}{s}"] for q in (50, 90, 99) for s in ("", "_paired")}


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
    groups = [(f"t{i}", [(files[j], f"tool_route{j}_noop") for t, j in others if t == i])
              for i in sorted({i for i, _ in others})]
    live_of = {"one": 1, "many": 1 + len(others)}

    pin_thread(ctx.all_cpus)        # the zygote, and so every worker, inherits this affinity
    sup = Supervisor()
    ctx.cleanup.append(sup.close)
    try:
        sup.start()
        path = SandboxPath("routing", SandboxedBinding(tool_files=[files[0]], workspace=ctx.ws, supervisor=sup,
                                                       tenant="t0"), "tool_route0_noop", {}, "bench_route_0")
        pid = path.pid()
        pool = Others(sup, ctx.ws, groups)
        transitions: dict = {"start_others": [pool.start()], "stop_others": []}
        time.sleep(SETTLE_S)
        prog.step("routing", f"{n_many} workers started")
        samples, seen, cpu = alternate(ctx, prog, "routing", path, pool, rounds, cfg.routing_calls, window, rng,
                                       transitions)
        measured = replaced(path, pid, "t0")
    finally:
        sup.close()

    rows = latency_rows(samples, ctx.overhead_ns, "one", "one", (50, 90, 99), cpu)
    labels = {"one": "1 live worker in the pool",
              "many": f"{live_of['many']} live workers ({n_tenants} tenants x {LIBRARIES} libraries"
                      + (")" if live_of["many"] == 200 else "; the full run uses 200)")}
    for cond, row in rows.items():
        row.update(label=labels[cond], live_workers=live_of[cond], live_workers_seen=seen[cond])
    ctx.result["routing"] = {
        "workers": live_of["many"], "tenants": n_tenants, "libraries": LIBRARIES, "rounds": rounds,
        "window_s": window, "sub_batch": SUB_BATCH, "settle_s": SETTLE_S,
        "placement": ctx.headline, "host_cpus": sorted(host) if host else None,
        "worker_cpus": sorted(worker) if worker else None,
        "measured": {"tenant": "t0", "library": "bench_route_0", "tool": path.tool, "pid": pid,
                     "calls": measured.get("calls"), "restarts": measured.get("restarts")},
        "rows": rows, "ratio": ratios(rows),
        "transitions_s": {k: secs(v) for k, v in transitions.items() if v},
    }
    prog.step("routing", "closed")
