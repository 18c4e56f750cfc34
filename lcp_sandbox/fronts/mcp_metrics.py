"""``GET /metrics``: the engine's numbers in Prometheus' text format.

    scrape ─► snapshot() (Supervisor.metrics() + the front's sessions and refusals, the
              egress proxy's open connections; over Ray, the call rows and the workers
              carry a node label: backends/ray/cluster_metrics.py)
           ─► families (prometheus_client's metric families) ─► text exposition format

The numbers are kept as events happen (backends/metrics.py, the watchdog's memory
samples), so a scrape reads counters: it never walks /proc, however many workers
live.  prometheus_client renders the text (escaping, the histogram's series).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

PREFIX = "lcp_sandbox"
CONTENT_TYPE = CONTENT_TYPE_LATEST


def _families(snap: dict[str, Any]) -> Iterator[Any]:
    rows = snap.get("calls", ())
    # Over Ray (the engine's rows carry "node"): a node label too.
    by_node = any("node" in row for row in rows)
    labels = ["library", "tool", "status", *(["node"] if by_node else [])]
    calls = CounterMetricFamily(f"{PREFIX}_tool_calls", "Tool calls by library, tool and status",
                                labels=labels)
    for row in rows:
        calls.add_metric([row["library"], row["tool"], str(row["status"]),
                          *([str(row.get("node"))] if by_node else [])], row["count"])
    yield calls
    hist = snap.get("call_duration_s") or {"buckets": [], "sum": 0.0}
    duration = HistogramMetricFamily(f"{PREFIX}_tool_call_duration_seconds",
                                     "Tool call duration, seconds, as the caller waited")
    duration.add_metric([], [(_le(le), n) for le, n in hist["buckets"]], hist["sum"])
    yield duration
    yield from _labelled(CounterMetricFamily, "worker_starts", "Worker starts by kind", "kind",
                         snap.get("worker_starts", {}))
    yield from _labelled(CounterMetricFamily, "worker_deaths", "Worker ends by cause", "cause",
                         snap.get("worker_ends", {}))
    yield from _labelled(CounterMetricFamily, "refusals", "Requests refused by reason", "reason",
                         snap.get("refusals", {}))
    yield from _labelled(CounterMetricFamily, "policy_refusals", "Tool calls refused by "
                         "--auth-policy, by tool", "tool", snap.get("policy_refusals", {}))
    yield from _workers(snap)
    builds = snap.get("env_builds") or {}
    yield from _labelled(CounterMetricFamily, "env_builds", "Library environments built, by "
                         "outcome", "outcome", {k: builds.get(k, 0) for k in ("ok", "failed")})
    seconds = CounterMetricFamily(f"{PREFIX}_env_build_seconds", "Time spent building library "
                                  "environments, seconds")
    seconds.add_metric([], builds.get("seconds_total", 0.0))
    yield seconds
    sessions = GaugeMetricFamily(f"{PREFIX}_sessions", "Live MCP sessions")
    sessions.add_metric([], snap.get("sessions", 0))
    yield sessions
    egress = snap.get("egress_open") or {}
    for key, text in (("connections", "Connections open through the egress proxy, host-wide"),
                      ("tenants", "Tenants holding a connection through the egress proxy")):
        gauge = GaugeMetricFamily(f"{PREFIX}_egress_open_{key}", text)
        gauge.add_metric([], egress.get(key, 0))
        yield gauge


def _workers(snap: dict[str, Any]) -> Iterator[Any]:
    """Live workers by state; by state and node when the engine says its nodes (Ray)."""
    nodes = snap.get("nodes")
    if not nodes:
        yield from _labelled(GaugeMetricFamily, "workers", "Live workers by state", "state",
                             snap.get("workers", {}))
        return
    gauge = GaugeMetricFamily(f"{PREFIX}_workers", "Live workers by state and node",
                              labels=["state", "node"])
    for node, row in sorted(nodes.items()):
        for state, n in sorted(row.get("workers", {}).items()):
            gauge.add_metric([state, node], n)
    yield gauge


def _labelled(family: Callable[..., Any], name: str, text: str, label: str,
              values: dict[str, int]) -> Iterator[Any]:
    out = family(f"{PREFIX}_{name}", text, labels=[label])
    for key, n in sorted(values.items()):
        out.add_metric([key], n)
    yield out


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class _Snapshot(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        return _families(self._snapshot())


def exposition(snapshot: Callable[[], dict[str, Any]]) -> Callable[[], bytes]:
    """A function that renders ``snapshot()`` in the text format at each call."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(snapshot))
    return lambda: generate_latest(registry)
