"""TREES: the engine of several checkouts, measured in the same run.

A change that should not move the engine's speed (a refactor) is checked by
running the engine of the tree before it and the tree after it side by side::

    python -m benchmarks.trees BEFORE_DIR AFTER_DIR [--rounds 5] [--calls 3000]

Each round starts one fresh host process per tree, in a new random order, with
that tree's ``lcp_sandbox`` first on ``sys.path``. The host measures, with the
public API only (so any tree of the project can be measured):

    start   a new Supervisor's first call (its zygote's boot and a worker's start)
    first   a new tenant's first call on a supervisor already running
    warm    the median of CALLS calls on a live worker
    uss     the worker's unique memory after those calls

The bench library is this checkout's ``benchmarks/libs/bench_noop.py``, the same
for every tree. The table gives each tree's median over the rounds and, in
parentheses, the median over the rounds of its ratio to the first tree's figure
of the same round.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LIBS = Path(__file__).resolve().parent / "libs"

_HOST = r'''
import json, os, statistics, sys, time
import psutil
from lcp_sandbox import SandboxedBinding, Supervisor

libs, workspace, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
clock = time.perf_counter_ns


def binding(sup, tenant):
    return SandboxedBinding(tools_folders=[libs], workspace=workspace, supervisor=sup,
                            tenant=tenant)


def first_call(sup, tenant):
    b = binding(sup, tenant)
    t0 = clock()
    result = b.execute_tool("tool_noop", {})
    spent = clock() - t0
    assert result["success"], result
    return b, spent


sup = Supervisor()
try:
    start_b, start = first_call(sup, "start")
    first_b, first = first_call(sup, "first")
    call = first_b.execute_tool
    times = []
    for _ in range(calls):
        t0 = clock()
        call("tool_noop", {})
        times.append(clock() - t0)
    pid = next(s["pid"] for s in first_b.stats() if s["library"] == "bench_noop" and s["pid"])
    uss = psutil.Process(pid).memory_full_info().uss
    for b in (start_b, first_b):
        b.close()
finally:
    sup.close()
print(json.dumps({"start": start, "first": first, "warm": statistics.median(times),
                  "uss": uss}))
'''

_UNITS = {"start": ("ms", 1e6), "first": ("ms", 1e6), "warm": ("us", 1e3),
          "uss": ("MB", 1048576)}


def measure(tree: Path, calls: int) -> dict[str, float]:
    """One fresh host process over ``tree``'s engine; its four figures."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    with tempfile.TemporaryDirectory() as workspace:
        out = subprocess.run([sys.executable, "-c", _HOST, str(LIBS), workspace, str(calls)],
                             env=env, capture_output=True, text=True, check=True, cwd=workspace)
    return json.loads(out.stdout.splitlines()[-1])


def table(trees: list[Path], runs: dict[Path, list[dict[str, float]]]) -> str:
    """Each tree's median of the rounds, and the median of its ratios to the first tree's
    figure of the same round (rounds share the machine's state of the moment)."""
    base = runs[trees[0]]
    lines = ["| tree | " + " | ".join(f"{k} ({u})" for k, (u, _) in _UNITS.items()) + " |",
             "|---|" + "---|" * len(_UNITS)]
    for t in trees:
        cells = []
        for k, (_, scale) in _UNITS.items():
            median = statistics.median(r[k] for r in runs[t])
            paired = statistics.median(r[k] / b[k] for r, b in zip(runs[t], base))
            cells.append(f"{median / scale:.3g} ({paired:.2f}x)")
        lines.append(f"| {t.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path, help="checkouts; the first is the base")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000, help="warm calls per round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    trees = [t.resolve() for t in args.trees]
    order = random.Random(args.seed)
    runs: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    for n in range(args.rounds):
        for tree in order.sample(trees, len(trees)):
            runs[tree].append(measure(tree, args.calls))
        print(f"round {n + 1}/{args.rounds} done", file=sys.stderr)
    print(table(trees, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
