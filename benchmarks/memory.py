"""MEMORY: USS / PSS / RSS of workers after their first call and after N calls, with the
zygote, a ProcessPoolExecutor worker and the host itself for scale."""
from __future__ import annotations

import os
from typing import Any, Optional

import psutil

from lcp_sandbox import SandboxedBinding

from .warm import worker_pid


def mem_row(what: str, pid: Optional[int], calls: Optional[int], key: str) -> dict:
    row: dict = {"what": what, "key": key, "pid": pid, "calls": calls}
    if not pid:
        row["error"] = "no live process"
        return row
    try:
        info = psutil.Process(pid).memory_full_info()
        row.update(uss_mb=info.uss / 1048576, pss_mb=getattr(info, "pss", 0) / 1048576,
                   rss_mb=info.rss / 1048576)
    except Exception as exc:                                   # noqa: BLE001
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def parent_pid(pid: Optional[int]) -> Optional[int]:
    """The zygote forks every worker (docs/results.md, "Process tree"): a worker's parent is it."""
    try:
        return psutil.Process(pid).ppid() if pid else None
    except psutil.Error:
        return None


def run(ctx: Any, prog: Any, ppe: Any) -> None:
    cfg = ctx.cfg
    rows = ctx.result["memory"]
    b = SandboxedBinding(tools_folders=[str(ctx.libs)], workspace=ctx.ws, supervisor=ctx.sup, tenant="bench-mem")
    ctx.cleanup.append(b.close)
    label = "sandbox worker bench_noop (small library)"
    b.execute_tool("tool_noop", {})
    pid = worker_pid(b, "bench_noop")
    rows.append(mem_row(label, pid, 1, "small_first"))
    call = b.execute_tool
    done = 1
    chunk = max(1, cfg.mem_calls // 20)
    while done < cfg.mem_calls:
        n = min(chunk, cfg.mem_calls - done)
        for _ in range(n):
            call("tool_noop", {})
        done += n
        prog.step("memory", f"{done}/{cfg.mem_calls} calls", 0)
    rows.append(mem_row(label, pid, done, "small_after"))
    b.execute_tool("tool_heavy_stamp", {})
    rows.append(mem_row("sandbox worker bench_heavy", worker_pid(b, "bench_heavy"), 1, "heavy"))
    rows.append(mem_row("zygote (shared by all workers)", parent_pid(pid), None, "zygote"))
    u = ctx.user
    if u:
        rows.append(mem_row(f"sandbox worker {u['library']} ({u['tool']})",
                            worker_pid(u["binding"], u["library"]), None, "user"))
    if ppe is not None:
        rows.append(mem_row("ProcessPoolExecutor worker (forked from the host)", ppe.worker, None, "ppe"))
    rows.append(mem_row("this host process (for scale)", os.getpid(), None, "host"))
    prog.step("memory", "done")
