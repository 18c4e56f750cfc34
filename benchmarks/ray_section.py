"""RAY: the same calls through RaySupervisor, beside the cost of Ray itself.

    a Ray cluster: the one this process is already connected to, or a local one made for
    the section (a head and one more node, one CPU each, every process on this machine)
    warm   rounds × paths in random order, each a batch of calls:
             ray     SandboxedBinding on RaySupervisor, tool_noop, its slot on the other node
             actor   a bare Ray actor method returning its argument, on that same node
             hop     the floor of a worker process per tenant: the same actor's method making
                     one round trip over a pipe to a process of its own first (no engine)
             local   SandboxedBinding on the local Supervisor (the run's), tool_noop
    cold   a new tenant's first call of bench_noop (a never-run worker: placement, the INIT
           built in the driver, a fork on the node), kept when its slot landed on the
           other node (placement alternates); the local Supervisor's beside it
    mcp    a warm tools/call (plain kept-alive HTTP, tool_noop) through ``serve-mcp --ray``
           on that cluster and through ``serve-mcp`` on this machine, rounds interleaved
           (the mcp extra; the MCP section's client)

Public API only: SandboxedBinding, RaySupervisor (start, stats()[i]["node"], close), the
command line and Ray's own.
"""
from __future__ import annotations

import gc
import tempfile
import time
from pathlib import Path
from typing import Any

from lcp_sandbox import SandboxedBinding

from .harness import interleaved, paired_ratio, pin_thread, ratio, summarize
from .mcp_section import HOP_CHILD

ECHO_ARG = {"tool": "tool_noop", "params": {}, "workspace": "/srv/workspaces/bench"}


def _cluster(ray: Any) -> Any:
    """A local two-node cluster for the section (None when Ray is already connected)."""
    if ray.is_initialized():
        return None
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    return cluster


def _batch(fn: Any, n: int) -> list:
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def run(ctx: Any, prog: Any) -> None:
    cfg = ctx.cfg
    try:
        import ray
    except ImportError:
        ctx.skipped["ray"] = "ray is not installed (pip install 'lcp-sandbox[ray]')"
        return
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from lcp_sandbox import RaySupervisor
    pin_thread(ctx.all_cpus)
    t0 = time.perf_counter()
    cluster = _cluster(ray)
    made: list = []
    sup = RaySupervisor()
    try:
        sup.start()
        up_s = time.perf_counter() - t0
        here = ray.get_runtime_context().get_node_id()
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        remote = next(iter(sorted(nodes - {here})), here)

        def binding(tenant: str, backend: Any = sup) -> SandboxedBinding:
            b = SandboxedBinding(tools_folders=[str(ctx.libs)], workspace=ctx.ws, supervisor=backend, tenant=tenant)
            made.append(b)
            return b

        warm_b = None
        for i in range(8):                             # a slot on the other node (placement alternates)
            b = binding(f"bench-ray-warm-{i}")
            b.execute_tool("tool_noop", {})
            if b.stats()[0]["node"] == remote:
                warm_b = b
                break
        if warm_b is None:
            raise RuntimeError("no slot landed on the other node")

        @ray.remote(num_cpus=0)
        class Echo:
            def __init__(self, child: str) -> None:
                import subprocess
                import sys
                self.child = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, bufsize=0)

            def echo(self, x: Any) -> Any:
                return x

            def hop(self, x: Any) -> Any:
                import os
                os.write(self.child.stdin.fileno(), b'{"tool": "tool_noop", "params": {}, "cwd": "/"}')
                os.read(self.child.stdout.fileno(), 65536)
                return x
        echo = Echo.options(scheduling_strategy=NodeAffinitySchedulingStrategy(remote, soft=False)).remote(HOP_CHILD)
        paths = {"ray": lambda: warm_b.execute_tool("tool_noop", {}),
                 "actor": lambda: ray.get(echo.echo.remote(ECHO_ARG)),
                 "hop": lambda: ray.get(echo.hop.remote(ECHO_ARG)),
                 "local": lambda: ctx.binding.execute_tool("tool_noop", {})}
        for fn in paths.values():
            _batch(fn, 20)                             # warm-up
        rounds = max(1, cfg.ray_rounds)
        samples, per_round = interleaved(
            {k: (lambda fn=fn: _batch(fn, cfg.ray_calls)) for k, fn in paths.items()}, rounds,
            ctx.rng, lambda r: prog.step("ray", f"warm round {r + 1}/{rounds}"), collect=True)
        labels = {"ray": "RaySupervisor warm call (other node)", "actor": "bare Ray actor method (same node)",
                  "hop": "the actor + one pipe round trip (the floor)", "local": "local Supervisor warm call"}
        warm = {}
        for key, xs in samples.items():
            row = summarize(xs, 1e3)                  # microseconds
            row["label"] = labels[key]
            warm[key] = row
        for key, row in warm.items():
            row["x_actor_p50"] = ratio(row.get("p50"), warm["actor"].get("p50"))
            row["x_actor_p50_paired"] = paired_ratio(per_round[key], per_round["actor"])

        cold: dict = {"ray_remote": [], "local": []}
        for i in range(max(1, cfg.ray_cold_reps) * 3):
            if len(cold["ray_remote"]) >= cfg.ray_cold_reps and len(cold["local"]) >= cfg.ray_cold_reps:
                break
            for key, backend in (("ray_remote", sup), ("local", ctx.sup)):
                if len(cold[key]) >= cfg.ray_cold_reps:
                    continue
                b = binding(f"bench-ray-cold-{key}-{i}", backend)
                gc.collect()
                t = time.perf_counter()
                r = b.execute_tool("tool_stamp", {})
                dt = time.perf_counter() - t
                if r.get("status_code") != 200:
                    raise RuntimeError(f"cold call failed: {r.get('error')}")
                if key == "local" or b.stats()[0]["node"] == remote:
                    cold[key].append(dt)          # (kept open: the next slot goes to the other node)
            prog.step("ray", f"cold {i + 1}")
        cold_rows = {}
        for key, label in (("ray_remote", "RaySupervisor first call, new library, other node"),
                           ("local", "local Supervisor first call, new library")):
            row = summarize(cold[key], 1e-3)          # milliseconds
            row["label"] = label
            cold_rows[key] = row
        address = ray.get_runtime_context().gcs_address        # (this cluster, not "auto"'s)
        ctx.result["ray"] = {"nodes": len(nodes), "cluster": "made for the section" if cluster else "existing",
                             "setup_s": up_s, "warm": warm, "cold": cold_rows,
                             "mcp": _mcp_rows(ctx, prog, address)}
    finally:
        for b in made:
            b.close()
        sup.close()
        if cluster is not None:
            ray.shutdown()
            cluster.shutdown()


