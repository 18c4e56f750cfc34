"""Smoke test of the benchmark harness: it runs end to end on a tiny budget and
writes its JSON and PNG.  No timing is asserted, only that every figure exists."""
import importlib.util
import io
import json
import math
import os
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO

from benchmarks import harness as bench
from benchmarks import run_bench
from benchmarks.harness import percentile

TINY = dict(calls=40, rounds=2, subprocess_calls=2, cold_reps=2, zygote_reps=1, duration_s=0.1,
            throughput_rounds=1, mem_calls=200, discovery_files=30, discovery_reps=1,
            routing_workers=8, routing_calls=40, routing_rounds=2, routing_window_s=0.05,
            density_tenants=3, density_idle_tenants=1, density_idle_s=0.1, density_calls=40, density_rounds=1,
            density_window_s=0.05, confined_tenants=3, egress_gets=10, egress_bulk_mb=4, mcp_calls=10, mcp_rounds=1, mcp_sessions=3, spawn_bursts=2,
            skip=("ray",))

TARGET_NAMES = {"warm_p50", "warm_p99", "warm_p50_inprocess", "cold_vs_spawn", "parallel", "uss_first", "uss_after",
                "discovery_first", "discovery_again", "density_uss", "density_warm_p50", "density_host_idle_cpu",
                "density_pool_idle_runs", "density_stats_ms", "cold_p50", "cold_p99", "uss_plain", "template_p50",
                "fresh_over_template", "uss_template", "syscalls_warm_p50", "confined_np_p50",
                "confined_np_ratio", "uss_confined_np", "confined_plain_ratio", "confined_density_uss",
                "confined_namespaces_ratio", "compiled_open", "compiled_confined", "egress_ratio", "egress_added_ms", "egress_bulk", "secrets_added_ms", "secrets_bulk", "mcp_warm_sdk", "mcp_warm_plain", "mcp_token_sdk", "mcp_token_plain", "metrics_share", "density_metrics_ms",
                "spawn_path_cold_vs_spawn", "spawn_path_warm_vs_zygote", "spawn_path_burst_vs_spawn",
                "envs_first_call", "envs_fresh_host",
                "envs_warm", "envs_build_5"}


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not math.isnan(v) and v >= 0


def test_percentile_and_summary():
    xs = [1, 2, 3, 4]
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 0) == 1 and percentile(xs, 100) == 4
    s = bench.summarize([3000, 1000, 2000], 1000.0)
    assert s["n"] == 3 and s["p50"] == 2.0 and s["max"] == 3.0 and s["min"] == 1.0


