"""The `lcp-sandbox` command line: its commands, and the three it runs itself.

  lcp-sandbox tools FOLDER...          the discovered tool specs, as JSON
  lcp-sandbox call FOLDER TOOL ...     run one tool call, print its result as JSON
  lcp-sandbox demo [FOLDER] ...        discovery, cold and warm calls, a crash survived
  lcp-sandbox bench ...                speed figures against baselines
  lcp-sandbox serve-mcp FOLDER...      serve the tools to MCP clients (stdio or Streamable HTTP)
  lcp-sandbox envs build|list|prune    the libraries' own environments (their dependencies)
  lcp-sandbox disks list|prune ROOT    the tenant disks (disk_mb) under a tenants_root

-v / --verbose (before or after the subcommand) logs the engine and the tools' output.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Optional

from ..binding.locations import bundled_tools_dir
from ..core import strict_json
from ..core.policy import ENGINE_DIR
from .disks_cli import add_parser as add_disks
from .envs_cli import add_parser as add_envs
from .lollms import SandboxedBinding
from .mcp_cli import add_parser as add_serve_mcp


class UsageError(Exception):
    """A mistake in the command line: one line on stderr, exit status 2."""


def _public(spec: dict) -> dict:
    return {k: v for k, v in spec.items() if not k.startswith("_")}


def _folder(path: str) -> str:
    if not os.path.isdir(path):
        why = "is not a folder" if os.path.exists(path) else "does not exist"
        raise UsageError(f"tools folder {path!r} {why}")
    return path


def _params(text: str, what: str = "--params") -> dict:
    try:
        params = strict_json.loads(text)
    except strict_json.DuplicateKey as exc:
        raise UsageError(f"{what}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(params, dict):
        kind = {list: "an array", str: "a string", int: "a number", float: "a number",
                bool: "a boolean", type(None): "null"}.get(type(params), type(params).__name__)
        raise UsageError(f"{what} must be a JSON object of parameter names to values, "
                         f"not {kind}: {text}")
    return params


def cmd_tools(args: argparse.Namespace) -> int:
    """``lcp-sandbox tools``: print the specs of the folders' tools as JSON."""
    for folder in args.folders:
        _folder(folder)
    with SandboxedBinding(tools_folders=args.folders) as b:
        specs = b.discover_tools() if args.dynamic else b.discovered_tools
        print(json.dumps([_public(s) for s in specs], indent=2, default=str))
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    """``lcp-sandbox call``: run one call, print its result; 0 if it succeeded, else 1."""
    params = _params(args.params)
    with SandboxedBinding(tools_folders=[_folder(args.folder)], workspace=args.workspace,
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
    """``lcp-sandbox demo``: discovery, timed calls (bundled or named), a crash survived."""
    bundled = bundled_tools_dir()
    folder = Path(_folder(args.folder)) if args.folder else bundled
    own_folder = folder.resolve() != bundled.resolve()
    named = [(name, _params(text, f"--params of --tool {name}"))
             for name, text in args.tool_calls or []]
    print(f"lcp-sandbox demo over {folder}\n")
    with tempfile.TemporaryDirectory() as ws:
        t0 = time.perf_counter()
        b = SandboxedBinding(tools_folders=[folder], workspace=ws)
        print(f"discovered {len(b.discovered_tools)} tools in {_ms(time.perf_counter() - t0)} "
              f"(AST only; no tool code ran in this process)")
        t0 = time.perf_counter()
        b.supervisor.start()
        print(f"zygote (the process that forks workers) started in "
              f"{_ms(time.perf_counter() - t0)}, once per host")
        with b:
            if named:
                calls = named
            elif own_folder:
                calls = []
                print(f"\ntools: {', '.join(t['name'] for t in b.discovered_tools) or 'none'}")
                print("none of them is called unless you name it: "
                      "--tool NAME [--params JSON] (repeatable)")
            else:
                calls = _bundled_calls(b, ws)
            _demo_body(b, calls, args.calls)
    return 0


def _demo_body(b: SandboxedBinding, calls: list, warm_calls: int) -> None:
    answered = None
    for name, params in calls:
        route = b.catalog.routes.get(name)
        lib = route.library.name if route is not None else None
        fresh = lib is not None and not any(s["library"] == lib and s["pid"] for s in b.stats())
        t0 = time.perf_counter()
        first = b.execute_tool(name, params)
        cold = time.perf_counter() - t0
        print(f"\n{name}({json.dumps(params)}) -> status {first.get('status_code')}: "
              f"{_short(first)}")
        if not first.get("success"):
            print("   failed, so it is not timed")
            continue
        answered = answered or (name, params)
        warm, failed = [], []
        for _ in range(warm_calls):
            t0 = time.perf_counter()
            r = b.execute_tool(name, params)
            elapsed = time.perf_counter() - t0
            if r.get("success"):
                warm.append(elapsed)
            else:
                failed.append(r)
        if fresh:
            kind = "cold (worker start + import + call)"
        else:
            kind = "first call (worker already running)"
        line = f"   {kind}: {_ms(cold)}"
        if warm:
            line += (f"   warm p50 over {len(warm)} successful calls: "
                     f"{_ms(statistics.median(warm))}")
        if failed:
            line += (f"   {len(failed)} of {warm_calls} warm calls failed (not timed; "
                     f"last: status {failed[-1].get('status_code')})")
        print(line)

    b.register_tool_from_code("segfault", _CRASHY)
    print("\nA tool that segfaults its worker:")
    r = b.execute_tool("tool_segfault", {})
    print(f"   -> status {r['status_code']}: {r['error']}")
    if answered:
        r = b.execute_tool(*answered)
        print(f"   the host lives on; {answered[0]} still answers with status {r['status_code']}")
    else:
        print("   the host lives on")
    print("\nworkers:")
    for s in b.stats():
        print(f"   {s['library']:<20} pid {s['pid']!s:<8} calls {s['calls']:<5} restarts "
              f"{s['restarts']}  rss {s['rss'] / 1048576:.1f} MB  last exit: {s['last_exit']}")


def _short(result: dict) -> str:
    shown = result.get("output") if result.get("success") else result.get("error")
    text = json.dumps(shown, default=str)
    return text[:100] + ("..." if len(text) > 100 else "")


def _bundled_calls(b: SandboxedBinding, ws: str) -> list:
    """The demo's calls to the bundled tools, with the files they need in ``ws``."""
    import sqlite3
    Path(ws, "notes.txt").write_text("hello from the workspace\n")
    sqlite3.connect(os.path.join(ws, "demo.db")).close()
    names = {t["name"] for t in b.discovered_tools}
    wanted = [("tool_list_files", {}), ("tool_read_file", {"file_name": "notes.txt"}),
              ("tool_execute_query", {"database_name": "demo.db", "query": "SELECT 1 AS one"})]
    return [(n, p) for n, p in wanted if n in names]


class _ToolCall(argparse.Action):
    """``--tool NAME`` starts a call; ``--params JSON`` sets the parameters of the
    ``--tool`` before it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 value: Any, option_string: Optional[str] = None) -> None:
        calls = list(getattr(namespace, self.dest, None) or [])
        if option_string == "--tool":
            calls.append((value, "{}"))
        elif not calls:
            parser.error("--params must follow the --tool it is for")
        else:
            calls[-1] = (calls[-1][0], value)
        setattr(namespace, self.dest, calls)


_BENCH_MISSING = ("speed figures against baselines; not part of the installed package: "
                  "from a source checkout run `python -m benchmarks.run --help`")


def _checkout_benchmarks() -> Any:
    """The harness's command line from the ``benchmarks/`` folder beside this package (a
    source checkout, installed editable or not), loaded from that very folder: a module
    named ``benchmarks`` elsewhere on ``sys.path`` is never imported for it (ImportError)."""
    folder = os.path.join(ENGINE_DIR, "benchmarks")
    init = os.path.join(folder, "__init__.py")
    if not os.path.isfile(init):
        raise ImportError(f"no benchmarks/ folder beside the package ({ENGINE_DIR})")
    loaded = sys.modules.get("benchmarks")
    if loaded is None:
        spec = importlib.util.spec_from_file_location("benchmarks", init,
                                                      submodule_search_locations=[folder])
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules["benchmarks"] = loaded
        spec.loader.exec_module(loaded)
    if os.path.realpath(getattr(loaded, "__file__", "") or "") != os.path.realpath(init):
        raise ImportError(f"a module named 'benchmarks' from elsewhere ({loaded!r}) is loaded")
    return importlib.import_module("benchmarks.cli")


def _add_bench(sub: Any, verbose: argparse.ArgumentParser) -> None:
    """``bench`` comes from the benchmark harness of a source checkout (the
    ``benchmarks/`` folder beside the package, loaded from there); else --help still
    lists it, with how to run it.  The engine never edits ``sys.path``."""
    try:
        add_parser = _checkout_benchmarks().add_parser
    # An installed package: no benchmarks.
    except ImportError as exc:
        why = f"{_BENCH_MISSING} ({exc})"

        def bench_missing(args: argparse.Namespace) -> int:
            print(f"lcp-sandbox bench: {why}", file=sys.stderr)
            return 2

        p = sub.add_parser("bench", help=_BENCH_MISSING, description=_BENCH_MISSING,
                           parents=[verbose])
        p.set_defaults(fn=bench_missing, any_arguments=True)
        return
    p = add_parser(sub)
    try:
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help=argparse.SUPPRESS)
    except (AttributeError, argparse.ArgumentError):
        pass


_FOLDER = "folder of tool libraries"


def _command(sub: Any, verbose: argparse.ArgumentParser, name: str, summary: str,
             more: str = "") -> argparse.ArgumentParser:
    """A command of ``lcp-sandbox``: its ``--help`` opens with the one-line summary the
    command list shows, then says ``more``."""
    description = f"{summary[0].upper()}{summary[1:]}." + (f" {more}" if more else "")
    return sub.add_parser(name, help=summary, description=description, parents=[verbose])


class _Parser(argparse.ArgumentParser):
    """A parser that takes each flag by its whole name: argparse's prefixes would read a slip
    (``--max-workers-``) as the longer flag it begins (``--max-workers-per-tenant``).
    Its commands' parsers are of this class too (add_subparsers makes its own class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The ``lcp-sandbox`` argument parser."""
    verbose = _Parser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="log the engine and the tools' output on stderr")
    parser = _Parser(prog="lcp-sandbox", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", default=False,
                        help="log the engine and the tools' output on stderr")
    sub = parser.add_subparsers(dest="cmd", required=True,
                                metavar="{tools,call,demo,bench,serve-mcp,envs,disks}")

    p = _command(sub, verbose, "tools", "print the discovered tool specs as JSON")
    p.add_argument("folders", nargs="+", metavar="FOLDER", help=_FOLDER)
    p.add_argument("--dynamic", action="store_true",
                   help="run dynamic prompt providers (in workers)")
    p.set_defaults(fn=cmd_tools)

    p = _command(sub, verbose, "call", "run one tool call and print the result as JSON",
                 "Exit status: 0 when the call succeeded, 1 when it failed, 2 for a mistake in "
                 "the command.")
    p.add_argument("folder", metavar="FOLDER", help=_FOLDER)
    p.add_argument("tool", metavar="TOOL", help="tool name, e.g. tool_read_file")
    p.add_argument("--params", default="{}", metavar="JSON",
                   help="the parameters, a JSON object (default: {}), "
                        "e.g. '{\"file_name\": \"notes.txt\"}'")
    p.add_argument("--workspace", default=None, metavar="DIR",
                   help="the tool's working directory, created if missing "
                        "(default: the current directory)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="the call's timeout (default: 60; 0: none)")
    p.set_defaults(fn=cmd_call)

    p = _command(sub, verbose, "demo", "discover, call cold then warm, survive a crash",
                 "FOLDER is the bundled tools unless given; the calls timed are the bundled "
                 "demo's, or the --tool calls you name; the last step is a tool that segfaults.")
    p.add_argument("folder", nargs="?", default=None, metavar="FOLDER",
                   help="folder of tool libraries (default: the bundled tools)")
    p.add_argument("--tool", dest="tool_calls", action=_ToolCall, metavar="NAME",
                   help="a tool to call and time (repeatable); on your own FOLDER only these "
                        "are called")
    p.add_argument("--params", dest="tool_calls", action=_ToolCall, metavar="JSON",
                   help="JSON object of parameters for the --tool before it (default: {})")
    p.add_argument("--calls", type=int, default=200, help="warm calls per tool (default: 200)")
    p.set_defaults(fn=cmd_demo)

    _add_bench(sub, verbose)
    add_serve_mcp(sub, [verbose])
    add_envs(sub, [verbose])
    add_disks(sub, [verbose])
    return parser


def main(argv: Optional[list] = None) -> int:
    """Run ``lcp-sandbox`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    # The engine's warnings (a protection not in force, a worker that died...) by default.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.fn(args)
    except UsageError as exc:
        print(f"lcp-sandbox {args.cmd}: {exc}", file=sys.stderr)
        return 2
    # `lcp-sandbox tools ... | head`: the reader left.
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
