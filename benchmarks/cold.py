"""COLD: from nothing to the first result.

    rounds × paths in random order, each a never-run process: sandbox (zygote fork),
    spawn, python -c, a new ProcessPoolExecutor, in-process first import; phases come
    from perf_counter stamps taken inside the tool's process (CLOCK_MONOTONIC on Linux,
    one clock for every process).  Then fresh supervisors: the zygote's start, and a
    new host's very first call.
"""
from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
import types
from typing import Any, Optional

from lcp_sandbox import SandboxedBinding, Supervisor

from .harness import ratio, summarize
from .loader import child_code
from .warm import SUBPROCESS_BODY, ppe_call

SPAWN_BODY = '''
conn.send(getattr(load_tool_file(path, "lcp_bench_tool"), tool)(**params))
conn.close()
'''


class ColdPath:
    """``once()`` times one never-run start: (t0, t1, what the tool returned), perf_counter seconds."""
    key = ""
    label = ""


class SandboxCold(ColdPath):
    def __init__(self, key: str, label: str, sup: Any, folders: list, ws: str, tool: str,
                 params: dict, binding_kwargs: Optional[dict] = None) -> None:
        self.key, self.label = key, label
        self.sup, self.folders, self.ws, self.tool, self.params = sup, folders, ws, tool, params
        self.kw = binding_kwargs or {}
        self.n = 0

    def once(self) -> tuple:
        self.n += 1
        b = SandboxedBinding(tools_folders=self.folders, workspace=self.ws, supervisor=self.sup,
                             tenant=f"bench-cold-{self.key}-{self.n}", **self.kw)
        for stem in {t["_library"] for t in b.discovered_tools if "_library" in t}:
            # every start here imports the library itself: templated starts have their own section
            b.host_tool_configs.setdefault(stem, {}).setdefault("sandbox", {}).setdefault("template", False)
        try:
            p = dict(self.params)
            t0 = time.perf_counter()
            r = b.execute_tool(self.tool, p)
            t1 = time.perf_counter()
        finally:
            b.close()
        if r.get("status_code") != 200:
            raise RuntimeError(f"{self.tool} failed cold in the sandbox: {r.get('error')}")
        return t0, t1, r.get("output")


class SpawnCold(ColdPath):
    def __init__(self, key: str, path: str, tool: str, params: dict) -> None:
        import multiprocessing
        self.key, self.label = key, f"spawn (fresh interpreter) {tool}"
        self.ctx = multiprocessing.get_context("spawn")
        self.code = child_code(SPAWN_BODY)
        self.path, self.tool, self.params = path, tool, params

    def once(self) -> tuple:
        parent, child = self.ctx.Pipe(duplex=False)
        p = self.ctx.Process(target=exec, args=(self.code, {"conn": child, "path": self.path,
                                                           "tool": self.tool, "params": self.params}),
                             daemon=True)
        # The child must not re-import the harness's own __main__ (a script that imports
        # the whole engine): hide it while the preparation data is built in start().
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            t0 = time.perf_counter()
            p.start()
        finally:
            sys.modules["__main__"] = main
        try:
            if not parent.poll(60):
                raise RuntimeError("the spawned child did not answer")
            out = parent.recv()
            t1 = time.perf_counter()
        finally:
            child.close()
            parent.close()
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        return t0, t1, out


class SubprocessCold(ColdPath):
    def __init__(self, key: str, path: str, tool: str, params: dict) -> None:
        self.key, self.label = key, f"python -c {tool}"
        self.argv = [sys.executable, "-c", child_code(SUBPROCESS_BODY), path, tool, json.dumps(params)]

    def once(self) -> tuple:
        t0 = time.perf_counter()
        r = subprocess.run(self.argv, capture_output=True, stdin=subprocess.DEVNULL)
        t1 = time.perf_counter()
        if r.returncode != 0:
            raise RuntimeError(f"python -c failed: {r.stderr.decode(errors='replace')[-300:]}")
        try:
            out = json.loads(r.stdout)
        except ValueError:
            out = None
        return t0, t1, out


class PPECold(ColdPath):
    def __init__(self, key: str, path: str, tool: str, params: dict) -> None:
        self.key, self.label = key, f"new ProcessPoolExecutor {tool}"
        self.path, self.tool, self.params = path, tool, params

    def once(self) -> tuple:
        import concurrent.futures
        t0 = time.perf_counter()
        ex = concurrent.futures.ProcessPoolExecutor(max_workers=1)
        try:
            out = ex.submit(ppe_call, self.path, self.tool, self.params).result(60)
            t1 = time.perf_counter()
        finally:
            ex.shutdown(wait=True)
        return t0, t1, out


class InProcessCold(ColdPath):
    def __init__(self, key: str, lcp: Any, tool: str, params: dict, module_name: str) -> None:
        self.key, self.label = key, f"in-process LCPBinding first import {tool}"
        self.lcp, self.tool, self.params, self.module_name = lcp, tool, params, module_name

    def once(self) -> tuple:
        sys.modules.pop(self.module_name, None)
        p = dict(self.params)
        t0 = time.perf_counter()
        r = self.lcp.execute_tool(self.tool, p)
        t1 = time.perf_counter()
        return t0, t1, r.get("output")