def test_bench_end_to_end(tmp_path, new_processes):
    json_path, png_path = tmp_path / "bench.json", tmp_path / "bench.png"
    out = io.StringIO()
    result = run_bench(json_path=str(json_path), plot_path=str(png_path), out=out, **TINY)
    assert new_processes() == set()            # every worker, zygote and baseline process is gone

    data = json.loads(json_path.read_text())
    assert set(data) >= {"meta", "warm", "routing", "density", "cold", "throughput", "memory", "discovery", "targets",
                         "skipped"}
    assert data["meta"]["timer_overhead_ns"] >= 0

    # warm: the floor and the sandbox in every placement, each with its ratio to the floor
    assert data["warm"], "no warm figures"
    for placement, rows in data["warm"].items():
        for key in ("floor", "pickle", "sandbox", "ppe", "subprocess"):
            row = rows[key]
            assert row["n"] > 0 and len(row["samples_us"]) == row["n"]
            for k in ("p50", "p90", "p99", "max", "x_floor_p50", "x_floor_p99"):
                assert _number(row[k]), (placement, key, k)
        assert rows["floor"]["x_floor_p50"] == pytest.approx(1.0)
        assert rows["pickle"]["label"] == "pickle RPC (no engine)" and rows["pickle"]["kind"] == "pickle"
        if "inprocess" not in data["skipped"]:
            assert _number(rows["inprocess"]["x_floor_p50"])
        # the sandbox's spin counters over the timed batches: every timed call is counted once
        spin = rows["sandbox"]["spin"]
        assert spin["host_hits"] + spin["host_misses"] + spin["off_busy"] <= rows["sandbox"]["n"]
        assert spin["host_hit_rate"] is None or 0 <= spin["host_hit_rate"] <= 1

    # routing: one worker's warm calls with 1 live worker in the pool vs many (8 here, 200 by default)
    rt = data["routing"]
    assert "routing" not in data["skipped"]
    assert rt["workers"] == 8 and rt["tenants"] == 2 and rt["libraries"] == 4
    assert rt["measured"]["restarts"] == 0
    for cond, live in (("one", 1), ("many", 8)):
        row = rt["rows"][cond]
        assert row["live_workers"] == live and row["live_workers_seen"] == [live]
        assert row["n"] == TINY["routing_calls"] and len(row["samples_us"]) == row["n"]
        for k in ("p50", "p90", "p99", "max", "x_one_p50", "x_one_p99"):
            assert _number(row[k]), (cond, k)
    assert rt["rows"]["one"]["x_one_p50"] == pytest.approx(1.0)
    for k in ("p50", "p90", "p99", "p50_paired", "p99_paired"):
        assert _number(rt["ratio"][k]) and rt["ratio"][k] > 0, k

    # breakdown: the engine's parts of a warm call, each side, and what they leave of its CPU
    bd = data["breakdown"]
    assert "breakdown" not in data["skipped"]
    assert [len(bd["host"]), len(bd["worker"])] == [3, 3]
    assert all(_number(r["us"]) and r["us"] > 0 for r in bd["host"] + bd["worker"])
    for side in ("host", "worker"):
        assert bd[f"{side}_rest_us"] == pytest.approx(bd[f"{side}_total_us"] - sum(r["us"] for r in bd[side]))
    assert "BREAKDOWN" in out.getvalue()

    # density: 3 tenants x 4 libraries live in one supervisor, the first tenant's idle alone
    dn = data["density"]
    assert "density" not in data["skipped"]
    assert dn["workers"] == dn["answered"] == 12 and dn["idle_pool_workers"] == 4
    assert dn["uss_mb"]["live_workers"] == 12 and dn["uss_mb"]["template_count"] >= 1
    for k in ("workers", "templates", "zygote", "host", "total"):
        assert _number(dn["uss_mb"][k]), k
    assert dn["fds"]["per_worker"] >= 1 and dn["left"] == {"processes": 0, "fds": 0, "tmpdirs": 0}
    for idle in (dn["idle_all"], dn["idle_pool"]):
        assert _number(idle["host_cpu_fraction"]) and _number(idle["pool_runs"])
    assert _number(dn["stats_ms"]["p50"]) and _number(dn["ratio"]["p50"])
    assert dn["rows"]["many"]["live_workers_seen"] == [12] and dn["rows"]["one"]["live_workers_seen"] == [1]

    # syscalls: a confined worker with its allowlist on and off, in the same rounds
    sc = data["syscalls"]
    assert "syscalls" not in data["skipped"]
    assert sc["states"]["filter"].startswith("allowlist") and sc["states"]["no_filter"].startswith("unavailable")
    for k in ("cold_filter", "cold_no_filter", "warm_filter", "warm_no_filter"):
        assert _number(sc["rows"][k]["p50"]), k
    assert _number(sc["warm_ratio"]) and _number(sc["cold_ratio"])
    assert "SYSCALLS" in out.getvalue()

    # mcp: serve-mcp beside a bare SDK server, both clients; sessions a second; metrics' cost
    mcp = data["mcp"]
    assert "mcp" not in data["skipped"]
    for k in ("ours_sdk", "bare_sdk", "ours_plain", "bare_plain", "token_sdk", "token_plain"):
        assert _number(mcp["warm_ms"][k]["p50"]), k
    assert _number(mcp["warm_ms"]["token_plain"]["x_ours_p50"])
    assert _number(mcp["warm_ms"]["ours_plain"]["x_bare_p50"]) and mcp["sessions_per_s"]["per_s"] > 0
    assert _number(mcp["metrics"]["share_of_warm_call"])
    assert "MCP  warm tools/call" in out.getvalue()
    # egress: a GET through a network policy's proxy against a direct one; its memory
    eg = data["egress"]
    assert "egress" not in data["skipped"]
    assert _number(eg["ratio"]) and eg["connections_per_s"]["policy"] > 0
    assert eg["memory"]["workers"] == 1000 and eg["network"].startswith("policy (1 rules")
    assert "EGRESS" in out.getvalue()
    # secrets: an HTTPS GET whose secret the proxy puts in, against a tunnel and direct
    sc = data["secrets"]
    assert "secrets" not in data["skipped"]
    assert _number(sc["rows"]["kept"]["added_us"]) and _number(sc["bulk"]["ratio"])
    assert "secrets BENCH_KEY: placeholders only" in sc["network"]
    assert "SECRETS" in out.getvalue()
    # confined: a new confined tenant's first call against the same unconfined; density
    cf = data["confined"]
    assert "confined" not in data["skipped"]
    for k in ("np_open", "np_confined", "plain_open", "plain_confined", "new_open", "new_confined",
              "plain_fresh", "plain_flat", "plain_shareduid"):
        assert _number(cf["rows"][k]["p50"]) and _number(cf["uss_mb"][k]), k
    assert _number(cf["np_ratio"]) and _number(cf["plain_ratio"]) and _number(cf["namespaces_ratio"])
    assert _number(cf["uid_per_tenant_ratio"])
    assert cf["density"]["answered"] == cf["density"]["calls"] == 6
    assert cf["density"]["left"] == {"processes": 0, "descriptors": 0, "temp_dirs": 0}
    if os.geteuid() == 0:                # a default container, emulated, against this root host
        ct = cf["container"]
        assert _number(ct["first_ratio"]) and _number(ct["warm_ratio"]), ct
        assert ct["rows"]["docker_first"]["n"] == ct["rows"]["root_first"]["n"] >= 4
        # one uid for all in that container: the host's guard against Landlock's scope
        gd = cf["guard"]
        assert _number(gd["first_ratio"]) and _number(gd["warm_ratio"]), gd
        assert gd["rows"]["guard_first"]["n"] == gd["rows"]["scope_first"]["n"] >= 4
    assert "CONFINED" in out.getvalue()
    # compiled: a library without a .pyc, the host's compiled code against the worker compiling
    cc = data["compiled"]
    assert "compiled" not in data["skipped"]
    for k in ("open_host", "open_worker", "confined_host", "confined_worker"):
        assert cc["rows"][k]["n"] == 4 and _number(cc["rows"][k]["p50"]), k
    assert _number(cc["open_ratio_paired"]) and _number(cc["confined_ratio_paired"])
    assert "COMPILED" in out.getvalue()
    # envs: a library with its own environment against the same without; a 5-wheel build
    ev = data["envs"]
    assert "envs" not in data["skipped"]
    for k in ("first_env", "first_plain", "fresh_host_env", "fresh_host_plain", "warm_env", "warm_plain",
              "build_5"):
        assert _number(ev["rows"][k]["p50"]), k
    assert _number(ev["first_ratio"]) and _number(ev["fresh_host_ratio"]) and _number(ev["build_5_s"])
    assert "ENVIRONMENTS" in out.getvalue()

    # cold: phases from the stamps, ratios to spawn
    cold = data["cold"]
    for key in ("sandbox", "sandbox_heavy", "spawn", "subprocess", "ppe", "zygote_start", "new_host"):
        assert _number(cold[key]["p50"]), key
        assert _number(cold[key]["x_spawn_p50"]), key
    for key in ("sandbox", "spawn"):
        assert set(cold[key]["phases"]) == {"start", "import_init", "call"}

    tp = {(r["path"], r["tool"], r["libraries"], r["threads"]): r for r in data["throughput"]}
    assert _number(tp[("sandbox", "tool_cpu", 2, 2)]["x_one"])
    assert _number(tp[("sandbox", "tool_cpu", 1, 1)]["calls_per_s"])

    mem = {r["key"]: r for r in data["memory"]}
    assert _number(mem["small_first"]["uss_mb"]) and _number(mem["small_after"]["rss_mb"])
    assert mem["small_after"]["calls"] == TINY["mem_calls"]

    assert data["discovery"]["files"] == 30 and data["discovery"]["tools"] == 60
    assert _number(data["discovery"]["sandbox"]["again"]["p50"])

    targets = {t["name"]: t for t in data["targets"]}
    burst = data["spawn_burst"]
    assert burst["bursts"] == len(burst["ms"]) == len(burst["p50s"]) == 2
    assert all(len(ms) == burst["n"] == 15 and all(_number(v) for v in ms) for ms in burst["ms"])
    assert burst["p50"] == sorted(burst["p50s"])[0] + (sorted(burst["p50s"])[1] - sorted(burst["p50s"])[0]) / 2
    assert set(targets) == TARGET_NAMES
    for t in targets.values():
        if t["name"] == "warm_p50_inprocess" and "inprocess" in data["skipped"]:
            continue
        assert _number(t["value"]), t
        assert t["met"] in (True, False)

    table = out.getvalue()
    for heading in ("WARM", "ROUTING", "DENSITY", "COLD", "THROUGHPUT", "MEMORY", "DISCOVERY", "TARGETS"):
        assert heading in table
    assert "pickle RPC (no engine)" in table
    assert "sandbox (spawn path) tool_noop" in table and "sandbox (spawn path) tool_stamp" in table
    assert result["targets"] == data["targets"]

    if not _has_matplotlib():
        assert "plot" in result["skipped"]
        pytest.skip("matplotlib is not installed: the PNG part needs the 'plot' extra")
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_command_line_with_a_host_folder(tmp_path, capsys):
    from lcp_sandbox.fronts.cli import main
    folder = tmp_path / "mytools"
    shutil.copytree(FIXTURES / "libs" / "other", folder / "other")
    json_path = tmp_path / "b.json"
    rc = main(["bench", str(folder), "--tool", "tool_other_set", "--params", '{"value": "x"}',
               "--calls", "20", "--rounds", "1", "--cold", "1", "--discovery-files", "5",
               "--mem-calls", "10", "--no-progress", "--json", str(json_path),
               "--skip", "pickle,ppe,subprocess,spawn,routing,density,throughput,ray,egress,"
               "secrets,mcp,envs,confined,compiled,templates,syscalls"])
    assert rc == 0
    data = json.loads(json_path.read_text())
    for rows in data["warm"].values():
        assert _number(rows["sandbox:tool_other_set"]["p50"])
        assert _number(rows["sandbox:tool_other_set"]["x_floor_p50"])
    assert _number(data["cold"]["sandbox:tool_other_set"]["p50"])
    assert any(r["key"] == "user" and _number(r.get("uss_mb")) for r in data["memory"])
    assert data["skipped"]["ppe"] == "skipped by request"
    assert data["skipped"]["pickle"] == "skipped by request"
    assert all("pickle" not in rows for rows in data["warm"].values())
    assert data["skipped"]["routing"] == "skipped by request" and data["routing"] == {}
    assert "sandbox tool_other_set" in capsys.readouterr().out


