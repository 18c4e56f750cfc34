"""The command line: ``lcp-sandbox bench`` and ``python -m benchmarks`` (same options)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

from .config import SKIPPABLE

DESCRIPTION = ("cold, warm, routing, throughput, memory and discovery figures of lcp_sandbox, with the "
               "baselines measured in the same run and every row as a ratio")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", nargs="?", default=None,
                   help="a tools folder of your own: its --tool gets rows next to the bundled bench_noop")
    p.add_argument("--tool", default=None, help="tool of FOLDER to benchmark (default: the first without "
                                                "required parameters)")
    p.add_argument("--params", default="{}", help="JSON parameters for --tool")
    p.add_argument("--calls", type=int, default=None, help="warm calls per path and placement (default 10000)")
    p.add_argument("--quick", action="store_true", help="a smaller budget (about a third of the time)")
    p.add_argument("--json", dest="json_path", default=None, help="write every number (and sample) here")
    p.add_argument("--plot", dest="plot_path", default=None, help="write a PNG here (needs matplotlib: the "
                                                                  "'plot' extra)")
    p.add_argument("--rounds", type=int, default=None, help="warm rounds (paths interleaved in each)")
    p.add_argument("--cold", dest="cold_reps", type=int, default=None, help="fresh starts per cold path")
    p.add_argument("--duration", dest="duration_s", type=float, default=None,
                   help="throughput: seconds per measurement")
    p.add_argument("--mem-calls", dest="mem_calls", type=int, default=None,
                   help="memory: calls before the second reading (default 25000)")
    p.add_argument("--discovery-files", dest="discovery_files", type=int, default=None)
    p.add_argument("--subprocess-calls", dest="subprocess_calls", type=int, default=None)
    p.add_argument("--routing-workers", dest="routing_workers", type=int, default=None,
                   help="routing: live workers in the large pool (default 200, --quick 40; 4 per tenant)")
    p.add_argument("--cpus", default=None, help="HOST,WORKER CPUs for the pinned figures (default: the first two)")
    p.add_argument("--skip", default="", help=f"comma-separated: {','.join(SKIPPABLE)}")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--check", action="store_true", help="exit with status 1 when a target is missed")


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        params = json.loads(args.params)
    except json.JSONDecodeError as exc:
        print(f"--params is not valid JSON: {exc}", file=sys.stderr)
        return 2
    skip = tuple(s.strip() for s in args.skip.split(",") if s.strip())
    bad = [s for s in skip if s not in SKIPPABLE]
    if bad:
        print(f"--skip: unknown {', '.join(bad)} (known: {', '.join(SKIPPABLE)})", file=sys.stderr)
        return 2
    over = {k: getattr(args, k) for k in ("rounds", "cold_reps", "duration_s", "mem_calls",
                                          "discovery_files", "subprocess_calls", "routing_workers", "seed")
            if getattr(args, k) is not None}
    if args.cpus:
        try:
            host, worker = (int(x) for x in args.cpus.split(","))
        except ValueError:
            print("--cpus takes two CPU numbers: HOST,WORKER", file=sys.stderr)
            return 2
        over["cpus"] = (host, worker)
    from .runner import run_bench
    result = run_bench(args.folder, args.tool, params, calls=args.calls, quick=args.quick,
                       json_path=args.json_path, plot_path=args.plot_path,
                       progress=not args.no_progress, out=sys.stdout, skip=skip, **over)
    for what in ("json_path", "plot_path"):
        if result["meta"].get(what):
            print(f"wrote {result['meta'][what]}")
    if args.check and any(t["met"] is False for t in result["targets"]):
        return 1
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on the ``lcp-sandbox`` command line."""
    p = subparsers.add_parser("bench", help="warm / routing / cold / throughput / memory / discovery figures, with "
                                            "baselines and the targets' ratios")
    add_arguments(p)
    p.set_defaults(fn=cmd_bench)
    return p


def main(argv: Optional[list] = None) -> int:
    """``python -m benchmarks`` (also ``python -m benchmarks.run``)."""
    import logging
    parser = argparse.ArgumentParser(prog="lcp-sandbox bench", description=DESCRIPTION,
                                     allow_abbrev=False)
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    return cmd_bench(args)
