"""The engine's counters (backends/metrics.py) and the MCP front's rate bookkeeping
(fronts/mcp_limits.py): exact under threads, cumulative buckets, rates and waits."""
import threading

from lcp_sandbox.backends.metrics import DURATION_BUCKETS_S, Metrics
from lcp_sandbox.fronts.mcp_limits import TokenBucket, default_max_sessions, retry_after


def test_counts_stay_exact_when_many_threads_count_at_once():
    m = Metrics()
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait()
        for _ in range(2000):
            m.call("lib", f"tool_{i % 2}", 200, 0.0001)
            m.started("fresh")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = m.snapshot()
    assert {(c["tool"], c["count"]) for c in snap["calls"]} == {("tool_0", 8000), ("tool_1", 8000)}
    assert snap["call_duration_s"]["count"] == 16000 and snap["worker_starts"] == {"fresh": 16000}


def test_duration_buckets_are_cumulative_and_end_in_inf():
    m = Metrics()
    for seconds in (0.0001, 0.0007, 0.0007, 3.0, 120.0):
        m.call("lib", "t", 200, seconds)
    m.call("lib", "t", 504, 61.0)
    hist = m.snapshot()["call_duration_s"]
    les = [le for le, _ in hist["buckets"]]
    assert les == [*DURATION_BUCKETS_S, float("inf")]
    counts = dict(hist["buckets"])
    assert counts[0.0005] == 1 and counts[0.001] == 3 and counts[5.0] == 4 and counts[60.0] == 4
    assert counts[float("inf")] == 6 == hist["count"]
    assert abs(hist["sum"] - (0.0001 + 0.0014 + 3.0 + 120.0 + 61.0)) < 1e-9
    assert [c["status"] for c in m.snapshot()["calls"]] == [200, 504]


def test_ends_and_refusals_by_cause():
    m = Metrics()
    for cause in ("crash", "crash", "idle"):
        m.ended(cause)
    m.refused("quarantine")
    snap = m.snapshot()
    assert snap["worker_ends"] == {"crash": 2, "idle": 1} and snap["refusals"] == {"quarantine": 1}


def test_token_bucket_allows_a_burst_then_the_rate():
    b = TokenBucket(rate=2.0, burst=3.0)
    assert [b.take(100.0) for _ in range(3)] == [None, None, None]
    wait = b.take(100.0)
    assert wait is not None and abs(wait - 0.5) < 1e-9          # one token every 0.5 s
    assert b.take(100.5) is None and b.take(100.5) is not None
    assert b.take(200.0) is None                                 # refilled, capped at the burst
    assert [b.take(200.0) for _ in range(3)][-1] is not None


def test_retry_after_is_whole_seconds_at_least_one():
    assert retry_after(0.01) == "1" and retry_after(1.2) == "2" and retry_after(3.0) == "3"
    assert 16 <= default_max_sessions() <= 4096


def test_the_exposition_parses_as_prometheus_text_with_the_counts_kept():
    from prometheus_client.parser import text_string_to_metric_families

    from lcp_sandbox.fronts.mcp_metrics import exposition
    m = Metrics()
    m.call("workspace_tools", "tool_read_file", 200, 0.002)
    m.call("workspace_tools", "tool_read_file", 504, 7.0)
    m.started("template")
    m.ended("timeout")
    m.refused("quarantine")
    builds = {"ok": 2, "failed": 1, "seconds_total": 0.75, "seconds_max": 0.5, "in_flight": 0}
    text = exposition(lambda: {**m.snapshot(), "workers": {"idle": 3, "busy": 1}, "sessions": 2,
                               "refusals": {"rate": 4, **m.snapshot()["refusals"]},
                               "env_builds": builds})().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    calls = "lcp_sandbox_tool_calls_total"
    assert samples[(calls, (("library", "workspace_tools"), ("status", "200"),
                            ("tool", "tool_read_file")))] == 1
    assert samples[("lcp_sandbox_tool_call_duration_seconds_count", ())] == 2
    assert samples[("lcp_sandbox_tool_call_duration_seconds_bucket", (("le", "0.0025"),))] == 1
    assert samples[("lcp_sandbox_tool_call_duration_seconds_bucket", (("le", "+Inf"),))] == 2
    assert samples[("lcp_sandbox_worker_starts_total", (("kind", "template"),))] == 1
    assert samples[("lcp_sandbox_worker_deaths_total", (("cause", "timeout"),))] == 1
    assert samples[("lcp_sandbox_refusals_total", (("reason", "rate"),))] == 4
    assert samples[("lcp_sandbox_workers", (("state", "busy"),))] == 1
    assert samples[("lcp_sandbox_sessions", ())] == 2
    assert samples[("lcp_sandbox_env_builds_total", (("outcome", "ok"),))] == 2
    assert samples[("lcp_sandbox_env_builds_total", (("outcome", "failed"),))] == 1
    assert samples[("lcp_sandbox_env_build_seconds_total", ())] == 0.75