def test_bench_rejects_bad_options():
    from lcp_sandbox.fronts.cli import main
    assert main(["bench", "--skip", "nonsense", "--no-progress"]) == 2
    assert main(["bench", "--params", "{not json", "--no-progress"]) == 2
    with pytest.raises(TypeError):
        run_bench(no_such_option=1)


@pytest.mark.ray
def test_bench_ray_section(ray_cluster, tmp_path):
    """The Ray section on the session's cluster: warm rows beside the bare actor call, cold
    first calls on the other node, serve-mcp --ray beside serve-mcp, its three targets."""
    pytest.importorskip("ray")
    skip = ("pickle", "inprocess", "ppe", "subprocess", "spawn", "routing", "density", "throughput", "memory",
            "discovery")
    out = io.StringIO()
    result = run_bench(out=out, **{**TINY, "skip": skip}, ray_calls=20, ray_rounds=2, ray_cold_reps=2)
    ray = result["ray"]
    assert "ray" not in result["skipped"] and ray["nodes"] == 2 and ray["cluster"] == "existing"
    for key in ("ray", "actor", "local"):
        assert _number(ray["warm"][key]["p50"]) and _number(ray["warm"][key]["x_actor_p50"])
    assert ray["cold"]["ray_remote"]["n"] == 2 and _number(ray["cold"]["ray_remote"]["p50"])
    targets = {t["name"]: t for t in result["targets"]}
    assert targets["ray_warm_vs_actor"]["met"] in (True, False) and targets["ray_cold_ms"]["met"] in (True, False)
    if importlib.util.find_spec("mcp") is not None:
        assert _number(ray["mcp"]["ray"]["p50"]) and _number(ray["mcp"]["ray"]["x_local_p50"])
        assert targets["ray_mcp_warm"]["met"] in (True, False) and "serve-mcp --ray" in out.getvalue()
    assert "RAY" in out.getvalue() and "bare Ray actor method" in out.getvalue()


