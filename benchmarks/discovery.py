"""DISCOVERY: N generated tool files, the first time (a new binding, files the process has
not parsed: their mtimes are moved before each repetition), again with nothing changed, and
a new tenant's binding of files another binding already parsed (the parse cache is the
process's); LCPBinding for comparison."""
from __future__ import annotations

import gc
import os
import time
from typing import Any, Callable

from lcp_sandbox import SandboxedBinding

from .harness import secs

GENERATED = '''"""Generated tool library {i} for the discovery benchmark."""
import os

TOOL_LIBRARY_NAME = "Generated {i}"


def tool_gen{i}_search(query: str, max_results: int = 10, exact: bool = False) -> dict:
    """Searches the records of library {i}.

    Args:
        query (str): What to look for.
        max_results (int): At most this many matches.
        exact (bool): Only exact matches.

    Returns:
        dict: the matches.
    """
    return {{"query": query, "max_results": max_results, "exact": exact}}


def tool_gen{i}_describe(item_id: int, fields: list = None, verbose: bool = False) -> dict:
    """Describes one record of library {i}.

    Args:
        item_id (int): The record.
        fields (list): Which fields to show.
        verbose (bool): Add details.

    Returns:
        dict: the record.
    """
    return {{"id": item_id, "fields": fields or [], "cwd": os.getcwd()}}


def _helper(x):
    return x
'''


def _timed(make: Callable[[], Any], again: Callable[[Any], Any], n_again: int, reps: int,
           done: Callable[[], None] = lambda: None) -> tuple:
    """Seconds of each ``make()``, seconds of each of the ``n_again`` ``again(made)`` that
    follow it, over ``reps`` repetitions; and the last thing made."""
    first, repeat, made = [], [], None
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        made = make()
        first.append(time.perf_counter() - t0)
        for _ in range(n_again):
            t0 = time.perf_counter()
            again(made)
            repeat.append(time.perf_counter() - t0)
        done()
    return first, repeat, made


def run(ctx: Any, prog: Any) -> None:
    cfg = ctx.cfg
    n = cfg.discovery_files
    reps = max(1, cfg.discovery_reps)
    folder = ctx.tmp / "discovery"
    folder.mkdir()
    for i in range(n):
        (folder / f"gen_lib_{i:04d}.py").write_text(GENERATED.format(i=i))
    out = ctx.result["discovery"] = {"files": n, "tools": 0}
    refresh = lambda b: b.discover_tools(force_refresh=True)          # noqa: E731
    files = sorted(folder.iterdir())
    stamp = [time.time_ns()]

    def unparsed(step: bool = True) -> None:
        """New mtimes: the next binding parses every file again (progress between reps)."""
        stamp[0] += 1_000_000_000
        for f in files:
            os.utime(f, ns=(stamp[0], stamp[0]))
        if step:
            prog.step("discovery", f"{n} files")

    unparsed(step=False)
    first, again, b = _timed(lambda: SandboxedBinding(tools_folders=[str(folder)], workspace=ctx.ws,
                                                      supervisor=ctx.sup, tenant="bench-discovery"),
                             refresh, 3, reps, unparsed)
    tenant, _, _ = _timed(lambda: SandboxedBinding(tools_folders=[str(folder)], workspace=ctx.ws,
                                                   supervisor=ctx.sup, tenant="bench-discovery-2"),
                          refresh, 0, reps)
    out["tools"] = len(b.discovered_tools)
    out["sandbox"] = {"first": secs(first), "again": secs(again), "new_tenant": secs(tenant)}
    if ctx.lcp_cls is not None:
        first, again, _ = _timed(lambda: ctx.lcp_cls(tools_folders=[str(folder)]), refresh, 1, reps,
                                 lambda: prog.step("discovery", "LCPBinding"))
        out["inprocess"] = {"first": secs(first), "again": secs(again)}
    if ctx.user:
        first, _, _ = _timed(lambda: SandboxedBinding(tools_folders=[ctx.user["folder"]], supervisor=ctx.sup,
                                                      tenant="bench-discovery"), refresh, 0, reps)
        out["user_folder"] = {"folder": ctx.user["folder"], "first": secs(first)}
