"""SPAWN BURST: new libraries' first calls back to back on the spawn start path.

    BURSTS times: a spawn-path supervisor of its own (``start_method="spawn"``), started
    and left SETTLE_S to spawn its reserve
        ─► BURST new tenants of bench_noop, one after another, each one's first call timed
        (each needs a fresh interpreter: a spare that is up, else the first to come up)
        ─► closed
    the row: the median of the bursts' p50s

Beside the COLD section's spawn row (a bare ``multiprocessing`` spawn and its first
result, same run): how the spawn path keeps up when new libraries come faster than one
interpreter starts.  One burst swings with whatever else the machine runs during its
second; each burst starts from the same state (a new supervisor: a grown reserve would
serve a second burst on the same one from its spares).  The COLD section's own
spawn-path row is spaced out (one start per round), which the spares serve.
``--skip spawn_path`` leaves it out.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

from lcp_sandbox import SandboxedBinding, Supervisor

from .harness import percentile

BURST = 15                  # new libraries' first calls, one after another
SETTLE_S = 1.5              # before each burst: its supervisor's reserve spawned


def run(ctx: Any, prog: Any) -> None:
    if ctx.sup_spawn is None:
        return
    runs = []
    for i in range(ctx.cfg.spawn_bursts):
        runs.append(_burst(ctx, i))
        prog.step("spawn_burst", f"burst {i + 1} of {ctx.cfg.spawn_bursts}", 0)
    every = sorted(v for ms in runs for v in ms)
    p50s = [percentile(sorted(ms), 50) for ms in runs]
    spawn = ctx.result["cold"].get("spawn", {}).get("p50")
    p50 = statistics.median(p50s)
    ctx.result["spawn_burst"] = {"n": BURST, "bursts": len(runs), "ms": runs, "p50s": p50s,
                                 "p50": p50, "p90": percentile(every, 90), "max": every[-1],
                                 "spawn_p50": spawn, "x_spawn_p50": p50 / spawn if spawn else None}


def _burst(ctx: Any, i: int) -> list[float]:
    """One burst on a new spawn-path supervisor: each first call's milliseconds, in order."""
    sup = Supervisor(start_method="spawn")
    try:
        sup.start()
        time.sleep(SETTLE_S)
        bindings = [SandboxedBinding(tools_folders=[str(ctx.libs)], workspace=ctx.ws, supervisor=sup,
                                     tenant=f"bench-burst-{i}-{n}") for n in range(BURST)]
        ms = []
        for b in bindings:
            t0 = time.perf_counter()
            r = b.execute_tool("tool_noop", {})
            ms.append((time.perf_counter() - t0) * 1000)
            if r.get("success") is False:
                raise RuntimeError(f"spawn burst: {r.get('error')}")
        return ms
    finally:
        sup.close()


def render(sb: dict) -> list:
    if not sb:
        return []
    ratio = sb.get("x_spawn_p50")
    return [f"SPAWN BURST  {sb['n']} new libraries' first calls back to back on the spawn path (ms), "
            f"{sb['bursts']} bursts: p50 {sb['p50']:.1f} (the median of the bursts' p50s: "
            + ", ".join(f"{v:.1f}" for v in sb["p50s"]) + f"), p90 {sb['p90']:.1f}, max {sb['max']:.1f}"
            + (f"; bare spawn p50 {sb['spawn_p50']:.1f}, ratio {ratio:.2f}x" if ratio is not None else ""),
            *(f"  burst {i + 1} in order: " + " ".join(f"{v:.1f}" for v in ms)
              for i, ms in enumerate(sb["ms"]))]