def _mcp_rows(ctx: Any, prog: Any, address: str) -> dict:
    """Warm tools/call p50 (ms) through serve-mcp --ray ``address`` and serve-mcp on this
    machine, rounds interleaved; {} without the mcp extra."""
    try:
        import httpx2
    except ImportError:
        ctx.skipped["ray_mcp"] = "the mcp extra is not installed (pip install 'lcp-sandbox[mcp]')"
        return {}
    from .mcp_section import _plain_batch, _plain_session, _serve_ours
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-mcp-", dir=ctx.tmp))
    procs: list = []
    client = httpx2.Client(timeout=60)
    try:
        urls = {}
        for key, extra in (("ray", ("--ray", address)), ("local", ())):
            proc, urls[key] = _serve_ours(ctx, tmp, key, *extra, timeout=120.0)
            procs.append(proc)
        heads = {k: _plain_session(client, u) for k, u in urls.items()}
        paths = {k: (lambda n, u=u, h=heads[k]: _plain_batch(client, u, h, n)) for k, u in urls.items()}
        for fn in paths.values():
            fn(20)                                     # warm-up: the session's worker started
        rounds = max(1, ctx.cfg.ray_rounds)
        samples, per_round = interleaved(
            {k: (lambda fn=fn: fn(ctx.cfg.mcp_calls)) for k, fn in paths.items()}, rounds, ctx.rng,
            lambda r: prog.step("ray", f"serve-mcp round {r + 1}/{rounds}"))
        rows = {k: summarize(xs, 1e6) for k, xs in samples.items()}       # milliseconds
        rows["ray"]["x_local_p50"] = ratio(rows["ray"].get("p50"), rows["local"].get("p50"))
        rows["ray"]["x_local_p50_paired"] = paired_ratio(per_round["ray"], per_round["local"])
        return rows
    finally:
        client.close()
        for proc in procs:
            proc.terminate()
            proc.wait(60)
