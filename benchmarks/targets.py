"""TARGETS: the issue's ratios, each with its limit and met / missed."""
from __future__ import annotations

from typing import Any, Optional

from .config import TARGETS
from .harness import ratio
from .report import x


def run(ctx: Any) -> None:
    T = TARGETS
    res = ctx.result
    tg = res["targets"]
    pl = ctx.headline
    warm = res["warm"].get(pl, {})
    sb, fl = warm.get("sandbox", {}), warm.get("floor", {})

    def add(name: str, what: str, value: Optional[float], limit: float, op: str, unit: str = "x",
            note: str = "") -> None:
        met = None if value is None else (value <= limit if op == "<=" else
                                          value < limit if op == "<" else value >= limit)
        tg.append({"name": name, "what": what, "value": value, "limit": limit, "op": op,
                   "unit": unit, "met": met, "note": note})

    def paired(q: int) -> str:
        v = sb.get(f"x_floor_p{q}_paired")
        return "" if v is None else f"paired by round: {x(v)}"
    add("warm_p50", f"warm call p50 / floor p50 ({pl})", ratio(sb.get("p50"), fl.get("p50")), T["warm_p50"], "<=",
        note=paired(50))
    add("warm_p99", f"warm call p99 / floor p99 ({pl})", ratio(sb.get("p99"), fl.get("p99")), T["warm_p99"], "<=",
        note=paired(99))
    cold = res["cold"]
    add("cold_vs_spawn", "cold first call p50 / spawn p50",
        ratio(cold.get("sandbox", {}).get("p50"), cold.get("spawn", {}).get("p50")), T["cold_vs_spawn"], "<=")
    tp = res["throughput"]

    def cps(k: int, t: int) -> Optional[float]:
        return next((r["calls_per_s"] for r in tp if r["path"] == "sandbox" and r["tool"] == "tool_cpu"
                     and r["libraries"] == k and r["threads"] == t), None)
    add("parallel", f"2 libraries x 2 threads / 1 x 1 (tool_cpu {ctx.cfg.cpu_ms:g} ms)",
        ratio(cps(2, 2), cps(1, 1)), T["parallel"], ">=")
    mem = {r["key"]: r for r in res["memory"]}
    first = mem.get("small_first", {}).get("uss_mb")
    after = mem.get("small_after", {})
    add("uss_first", "worker USS, small library, after its first call", first, T["uss_mb"], "<=", "MB")
    add("uss_after", f"worker USS, small library, after {after.get('calls', 0):,} calls",
        after.get("uss_mb"), T["uss_mb"], "<=", "MB",
        "" if after.get("calls", 0) >= 25000 else "target is after 25,000 calls")
    d = res["discovery"].get("sandbox")
    nfiles = res["discovery"].get("files", 0)
    note = "" if nfiles == 1000 else "target is for 1,000 files"
    add("discovery_first", f"discovery of {nfiles:,} tool files, first time (p50)",
        d and d["first"]["p50"], T["discovery_first_s"], "<", "s", note)
    add("discovery_again", f"re-discovery of {nfiles:,} unchanged files (p50)",
        d and d["again"]["p50"], T["discovery_again_s"], "<", "s", note)
