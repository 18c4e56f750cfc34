"""TEMPLATES: a new tenant's first call of a heavy (numpy) library, from the library's
template vs importing it fresh, next to a plain library's cold start; USS per worker kind.

    rounds, in random order within each: a new tenant of
        numpy library, template exists   (start == "template")
        numpy library, "template": False  (each worker imports numpy itself)
        plain library, never run          (a new library file: the zygote's rehearsed spare;
                                           a template is made only for its second worker)
        the same with "template": False   (the same path: checks that templates cost it nothing)
    USS (own pages: private clean + dirty, smaps_rollup) of one worker of each kind after
    its first call, and of the template.  Ratios are within this run.

Run alone:  python -m benchmarks.templates [rounds]
"""
from __future__ import annotations

import gc
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Any

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.system.proc import memory

from .harness import ratio, summarize

NUMPY_LIB = '''
import os, json, csv, decimal
import numpy as np

def tool_np(n: int = 4) -> dict:
    """numpy"""
    return {"success": True, "output": float(np.ones((n, n)).sum())}
'''
PLAIN_LIB = '''
def tool_plain_{i}(x: int = 1) -> dict:
    """plain"""
    return {{"success": True, "output": x}}
'''


def measure(rounds: int = 20, seed: int = 1) -> dict:
    tmp = tempfile.mkdtemp(prefix="lcp-bench-tpl-")
    try:
        np_dir = os.path.join(tmp, "np")
        os.makedirs(np_dir)
        with open(os.path.join(np_dir, "bench_np.py"), "w") as f:
            f.write(NUMPY_LIB)
        ws = os.path.join(tmp, "ws")
        os.makedirs(ws)
        rng = random.Random(seed)
        times: dict = {"template": [], "fresh": [], "plain": [], "plain_off": []}
        uss: dict = {}
        with Supervisor() as sup:
            sup.start()
            for t in ("bench-tpl-0", "bench-tpl-1"):      # the second worker makes the template
                warm = SandboxedBinding(tools_folders=[np_dir], workspace=ws, supervisor=sup, tenant=t)
                assert warm.execute_tool("tool_np", {})["status_code"] == 200
            uss["template_process"] = memory(sup.pool_stats()["templates"][0]["pid"])[1]
            for r in range(rounds):
                kinds = ["template", "fresh", "plain", "plain_off"]
                rng.shuffle(kinds)
                for kind in kinds:
                    gc.collect()
                    if kind.startswith("plain"):
                        d = os.path.join(tmp, f"{kind}{r}")
                        os.makedirs(d)
                        with open(os.path.join(d, f"bench_plain_{r}.py"), "w") as f:
                            f.write(PLAIN_LIB.format(i=r))
                        cfg = {f"bench_plain_{r}": {"sandbox": {"template": False}}} if kind == "plain_off" else None
                        b = SandboxedBinding(tools_folders=[d], workspace=ws, supervisor=sup, tenant=f"{kind}{r}",
                                             host_tool_configs=cfg)
                        tool = f"tool_plain_{r}"
                    else:
                        cfg = {"bench_np": {"sandbox": {"template": False}}} if kind == "fresh" else None
                        b = SandboxedBinding(tools_folders=[np_dir], workspace=ws, supervisor=sup,
                                             tenant=f"{kind}{r}", host_tool_configs=cfg)
                        tool = "tool_np"
                    b.list_tools()
                    t0 = time.perf_counter()
                    res = b.execute_tool(tool, {})
                    t1 = time.perf_counter()
                    assert res["status_code"] == 200, res
                    times[kind].append(t1 - t0)
                    st = b.stats()[0]
                    assert (st["start"] == "template") == (kind == "template"), st["start"]
                    if r == rounds - 1:
                        uss[kind] = memory(st["pid"])[1]
                    b.close()
        rows = {k: {**summarize(v, 1e-3), "samples_ms": [round(x * 1e3, 4) for x in v]} for k, v in times.items()}
        return {"rows": rows, "uss_mb": {k: v / 1048576 for k, v in uss.items()},
                "fresh_over_template": ratio(rows["fresh"]["p50"], rows["template"]["p50"])}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(res: dict) -> str:
    out = ["TEMPLATES  first call of a new tenant (ms)      p50      p99"]
    labels = {"template": "numpy library, from its template", "fresh": "numpy library, fresh import",
              "plain": "plain library, never run (zygote)",
              "plain_off": "  the same, templates off"}
    for k, label in labels.items():
        row = res["rows"][k]
        out.append(f"  {label:<40} {row['p50']:8.2f} {row['p99']:8.2f}")
    out.append(f"  fresh import / template (p50): {res['fresh_over_template']:.1f}x")
    out.append("  USS after the first call (MB): " + ", ".join(
        f"{k} {v:.2f}" for k, v in res["uss_mb"].items() if k != "template_process")
        + f"; the template process itself {res['uss_mb'].get('template_process', 0):.2f}")
    return "\n".join(out)


def run(ctx: Any, prog: Any) -> None:
    ctx.result["templates"] = measure(max(3, ctx.cfg.cold_reps), ctx.cfg.seed)
    prog.step("templates", "done", 0)


if __name__ == "__main__":
    print(render(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 20)))
