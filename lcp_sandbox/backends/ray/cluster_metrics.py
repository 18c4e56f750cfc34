"""The numbers of a Ray backend: every node's ``Supervisor.metrics()`` made one.

    node agents ── metrics() ──► [(node id, snapshot), ...] ──► merged():
        calls              each node's rows, each with "node"
        workers            summed; per node under "nodes"[id]["workers"]
        call_duration_s    the histograms' buckets, sums and counts added
        worker_starts, worker_ends, refusals, egress, env_builds   added (env_builds'
                           longest build: the longest of all)

A node's counters live in its agent: a node lost takes its counts with it (its series
end, as a restarted exporter's do).
"""
from __future__ import annotations

from typing import Any


def _add(into: dict, more: dict) -> None:
    """Add the numbers of ``more`` into ``into``, key by key (dicts within, recursively)."""
    for key, value in more.items():
        if isinstance(value, dict):
            _add(into.setdefault(key, {}), value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            into[key] = into.get(key, 0) + value


def _histogram(into: dict, more: dict) -> None:
    if not into["buckets"]:
        into["buckets"] = [(le, 0) for le, _ in more.get("buckets", ())]
    into["buckets"] = [(le, n + m) for (le, n), (_, m) in zip(into["buckets"], more["buckets"],
                                                              strict=True)]
    into["sum"] += more.get("sum", 0.0)
    into["count"] += more.get("count", 0)


def merged(per_node: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One snapshot of the shape of ``Supervisor.metrics()`` for the whole cluster, its call
    rows labelled with their node, plus ``"nodes"``: each node's live workers by state."""
    out: dict[str, Any] = {"calls": [], "call_duration_s": {"buckets": [], "sum": 0.0,
                                                            "count": 0},
                           "worker_starts": {}, "worker_ends": {}, "refusals": {}, "egress": {},
                           "workers": {"idle": 0, "busy": 0}, "worker_uss_bytes": 0,
                           "templates": 0, "env_builds": {}, "nodes": {}}
    longest = 0.0
    for node, snap in per_node:
        out["calls"] += [{**row, "node": node} for row in snap.get("calls", ())]
        if snap.get("call_duration_s", {}).get("buckets"):
            _histogram(out["call_duration_s"], snap["call_duration_s"])
        for key in ("worker_starts", "worker_ends", "refusals", "egress", "workers"):
            _add(out[key], snap.get(key) or {})
        out["worker_uss_bytes"] += snap.get("worker_uss_bytes", 0)
        out["templates"] += snap.get("templates", 0)
        builds = dict(snap.get("env_builds") or {})
        longest = max(longest, builds.pop("seconds_max", 0.0) or 0.0)
        _add(out["env_builds"], builds)
        out["nodes"][node] = {"workers": dict(snap.get("workers") or {})}
    out["env_builds"]["seconds_max"] = longest
    return out
