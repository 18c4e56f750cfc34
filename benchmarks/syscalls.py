"""SYSCALLS: what the system call allowlist of a confined worker costs.

    rounds, the two kinds in a fresh random order in each:
        cold   a new tenant's confined worker, first call of a plain library
               filter on  /  filter off (lcp_sandbox.testing.protections_off while it starts)
        warm   one confined worker of each kind, kept: a batch of ``calls`` warm calls of
               tool_noop each, the host thread and both workers pinned apart when there
               are two CPUs (host on one, the workers on the other)
    Ratios are within this run; the warm one also paired by round (median over rounds
    of the two batches' p50 ratio: outside load spoils a round, not the figure).

Run alone:  python -m benchmarks.syscalls [rounds] [calls]
"""
from __future__ import annotations

import gc
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Any, Optional

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.testing import protections_off

from .harness import paired_ratio, percentile, pin_thread, ratio, summarize

LIB = '''
def tool_noop() -> dict:
    """Does nothing."""
    return {"success": True, "output": None}
'''
KINDS = ("filter", "no_filter")


def _binding(sup: Supervisor, lib: str, root: str, tenant: str) -> SandboxedBinding:
    ws = os.path.join(root, tenant)
    os.makedirs(ws, exist_ok=True)
    return SandboxedBinding(tools_folders=[lib], workspace=ws, workspace_root=ws, supervisor=sup,
                            tenant=tenant, confine="best-effort")   # (no_filter: True refuses)


def _first_call(b: SandboxedBinding, kind: str) -> float:
    """A new confined worker's first call, with or without the allowlist."""
    switches = ("syscalls",) if kind == "no_filter" else ()
    with protections_off(b.supervisor, *switches):
        b.list_tools()
        t0 = time.perf_counter()
        res = b.execute_tool("tool_noop", {})
        elapsed = time.perf_counter() - t0
    assert res["status_code"] == 200, res
    state = b.stats()[0]["protections"]["syscalls"]
    assert state.startswith("allowlist") == (kind == "filter"), state
    return elapsed


def measure(rounds: int = 20, calls: int = 2000, seed: int = 1,
            cpus: Optional[tuple] = None) -> dict:
    tmp = tempfile.mkdtemp(prefix="lcp-bench-sc-")
    os.chmod(tmp, 0o711)                       # confined workers run as another uid
    all_cpus = set(os.sched_getaffinity(0))
    host_cpu, worker_cpu = cpus or (sorted(all_cpus)[:2] if len(all_cpus) >= 2 else (None, None))
    try:
        lib = os.path.join(tmp, "lib")
        os.makedirs(lib)
        os.chmod(lib, 0o755)
        with open(os.path.join(lib, "bench_sc_noop.py"), "w") as f:
            f.write(LIB)
        rng = random.Random(seed)
        cold: dict = {k: [] for k in KINDS}
        warm_p50: dict = {k: {} for k in KINDS}
        warm_all: dict = {k: [] for k in KINDS}
        with Supervisor(confine=True) as sup:
            sup.start()
            warm = {k: _binding(sup, lib, tmp, f"warm-{k}") for k in KINDS}
            for k, b in warm.items():
                _first_call(b, k)
                if worker_cpu is not None:
                    os.sched_setaffinity(b.stats()[0]["pid"], {worker_cpu})
            if host_cpu is not None:
                pin_thread({host_cpu})
            try:
                for r in range(rounds):
                    order = list(KINDS)
                    rng.shuffle(order)
                    for k in order:
                        gc.collect()
                        b = _binding(sup, lib, tmp, f"cold-{k}-{r}")
                        cold[k].append(_first_call(b, k))
                        b.close()
                    rng.shuffle(order)
                    for k in order:
                        call, xs = warm[k].execute_tool, []
                        for _ in range(calls):
                            t0 = time.perf_counter_ns()
                            call("tool_noop", {})
                            xs.append(time.perf_counter_ns() - t0)
                        xs.sort()
                        warm_p50[k][r] = percentile(xs, 50)
                        warm_all[k] += xs
            finally:
                pin_thread(all_cpus)
            states = {k: b.stats()[0]["protections"]["syscalls"] for k, b in warm.items()}
        rows = {f"cold_{k}": summarize(v, 1e-3) for k, v in cold.items()}
        rows.update({f"warm_{k}": summarize(v, 1e3) for k, v in warm_all.items()})
        return {"rows": rows, "states": states, "rounds": rounds, "calls": calls,
                "placement": "split" if host_cpu is not None else "unpinned",
                "warm_ratio": ratio(rows["warm_filter"]["p50"], rows["warm_no_filter"]["p50"]),
                "warm_ratio_paired": paired_ratio(warm_p50["filter"], warm_p50["no_filter"]),
                "cold_ratio": ratio(rows["cold_filter"]["p50"], rows["cold_no_filter"]["p50"])}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(res: dict) -> str:
    out = ["SYSCALLS  confined worker, allowlist on / off          p50      p99",
           f"  ({res['rounds']} rounds interleaved; warm: {res['calls']} calls per kind and "
           f"round, {res['placement']})"]
    labels = {"cold_filter": ("cold first call, filter on", "ms"),
              "cold_no_filter": ("cold first call, filter off", "ms"),
              "warm_filter": ("warm call, filter on", "us"),
              "warm_no_filter": ("warm call, filter off", "us")}
    for k, (label, unit) in labels.items():
        row = res["rows"][k]
        out.append(f"  {label + ' (' + unit + ')':<50} {row['p50']:8.2f} {row['p99']:8.2f}")
    paired = res.get("warm_ratio_paired")
    out.append(f"  warm p50 on / off: {res['warm_ratio']:.3f}x"
               + ("" if paired is None else f" (paired by round {paired:.3f}x)")
               + f"; cold p50 on / off: {res['cold_ratio']:.3f}x")
    out.append(f"  in force: {res['states']['filter']}")
    return "\n".join(out)


def run(ctx: Any, prog: Any) -> None:
    if not ctx.all_cpus:
        raise RuntimeError("no CPU affinity on this platform")
    cpus = ctx.cfg.cpus or None
    ctx.result["syscalls"] = measure(max(4, ctx.cfg.cold_reps), max(500, ctx.cfg.calls // 5),
                                     ctx.cfg.seed, cpus)
    prog.step("syscalls", "done", 0)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    print(render(measure(n, int(sys.argv[2]) if len(sys.argv) > 2 else 2000)))
