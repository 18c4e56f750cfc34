"""What a benchmark run measures and how much of it: ``BenchConfig``, the targets."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class BenchConfig:
    folder: Optional[str] = None          # a host's own tools folder (adds rows for --tool)
    tool: Optional[str] = None
    params: dict = field(default_factory=dict)
    calls: int = 10000                    # warm calls per path and placement
    rounds: int = 40                      # warm rounds (paths interleaved in each)
    subprocess_calls: int = 20            # warm calls of the `python -c` path per placement
    cold_reps: int = 30                   # fresh starts per cold path
    zygote_reps: int = 5                  # fresh supervisors (zygote start, new-host first call)
    duration_s: float = 0.6               # throughput: seconds per measurement
    throughput_rounds: int = 5
    cpu_ms: float = 1.0                   # throughput: CPU work per call of tool_cpu
    mem_calls: int = 25000                # memory: calls before the second reading
    discovery_files: int = 1000
    discovery_reps: int = 3
    routing_workers: int = 200            # routing: live workers in the "many" condition (4 per tenant)
    routing_calls: int = 5000             # routing: calls per condition (1 live / many live)
    routing_rounds: int = 8               # routing: rounds, the two conditions alternating
    routing_window_s: float = 1.0         # routing: each batch's calls spread over this long
    density_tenants: int = 250            # density: tenants x 4 libraries = live workers
    density_idle_tenants: int = 50        # density: the idle pool measured first (200 workers)
    density_idle_s: float = 3.0           # density: seconds of idle CPU measured
    density_calls: int = 3000             # density: warm calls per condition (1 live / all live)
    density_rounds: int = 6               # density: rounds, the two conditions alternating
    density_window_s: float = 1.0         # density: each batch's calls spread over this long
    confined_tenants: int = 200           # confined: tenants x (numpy + plain library) at once
    egress_gets: int = 200                # egress: GETs per kind and round
    egress_bulk_mb: int = 200             # egress: the body read whole, direct and through the proxy
    ray_calls: int = 300                  # ray: warm calls per path and round
    ray_rounds: int = 8                   # ray: warm rounds (the paths interleaved)
    ray_cold_reps: int = 10               # ray: first calls of a new library on the other node
    mcp_calls: int = 200                  # mcp: warm tools/call per path and round
    mcp_rounds: int = 6                   # mcp: warm rounds (the four paths interleaved)
    mcp_sessions: int = 60                # mcp: sessions opened one after another (+ a first call)
    spawn_bursts: int = 3                 # spawn path: bursts of new libraries, each on a new supervisor
    cpus: Optional[tuple] = None          # (host CPU, worker CPU); default: the first two allowed
    skip: tuple = ()                      # any of SKIPPABLE
    seed: int = 1
    binding_kwargs: dict = field(default_factory=dict)   # extra SandboxedBinding keywords for --folder

    @classmethod
    def quick(cls, **kw: Any) -> "BenchConfig":
        base = dict(calls=2000, rounds=10, subprocess_calls=6, cold_reps=10, zygote_reps=2,
                    duration_s=0.4, throughput_rounds=3, mem_calls=5000, discovery_reps=2,
                    routing_workers=40, routing_calls=1200, routing_rounds=4, routing_window_s=0.5,
                    density_tenants=50, density_idle_tenants=25, density_idle_s=1.0, density_calls=400,
                    density_rounds=2, density_window_s=0.3, confined_tenants=40, egress_gets=60,
                    ray_calls=150, ray_rounds=4, ray_cold_reps=6,
                    mcp_calls=80, mcp_rounds=3, mcp_sessions=20, spawn_bursts=2)
        base.update(kw)
        return cls(**base)


SKIPPABLE = ("floor", "pickle", "inprocess", "ppe", "subprocess", "spawn", "spawn_path", "breakdown", "routing",
             "density", "throughput", "memory", "discovery", "templates", "syscalls", "confined", "compiled", "egress",
             "secrets", "mcp",
             "ray", "envs")

TARGETS = {
    "warm_p50": 1.05, "warm_p99": 1.25, "warm_p50_inprocess": 1.0, "cold_vs_spawn": 0.06, "parallel": 1.9,
    "uss_mb": 8.0, "discovery_first_s": 1.0, "discovery_again_s": 0.05,
    "ray_warm_vs_actor": 1.1, "ray_cold_ms": 15.0, "ray_mcp_warm": 1.25,
    "density_uss_mb": 4096.0, "density_warm_p50": 1.1, "density_host_idle_cpu": 0.005,
    "density_pool_idle_runs": 0, "density_stats_ms": 20.0,
    "cold_p50_ms": 1.0, "cold_p99_ms": 4.0, "uss_plain_mb": 2.0,
    "template_p50_ms": 5.0, "fresh_over_template": 30.0, "uss_template_mb": 4.0,
    "syscalls_warm_p50": 1.03,
    "mcp_warm_sdk": 1.1, "mcp_warm_plain": 1.1, "mcp_token_sdk": 1.05, "mcp_token_plain": 1.05, "metrics_share": 0.02, "density_metrics_ms": 5.0,
    "confined_np_p50_ms": 5.0, "confined_np_ratio": 1.2, "uss_confined_np_mb": 4.0,
    "confined_plain_ratio": 1.2, "confined_density_uss_mb": 1536.0,
    "confined_namespaces_ratio": 1.5, "compiled_open": 0.5, "compiled_confined": 0.5,
    "egress_ratio": 1.2, "egress_added_ms": 0.2, "egress_bulk": 0.9,
    # a secret put in by the proxy (benchmarks/secrets.py)
    "secrets_added_ms": 1.0, "secrets_bulk": 0.5,
    # the spawn start path (Supervisor(start_method="spawn"), what macOS and Windows run)
    "spawn_path_cold_vs_spawn": 0.25, "spawn_path_warm_vs_zygote": 1.2, "spawn_path_burst_vs_spawn": 0.25,
    # a library with its own environment (benchmarks/envs.py) vs the same without one
    "envs_first_call": 2.0, "envs_fresh_host": 3.0, "envs_warm": 1.03, "envs_build_5_s": 1.0,
}

# The sandbox's 2 x 2 scaling may exceed the machine's ceiling measured in the same rounds
# (the same CPU work in 2 processes vs 1, no IPC) by this much before it counts as noise.
CEILING_TOLERANCE = 0.05