def test_trees_measures_each_checkouts_engine_and_pairs_the_rounds(tmp_path, capsys):
    """benchmarks/trees.py: each checkout's own lcp_sandbox runs (a copy that answers
    differently is seen), and a ratio is the median of the rounds' ratios."""
    from benchmarks import trees
    here = trees.measure(REPO, 20)
    assert set(here) == {"start", "first", "warm", "uss"} and all(v > 0 for v in here.values())
    # A checkout whose engine fails is not measured with this one's.
    broken = tmp_path / "broken"
    (broken / "lcp_sandbox").mkdir(parents=True)
    (broken / "lcp_sandbox" / "__init__.py").write_text("raise ImportError('the broken tree')\n")
    with pytest.raises(Exception, match="returned non-zero"):
        trees.measure(broken, 20)
    a, b = Path("a"), Path("b")
    runs = {a: [dict.fromkeys(trees._UNITS, 1.0), dict.fromkeys(trees._UNITS, 4.0)],
            b: [dict.fromkeys(trees._UNITS, 2.0), dict.fromkeys(trees._UNITS, 2.0)]}
    rows = trees.table([a, b], runs).splitlines()
    # b's rounds: 2/1 and 2/4, median 1.25; its own median 2 (the warm column in us).
    assert rows[3].startswith("| b |") and "(1.25x)" in rows[3] and "(1.00x)" in rows[2]
