"""SPAWN BURST: new libraries' first calls back to back on the spawn start path.

    the spawn path's supervisor (warm.py's, ``start_method="spawn"``), its reserve settled
        ─► BURST new tenants of bench_noop, one after another, each one's first call timed
        (each needs a fresh interpreter: a spare spawned ahead, or one spawned now)

Beside the COLD section's spawn row (a bare ``multiprocessing`` spawn and its first
result, same run): how the spawn path keeps up when new libraries come faster than one
interpreter starts.  The COLD section's own spawn-path row is spaced out (one start per
round), which a single spare serves.  ``--skip spawn_path`` leaves it out.
"""
from __future__ import annotations

import time
from typing import Any

from lcp_sandbox import SandboxedBinding

from .harness import percentile

BURST = 15                  # new libraries' first calls, one after another
SETTLE_S = 1.0              # before the burst: the reserve spawned since the warm rows


def run(ctx: Any, prog: Any) -> None:
    sup = ctx.sup_spawn
    if sup is None:
        return
    time.sleep(SETTLE_S)
    bindings = [SandboxedBinding(tools_folders=[str(ctx.libs)], workspace=ctx.ws, supervisor=sup,
                                 tenant=f"bench-burst-{i}") for i in range(BURST)]
    ms = []
    try:
        for b in bindings:
            t0 = time.perf_counter()
            r = b.execute_tool("tool_noop", {})
            ms.append((time.perf_counter() - t0) * 1000)
            if r.get("success") is False:
                raise RuntimeError(f"spawn burst: {r.get('error')}")
    finally:
        for b in bindings:
            b.close()
    xs = sorted(ms)
    spawn = ctx.result["cold"].get("spawn", {}).get("p50")
    p50 = percentile(xs, 50)
    ctx.result["spawn_burst"] = {"n": BURST, "ms": ms, "p50": p50, "p90": percentile(xs, 90), "max": xs[-1],
                                 "spawn_p50": spawn, "x_spawn_p50": p50 / spawn if spawn else None}
    prog.step("spawn_burst", "done", 0)


def render(sb: dict) -> list:
    if not sb:
        return []
    ratio = sb.get("x_spawn_p50")
    return [f"SPAWN BURST  {sb['n']} new libraries' first calls back to back on the spawn path (ms): "
            f"p50 {sb['p50']:.1f}, p90 {sb['p90']:.1f}, max {sb['max']:.1f}"
            + (f"; bare spawn p50 {sb['spawn_p50']:.1f}, ratio {ratio:.2f}x" if ratio is not None else ""),
            "  in order: " + " ".join(f"{v:.1f}" for v in sb["ms"])]
