"""One benchmark run: the set-up every section shares, the sections in order, the result.

    run_bench(...) ─► dict  (also --json, a table on stdout, --plot PNG)
      setup       temp dir: bundled libraries copied and byte-compiled, a workspace;
                  one Supervisor whose zygote is started before anything is timed
      warm        warm.py        routing     routing.py     density   density.py
      cold        cold.py
      throughput  throughput.py  memory      memory.py      discovery discovery.py
      templates   templates.py (template vs fresh import vs plain cold start, USS per kind)
      syscalls    syscalls.py (confined worker, system call allowlist on vs off: cold, warm)
      confined    confined.py (a new tenant's first call confined vs not; 200 confined tenants)
      compiled    compiled.py (a library without a .pyc: the host's compiled code vs the worker's)
      egress      egress.py (a GET through a network policy's proxy vs direct; its memory)
      secrets     secrets.py (a request whose secret the proxy puts in vs a tunnel, direct)
      mcp         mcp_section.py (serve-mcp beside a bare MCP SDK server; the mcp extra)
      envs        envs.py (a library with its own environment vs without; a 5-wheel build)
      ray         ray_section.py (the ray extra; --skip ray)
      targets     targets.py     report      report.py
"""
from __future__ import annotations

import compileall
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Callable, Optional

from lcp_sandbox import SandboxedBinding, Supervisor

from . import (breakdown, cold, compiled, confined, density, discovery, egress, envs, mcp_section,
               memory, ray_section, routing, secrets, spawn_burst, syscalls, targets, templates,
               throughput, warm)
from .config import TARGETS, BenchConfig
from .harness import LIBS, Progress, cpu_busy_jiffies, pin_thread, stop_resource_tracker_if_new, timer_overhead_ns
from .report import render_table, write_json, write_plot