def phases(t0: float, t1: float, stamps: Any) -> Optional[dict]:
    """Split [t0, t1] (perf_counter seconds) with the stamps a bench tool returned."""
    if not isinstance(stamps, dict) or "import_start" not in stamps:
        return None
    imp = stamps["import_start"]
    ready = stamps.get("init_end") or stamps.get("import_end") or imp
    return {"start": imp - t0, "import_init": ready - imp, "call": t1 - ready}


def build_paths(ctx: Any) -> list:
    cfg, libs = ctx.cfg, [str(ctx.libs)]
    paths: list = [
        SandboxCold("sandbox", "sandbox (zygote fork) tool_stamp", ctx.sup, libs, ctx.ws, "tool_stamp", {}),
        SandboxCold("sandbox_heavy", "sandbox (zygote fork) heavy import", ctx.sup, libs, ctx.ws,
                    "tool_heavy_stamp", {}),
    ]
    if ctx.sup_spawn is not None:
        paths.append(SandboxCold("sandbox_spawn", "sandbox (spawn path) tool_stamp", ctx.sup_spawn, libs,
                                 ctx.ws, "tool_stamp", {}))
    if "spawn" in cfg.skip:
        ctx.skipped["cold:spawn"] = "skipped by request"
    else:
        paths.append(SpawnCold("spawn", ctx.noop_path, "tool_stamp", {}))
    if "subprocess" not in cfg.skip:
        paths.append(SubprocessCold("subprocess", ctx.noop_path, "tool_stamp", {}))
    if "ppe" not in cfg.skip:
        paths.append(PPECold("ppe", ctx.noop_path, "tool_stamp", {}))
    if ctx.lcp_cls is not None:
        paths.append(InProcessCold("inprocess", ctx.lcp_cls(tools_folders=libs), "tool_stamp", {},
                                   "lollms_client.tools_bindings.lcp.persistent_bench_noop"))
    u = ctx.user
    if u:
        paths.append(SandboxCold(f"sandbox:{u['tool']}", f"sandbox (zygote fork) {u['tool']}", ctx.sup,
                                 [u["folder"]], ctx.ws, u["tool"], u["params"], cfg.binding_kwargs))
    return paths


def _row(label: str, xs: list) -> dict:
    row = summarize(xs, 1e-3)                 # milliseconds
    row.update(label=label, unit="ms", samples_ms=[round(x * 1e3, 4) for x in xs])
    return row


def run(ctx: Any, paths: list, prog: Any) -> None:
    reps = max(1, ctx.cfg.cold_reps)
    totals: dict = {p.key: [] for p in paths}
    phs: dict = {p.key: [] for p in paths}
    live = list(paths)
    for r in range(reps):
        order = list(live)
        ctx.rng.shuffle(order)
        for p in order:
            gc.collect()
            try:
                t0, t1, out = p.once()
            except Exception as exc:                       # noqa: BLE001
                ctx.skipped[f"cold:{p.key}"] = f"{type(exc).__name__}: {exc}"
                live.remove(p)
                continue
            totals[p.key].append(t1 - t0)
            phs[p.key].append(phases(t0, t1, out))
            prog.step("cold", f"round {r + 1}/{reps} {p.label}")
    out = ctx.result["cold"]
    for p in paths:
        if not totals[p.key]:
            continue
        row = out[p.key] = _row(p.label, totals[p.key])
        if phs[p.key] and all(phs[p.key]):
            split = {k: [ph[k] for ph in phs[p.key]] for k in ("start", "import_init", "call")}
            row["phases"] = {k: summarize(v, 1e-3) for k, v in split.items()}
            row["phases_samples_ms"] = {k: [round(x * 1e3, 4) for x in v] for k, v in split.items()}


def zygote(ctx: Any, prog: Any) -> None:
    """Fresh supervisors: zygote start alone, and a new host's very first call."""
    starts, firsts = [ctx.zygote_first_s], []
    for i in range(max(0, ctx.cfg.zygote_reps)):
        gc.collect()
        sup = Supervisor()
        b = SandboxedBinding(tools_folders=[str(ctx.libs)], workspace=ctx.ws, supervisor=sup)
        try:
            t0 = time.perf_counter()
            sup.start()
            t1 = time.perf_counter()
            b.execute_tool("tool_stamp", {})
            t2 = time.perf_counter()
        finally:
            sup.close()
        starts.append(t1 - t0)
        firsts.append(t2 - t0)
        prog.step("cold", f"fresh supervisor {i + 1}/{ctx.cfg.zygote_reps}")
    out = ctx.result["cold"]
    for key, label, xs in (("zygote_start", "zygote start (once per host)", starts),
                           ("new_host", "new host: zygote start + first call", firsts)):
        if xs:
            out[key] = _row(label, xs)


def ratios(ctx: Any) -> None:
    """Every cold row over the spawn row and over the warm floor."""
    out = ctx.result["cold"]
    spawn = out.get("spawn", {}).get("p50")
    floor = ctx.result["warm"].get(ctx.headline, {}).get("floor", {}).get("p50")
    for row in out.values():
        row["x_spawn_p50"] = ratio(row.get("p50"), spawn)
        row["x_floor_p50"] = ratio(row.get("p50") and row["p50"] * 1000.0, floor)
