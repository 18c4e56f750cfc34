"""COMPILED: a library without a .pyc, compiled once by the host (core/code_cache.py)
against compiled again by each worker that imports it, same run.

    a 40 KB library (150 helper functions and a tool) in a folder of its own, every
    .pyc of it removed before each call; a new tenant's first call in a worker that
    imports the library itself ("template": False), unconfined and confined
    (Supervisor(confine=True): a fresh confined worker, which may not write a .pyc
    beside the library anyway), rounds with the kinds in a fresh random order:
        host     the host's compiled code sent in INIT (compiled once, in a first round
                 of each kind that is not counted, as the supervisors' starts)
        worker   none sent (backends.local.confine.confined.compiled switched off): the worker compiles

Run alone:  python -m benchmarks.compiled [rounds]
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
from lcp_sandbox.backends.local.confine import confined

from .harness import paired_ratio, ratio, summarize

HELPER = '''
def helper_{i}(x: int, y: str = "a") -> dict:
    """Helper {i}."""
    total = 0
    for k in range(x):
        if k % 3 == 0:
            total += k * {i}
        else:
            total -= len(y)
    return {{"i": {i}, "total": total, "y": y.upper()}}
'''
TOOL = '''
def tool_big(x: int = 1) -> dict:
    """A tool of a large library."""
    return {"success": True, "output": helper_1(x)["total"]}
'''
NAME = "bench_big_library"
KINDS = ("open_host", "open_worker", "confined_host", "confined_worker")


def _library(folder: str) -> str:
    os.makedirs(folder)
    os.chmod(folder, 0o755)
    path = os.path.join(folder, NAME + ".py")
    with open(path, "w") as f:
        f.write("".join(HELPER.format(i=i) for i in range(150)) + TOOL)
    os.chmod(path, 0o644)
    return path


def _first_call(sup: Supervisor, folder: str, ws: str, tenant: str, host_code: bool) -> float:
    shutil.rmtree(os.path.join(folder, "__pycache__"), ignore_errors=True)
    b = SandboxedBinding(tools_folders=[folder], workspace=ws, workspace_root=ws, supervisor=sup,
                         tenant=tenant, host_tool_configs={NAME: {"sandbox": {"template": False}}})
    kept = confined.compiled
    if not host_code:
        confined.compiled = lambda path: None                   # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        res = b.execute_tool("tool_big", {})
        elapsed = time.perf_counter() - t0
    finally:
        confined.compiled = kept
        b.close()
    assert res["status_code"] == 200, res
    return elapsed


def measure(rounds: int = 20, seed: int = 1) -> dict:
    tmp = tempfile.mkdtemp(prefix="lcp-bench-compiled-")
    os.chmod(tmp, 0o711)                       # confined workers run as another uid
    try:
        folder = os.path.join(tmp, "lib")
        path = _library(folder)
        rng = random.Random(seed)
        times: dict = {k: {} for k in KINDS}
        with Supervisor() as open_sup, Supervisor(confine=True) as conf_sup:
            sups = {"open": open_sup, "confined": conf_sup}
            # Started, and a first call of each kind not counted (the host compiles then)
            for r in range(-1, rounds):
                order = list(KINDS)
                rng.shuffle(order)
                for k in order:
                    where, who = k.split("_")
                    ws = os.path.join(tmp, f"{k}-{r}")
                    os.makedirs(ws)
                    os.chmod(ws, 0o777)
                    gc.collect()
                    took = _first_call(sups[where], folder, ws, f"{k}-{r}", who == "host")
                    if r >= 0:
                        times[k][r] = took
        rows = {k: summarize(list(v.values()), 1e-3) for k, v in times.items()}
        out: dict = {"rows": rows, "rounds": rounds, "kb": os.path.getsize(path) / 1024}
        for where in ("open", "confined"):
            out[f"{where}_ratio"] = ratio(rows[f"{where}_host"]["p50"], rows[f"{where}_worker"]["p50"])
            out[f"{where}_ratio_paired"] = paired_ratio(times[f"{where}_host"], times[f"{where}_worker"])
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(res: dict) -> str:
    out = [f"COMPILED  a {res['kb']:.0f} KB library without a .pyc, new tenant's first call   p50      p99",
           f"  ({res['rounds']} rounds interleaved; the worker imports it itself)"]
    labels = {"open_host": "unconfined, the host's compiled code",
              "open_worker": "unconfined, the worker compiles",
              "confined_host": "confined, the host's compiled code",
              "confined_worker": "confined, the worker compiles"}
    for k, label in labels.items():
        row = res["rows"][k]
        out.append(f"  {label + ' (ms)':<60} {row['p50']:8.2f} {row['p99']:8.2f}")
    for where in ("open", "confined"):
        out.append(f"  {where}: host's code / worker compiles, p50 {res[f'{where}_ratio']:.2f}x "
                   f"(paired by round {res[f'{where}_ratio_paired']:.2f}x)")
    return "\n".join(out)


def run(ctx: Any, prog: Any) -> None:
    ctx.result["compiled"] = measure(max(4, ctx.cfg.cold_reps), ctx.cfg.seed)
    prog.step("compiled", "done", 0)


if __name__ == "__main__":
    print(render(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 20)))