class Context:
    """What the sections share: the configuration, the result being filled, the temporary
    folder, the CPU placements, the supervisor and binding of the warm rows, and the
    clean-up to run at the end (in reverse)."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.result: dict = {"meta": {}, "skipped": {}, "warm": {}, "routing": {}, "density": {}, "cold": {},
                             "throughput": [], "memory": [], "discovery": {}, "ray": {}, "targets": []}
        self.skipped = self.result["skipped"]
        self.cleanup: list[Callable[[], None]] = []
        self.all_cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        self.user: Optional[dict] = None

    def setup(self) -> None:
        cfg = self.cfg
        self.cleanup.append(stop_resource_tracker_if_new())      # runs last
        self.tmp = Path(tempfile.mkdtemp(prefix="lcp-bench-"))
        self.cleanup.append(lambda: shutil.rmtree(self.tmp, ignore_errors=True))
        self.libs = self.tmp / "libs"
        shutil.copytree(LIBS, self.libs, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "density"))
        # Installed libraries usually have their bytecode cached; compile the copies now so no
        # path pays for compiling them (the import system reads a .pyc even when
        # PYTHONDONTWRITEBYTECODE keeps it from writing one).
        compileall.compile_dir(str(self.libs), quiet=1)
        self.ws = str(self.tmp / "workspace")
        os.makedirs(self.ws)
        self.noop_path = str((self.libs / "bench_noop.py").resolve())
        self.heavy_path = str((self.libs / "bench_heavy.py").resolve())

        pin_thread(self.all_cpus)
        if cfg.cpus:
            host_cpu, worker_cpu = cfg.cpus
        elif self.all_cpus and len(self.all_cpus) >= 2:
            host_cpu, worker_cpu = sorted(self.all_cpus)[:2]
        else:
            host_cpu = worker_cpu = None
        self.placements = {"unpinned": (self.all_cpus, self.all_cpus)}
        if host_cpu is not None and worker_cpu is not None and host_cpu != worker_cpu:
            self.placements = {"split": ({host_cpu}, {worker_cpu}), **self.placements}
        else:
            self.skipped["split"] = "fewer than two CPUs to pin the host thread and the worker apart"
        self.headline = "split" if "split" in self.placements else "unpinned"

        self.lcp_cls = None
        if "inprocess" in cfg.skip:
            self.skipped["inprocess"] = "skipped by request"
        else:
            try:
                from lollms_client.tools_bindings.lcp import LCPBinding
                self.lcp_cls = LCPBinding
            except Exception as exc:                           # noqa: BLE001
                self.skipped["inprocess"] = f"lollms_client is not available ({type(exc).__name__}: {exc})"

        # The supervisor (and so the zygote, and every worker it forks) starts while
        # this thread is unpinned: a process inherits the affinity of its creator.
        self.sup = Supervisor()
        t0 = time.perf_counter()
        self.sup.start()
        self.zygote_first_s = time.perf_counter() - t0
        self.cleanup.append(self.sup.close)
        self.binding = SandboxedBinding(tools_folders=[str(self.libs)], workspace=self.ws,
                                        supervisor=self.sup, tenant="bench-warm")
        # The spawn start path (what macOS and Windows run), forced here: its own supervisor.
        self.sup_spawn = self.binding_spawn = None
        if "spawn_path" in cfg.skip:
            self.skipped["spawn_path"] = "skipped by request"
        else:
            self.sup_spawn = Supervisor(start_method="spawn")
            self.sup_spawn.start()
            self.cleanup.append(self.sup_spawn.close)
            self.binding_spawn = SandboxedBinding(tools_folders=[str(self.libs)], workspace=self.ws,
                                                  supervisor=self.sup_spawn, tenant="bench-warm")
        if cfg.folder:
            self.user = self._user_setup()
        self.overhead_ns = timer_overhead_ns()
        self.result["meta"].update({
            "python": sys.version.split()[0], "implementation": platform.python_implementation(),
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "allowed_cpus": sorted(self.all_cpus) if self.all_cpus else None,
            "host_cpu": host_cpu, "worker_cpu": worker_cpu, "headline_placement": self.headline,
            "placements": list(self.placements), "config": json.loads(json.dumps(asdict(cfg), default=str)),
            "lollms_client": _version("lollms-client") if self.lcp_cls else None,
            "lcp_sandbox": _version("lcp-sandbox"),
            "timer_overhead_ns": self.overhead_ns,
            "dont_write_bytecode": bool(sys.dont_write_bytecode),
            "engine_source": _engine_source(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "targets": TARGETS,
        })

    def _user_setup(self) -> dict:
        cfg = self.cfg
        folder = str(Path(cfg.folder).resolve())
        b = SandboxedBinding(tools_folders=[folder], workspace=self.ws, supervisor=self.sup,
                             tenant="bench-user", **cfg.binding_kwargs)
        self.cleanup.append(b.close)
        specs = {s["name"]: s for s in b.discovered_tools}
        tool = cfg.tool
        if tool is None:
            free = [s["name"] for s in b.discovered_tools if not s["input_schema"].get("required")]
            if not free:
                raise SystemExit(f"no tool of {folder} can be called without parameters: pass --tool and --params")
            tool = free[0]
        if tool not in specs:
            raise SystemExit(f"tool {tool!r} not found in {folder} (found: {', '.join(sorted(specs)) or 'none'})")
        # _python_file_path: the tool's file, a key of LCPBinding's own specs (None for dynamic tools)
        return {"folder": folder, "tool": tool, "params": dict(cfg.params), "binding": b,
                "library": b.find_library_for_tool(tool), "path": specs[tool].get("_python_file_path")}

    def steps(self, wpaths: list, cpaths: list) -> int:
        """How many progress steps the run will take."""
        cfg = self.cfg
        n = max(1, cfg.rounds) * len(self.placements) * len(wpaths)
        n += max(1, cfg.cold_reps) * len(cpaths) + max(0, cfg.zygote_reps)
        if "breakdown" not in cfg.skip:
            n += 1
        if "routing" not in cfg.skip:
            n += 2 * max(1, cfg.routing_rounds) + 2
        if "density" not in cfg.skip:
            n += 2 * max(1, cfg.density_rounds) + 3
        if "throughput" not in cfg.skip:
            n += (9 + (2 if self.lcp_cls else 0) + (2 if self.user else 0)) * max(1, cfg.throughput_rounds)
        if "memory" not in cfg.skip:
            n += 1
        if "discovery" not in cfg.skip:
            n += max(1, cfg.discovery_reps) * (2 if self.lcp_cls else 1)
        if "ray" not in cfg.skip:
            n += max(1, cfg.ray_rounds) + max(1, cfg.ray_cold_reps)
        if "syscalls" not in cfg.skip:
            n += 1
        if "confined" not in cfg.skip:
            n += 1
        if "compiled" not in cfg.skip:
            n += 1
        if "egress" not in cfg.skip:
            n += 1
        if "secrets" not in cfg.skip:
            n += 1
        if "envs" not in cfg.skip:
            n += 1
        if "mcp" not in cfg.skip:
            n += max(1, cfg.mcp_rounds) + 1
        if "spawn_path" not in cfg.skip:
            n += 1
        return n

    def section(self, name: str, fn: Callable[[], None], catch: bool = False) -> None:
        """Run one optional section (``--skip NAME`` leaves it out)."""
        if name in self.cfg.skip:
            self.skipped[name] = "skipped by request"
            return
        try:
            fn()
        except Exception as exc:                               # noqa: BLE001
            if not catch:
                raise
            self.skipped[name] = f"{type(exc).__name__}: {exc}"

    def run(self, show_progress: bool) -> dict:
        t_start = time.monotonic()
        stat0 = cpu_busy_jiffies()
        try:
            self.setup()
            wpaths = warm.build_paths(self)
            cpaths = cold.build_paths(self)
            prog = Progress(self.steps(wpaths, cpaths), show_progress)
            try:
                warm.run(self, wpaths, prog)
                ppe = next((p for p in wpaths if p.key == "ppe"), None)
                for p in wpaths:
                    if p is not ppe:
                        p.close()
                self.section("breakdown", lambda: breakdown.run(self, prog), catch=True)
                self.section("routing", lambda: routing.run(self, prog), catch=True)
                self.section("density", lambda: density.run(self, prog), catch=True)
                cold.run(self, cpaths, prog)
                cold.zygote(self, prog)
                cold.ratios(self)
                self.section("spawn_path", lambda: spawn_burst.run(self, prog), catch=True)
                self.section("throughput", lambda: throughput.run(self, prog))
                self.section("memory", lambda: memory.run(self, prog, ppe))
                self.section("discovery", lambda: discovery.run(self, prog))
                self.section("templates", lambda: templates.run(self, prog), catch=True)
                self.section("syscalls", lambda: syscalls.run(self, prog), catch=True)
                self.section("confined", lambda: confined.run(self, prog), catch=True)
                self.section("compiled", lambda: compiled.run(self, prog), catch=True)
                self.section("egress", lambda: egress.run(self, prog), catch=True)
                self.section("secrets", lambda: secrets.run(self, prog), catch=True)
                self.section("mcp", lambda: mcp_section.run(self, prog), catch=True)
                self.section("envs", lambda: envs.run(self, prog), catch=True)
                self.section("ray", lambda: ray_section.run(self, prog), catch=True)
            finally:
                prog.close()
            targets.run(self)
        finally:
            pin_thread(self.all_cpus)
            for fn in reversed(self.cleanup):
                try:
                    fn()
                except Exception:                              # noqa: BLE001
                    pass
        meta = self.result["meta"]
        meta["duration_s"] = time.monotonic() - t_start
        stat1 = cpu_busy_jiffies()
        if stat0 and stat1 and stat1[2] > stat0[2]:
            span = stat1[2] - stat0[2]
            meta["machine"] = {
                "busy_fraction": (stat1[0] - stat0[0]) / span,        # this run included
                "steal_fraction": (stat1[1] - stat0[1]) / span,
                "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None}
        return self.result


def _engine_source() -> dict:
    """Where the measured lcp_sandbox comes from, and its git commit when it is a checkout."""
    import lcp_sandbox
    pkg = Path(lcp_sandbox.__file__).resolve().parent
    out: dict = {"path": str(pkg)}
    try:
        git = ["git", "-C", str(pkg.parent)]
        out["commit"] = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True, timeout=10).stdout.strip() or None
        if out["commit"]:
            status = subprocess.run(git + ["status", "--porcelain", "--", "lcp_sandbox"], capture_output=True,
                                    text=True, timeout=10).stdout
            out["uncommitted_changes"] = bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def _version(dist: str) -> Optional[str]:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:                                          # noqa: BLE001
        return None


def run_bench(folder: Optional[str] = None, tool: Optional[str] = None, params: Optional[dict] = None, *,
              calls: Optional[int] = None, quick: bool = False, json_path: Optional[str] = None,
              plot_path: Optional[str] = None, progress: bool = False, out: Any = None,
              **overrides: Any) -> dict:
    """Run the whole benchmark and return every number as a dict.

    ``folder``/``tool``/``params`` add rows for a host's own tool next to the bundled
    ``bench_noop`` library (the targets are always judged on ``bench_noop``).
    ``overrides`` are :class:`BenchConfig` fields (``rounds=``, ``cold_reps=``...).
    ``out``: a stream to print the table to (None: no table).  ``json_path`` /
    ``plot_path``: where to write the JSON / PNG (the PNG needs matplotlib)."""
    kw = dict(overrides)
    kw.update(folder=folder, tool=tool, params=dict(params or {}))
    if calls is not None:
        kw["calls"] = calls
    if kw.get("cpus") is not None:
        kw["cpus"] = tuple(kw["cpus"])
    kw["skip"] = tuple(kw.get("skip") or ())
    unknown = set(kw) - {f.name for f in fields(BenchConfig)}
    if unknown:
        raise TypeError(f"unknown benchmark option(s): {', '.join(sorted(unknown))}")
    cfg = BenchConfig.quick(**kw) if quick else BenchConfig(**kw)
    result = Context(cfg).run(progress)
    if json_path:
        write_json(result, json_path)
        result["meta"]["json_path"] = str(json_path)
    if plot_path:
        try:
            write_plot(result, plot_path)
            result["meta"]["plot_path"] = str(plot_path)
        except ImportError as exc:
            result["skipped"]["plot"] = f"matplotlib is not installed ({exc}); pip install 'lcp-sandbox[plot]'"
    if out is not None:
        out.write(render_table(result))
        out.flush()
    return result
