"""Command line: ``lcp-sandbox tools | call | demo``."""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Optional

from .binding import SandboxedBinding, bundled_tools_dir


def _public(spec: dict) -> dict:
    return {k: v for k, v in spec.items() if not k.startswith("_")}


def cmd_tools(args: argparse.Namespace) -> int:
    with SandboxedBinding(tools_folders=args.folders) as b:
        specs = b.discover_tools() if args.dynamic else b.discovered_tools
        print(json.dumps([_public(s) for s in specs], indent=2, default=str))
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    try:
        params = json.loads(args.params)
    except json.JSONDecodeError as exc:
        print(f"--params is not valid JSON: {exc}", file=sys.stderr)
        return 2
    with SandboxedBinding(tools_folders=[args.folder], workspace=args.workspace,
                          timeout_s=args.timeout) as b:
        result = b.execute_tool(args.tool, params)
    print(json.dumps(result, indent=2, default=str))
    return 0 if result.get("success") else 1


_CRASHY = textwrap.dedent('''
    """A tool that kills its own process, to show the host survives."""
    def tool_segfault() -> dict:
        """Dereferences a null pointer (SIGSEGV)."""
        import ctypes
        ctypes.string_at(0)
''')


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


def cmd_demo(args: argparse.Namespace) -> int:
    folder = Path(args.folder or bundled_tools_dir())
    print(f"lcp-sandbox demo over {folder}\n")
    with tempfile.TemporaryDirectory() as ws:
        t0 = time.perf_counter()
        b = SandboxedBinding(tools_folders=[folder], workspace=ws)
        print(f"discovered {len(b.discovered_tools)} tools in {_ms(time.perf_counter() - t0)} "
              f"(AST only; no tool code ran in this process)")
        t0 = time.perf_counter()
        b.supervisor.start()
        print(f"zygote (the process that forks workers) started in {_ms(time.perf_counter() - t0)}, "
              f"once per host")
        with b:
            _demo_body(b, ws, args)
    return 0


def _demo_body(b: SandboxedBinding, ws: str, args: argparse.Namespace) -> None:
    calls = _demo_calls(b, ws)
    for name, params in calls:
        lib = b._routes[name].library.name
        fresh = not any(s["library"] == lib and s["pid"] for s in b.stats())
        t0 = time.perf_counter()
        first = b.execute_tool(name, params)
        cold = time.perf_counter() - t0
        warm = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            b.execute_tool(name, params)
            warm.append(time.perf_counter() - t0)
        out = json.dumps(first.get("output"), default=str)
        print(f"\n{name}({json.dumps(params)}) -> status {first['status_code']}: "
              f"{out[:100]}{'...' if len(out) > 100 else ''}")
        first = "cold (worker start + import + call)" if fresh else "first call (worker already running)"
        print(f"   {first}: {_ms(cold)}   warm p50 over {len(warm)} calls: {_ms(statistics.median(warm))}")

    b.register_tool_from_code("segfault", _CRASHY)
    print("\nA tool that segfaults its worker:")
    r = b.execute_tool("tool_segfault", {})
    print(f"   -> status {r['status_code']}: {r['error']}")
    if calls:
        r = b.execute_tool(calls[0][0], calls[0][1])
        print(f"   the host lives on; {calls[0][0]} still answers with status {r['status_code']}")
    print("\nworkers:")
    for s in b.stats():
        print(f"   {s['library']:<20} pid {s['pid']!s:<8} calls {s['calls']:<5} restarts "
              f"{s['restarts']}  rss {s['rss'] / 1048576:.1f} MB  last exit: {s['last_exit']}")


def _demo_calls(b: SandboxedBinding, ws: str) -> list:
    names = {t["name"] for t in b.discovered_tools}
    Path(ws, "notes.txt").write_text("hello from the workspace\n")
    wanted = [("tool_list_files", {}), ("tool_read_file", {"file_name": "notes.txt"}),
              ("tool_execute_query", {"database_name": "demo.db", "query": "SELECT 1 AS one"})]
    if "tool_execute_query" in names:
        import sqlite3
        sqlite3.connect(os.path.join(ws, "demo.db")).close()
    calls = [(n, p) for n, p in wanted if n in names]
    if not calls:   # some other folder: call the tools that need no arguments
        calls = [(t["name"], {}) for t in b.discovered_tools if not t["input_schema"]["required"]][:3]
    return calls


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="lcp-sandbox", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine and tool output")
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("tools", help="print the discovered tool specs as JSON")
    p.add_argument("folders", nargs="+")
    p.add_argument("--dynamic", action="store_true", help="run dynamic prompt providers (in workers)")
    p.set_defaults(fn=cmd_tools)

    p = sub.add_parser("call", help="run one tool call and print the result as JSON")
    p.add_argument("folder")
    p.add_argument("tool")
    p.add_argument("--params", default="{}")
    p.add_argument("--workspace", default=None)
    p.add_argument("--timeout", type=float, default=60.0)
    p.set_defaults(fn=cmd_call)

    p = sub.add_parser("demo", help="discover, call cold then warm, survive a crash")
    p.add_argument("folder", nargs="?", default=None)
    p.add_argument("--calls", type=int, default=200)
    p.set_defaults(fn=cmd_demo)

    root = Path(__file__).resolve().parent.parent       # bench: benchmarks/ of a source checkout
    if (root / "benchmarks" / "__main__.py").is_file() and str(root) not in sys.path:
        sys.path.append(str(root))
    try:
        from benchmarks.cli import add_parser as add_bench
        add_bench(sub)
    except ImportError as exc:                            # an installed package: no benchmarks
        p = sub.add_parser("bench", help="benchmarks (source checkout only)", prefix_chars="\0", add_help=False)
        p.add_argument("args", nargs="*")
        why = (f"lcp-sandbox bench: the benchmarks are not installed ({exc}); run it from a source checkout "
               "(pip install -e . there, or python -m benchmarks)")
        p.set_defaults(fn=lambda args: print(why, file=sys.stderr) or 2)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(levelname)s %(name)s: %(message)s")
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
