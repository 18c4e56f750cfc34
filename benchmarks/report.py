"""The report of a run: the table on stdout, the JSON, the PNG."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional


PATHS = {"ceiling": "ceiling (no IPC)"}


def write_json(result: dict, path: str) -> None:
    """Every number and every sample."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)


def fmt(v: Any, digits: int = 3) -> str:
    """A number in a few significant digits, '-' when missing."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}" if digits <= 3 else f"{v:.1f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def x(v: Optional[float]) -> str:
    return "-" if v is None else (f"{v:,.0f}x" if v >= 100 else f"{v:.2f}x")


def pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def table(headers: list, rows: list, align: str) -> list:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]

    def line(cells: list) -> str:
        out = []
        for i, c in enumerate(cells):
            out.append(str(c).ljust(widths[i]) if align[i] == "l" else str(c).rjust(widths[i]))
        return "  ".join(out).rstrip()
    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]


def live_table(sec: dict) -> list:
    """The rows of a 1 live vs many live comparison (routing, density) and their ratios."""
    hdr = ["pool", "n", "p50", "p90", "p99", "max", "x 1 live p50", "p90", "p99", "cpu: host", "+threads",
           "worker", "runq"]
    rows = []
    for r in sec["rows"].values():
        c = r.get("cpu_us_per_call") or {}
        rows.append([r["label"], r["n"], fmt(r.get("p50")), fmt(r.get("p90")), fmt(r.get("p99")),
                     fmt(r.get("max")), x(r.get("x_one_p50")), x(r.get("x_one_p90")), x(r.get("x_one_p99")),
                     fmt(c.get("host_thread")), fmt(c.get("host_other_threads")), fmt(c.get("worker")),
                     fmt(sum(v for v in (r.get("runq_wait_us_per_call") or {}).values() if v) or None)])
    ra = sec.get("ratio", {})
    return table(hdr, rows, "lr" + "r" * (len(hdr) - 2)) + [
        f"  {sec['workers']} live vs 1 live: p50 {x(ra.get('p50'))}, p90 {x(ra.get('p90'))}, "
        f"p99 {x(ra.get('p99'))}; paired by round: p50 {x(ra.get('p50_paired'))}, "
        f"p90 {x(ra.get('p90_paired'))}, p99 {x(ra.get('p99_paired'))}"]


def density_lines(d: dict) -> list:
    """DENSITY: many live workers in one Supervisor (benchmarks/density.py)."""
    n, u, f, st = d["workers"], d.get("uss_mb", {}), d.get("fds", {}), d.get("stats_ms", {})

    def idle(i: dict) -> str:
        return (f"host threads {i.get('host_cpu_fraction', 0):.2%} of one CPU ({i.get('host_runs')} runs), "
                f"the pool's {i.get('processes')} processes {i.get('pool_cpu_fraction', 0):.2%} "
                f"({i.get('pool_runs')} runs)")
    left = d.get("left", {})
    return [f"DENSITY  one Supervisor, {n} live workers ({d['tenants']} tenants x 4 small libraries, one imports "
            f"numpy): all {d.get('answered')} answered; started in {fmt(d.get('start_s'))} s "
            f"({fmt(d.get('start_ms_per_worker'))} ms per worker)",
            f"  USS, MB: workers {fmt(u.get('workers'))} ({fmt(u.get('per_worker'))} each), templates "
            f"{fmt(u.get('templates'))} ({u.get('template_count')}), zygote {fmt(u.get('zygote'))}, host "
            f"{fmt(u.get('host'))}; total {fmt(u.get('total'))}",
            f"  idle {fmt(d.get('idle_all', {}).get('seconds'))} s, {n} workers: {idle(d.get('idle_all', {}))}",
            f"  idle {fmt(d.get('idle_pool', {}).get('seconds'))} s, {d['idle_pool_workers']} workers: "
            f"{idle(d.get('idle_pool', {}))}",
            f"  stats() over {n} workers p50 {fmt(st.get('p50'))} ms (p90 {fmt(st.get('p90'))}); pool_stats() "
            f"p50 {fmt(d.get('pool_stats_ms', {}).get('p50'))} ms; host descriptors per worker "
            f"{fmt(f.get('per_worker'))} (its socket, its output pipe), soft RLIMIT_NOFILE "
            f"{f.get('open_files_soft_limit')}",
            f"  right after a burst of calls: metrics() p50 "
            f"{fmt(d.get('after_burst_ms', {}).get('metrics', {}).get('p50'))} ms, stats() "
            f"{fmt(d.get('after_burst_ms', {}).get('stats', {}).get('p50'))} ms"] + live_table(d) + [
            f"  closed in {fmt(d.get('close_s'))} s, its processes gone {fmt(d.get('processes_gone_s'))} s later; "
            f"left: {left.get('processes')} processes, {left.get('fds')} "
            f"descriptors, {left.get('tmpdirs')} temporary directories", ""]


def _mcp_lines(m: dict) -> list:
    """MCP: warm tools/call through serve-mcp and a bare SDK server; sessions a second."""
    lines = ["MCP  warm tools/call on 127.0.0.1, milliseconds, paths interleaved in rounds"]
    hdr = ["client", "serve-mcp p50", "bare SDK p50", "ratio (paired)", "serve-mcp p99"]
    rows = []
    for client, label in (("sdk", "the SDK's client"), ("plain", "plain HTTP, kept alive")):
        ours, bare = m["warm_ms"][f"ours_{client}"], m["warm_ms"][f"bare_{client}"]
        rows.append([label, fmt(ours["p50"]), fmt(bare["p50"]),
                     f"{x(ours.get('x_bare_p50'))} ({x(ours.get('x_bare_p50_paired'))})",
                     fmt(ours["p99"])])
    lines += table(hdr, rows, "lrrrr")
    floor = {c: m["warm_ms"].get(f"hop_{c}") for c in ("sdk", "plain")}
    if all(floor.values()):
        lines.append("  the floor: the bare server's tool making one pipe round trip to a process "
                     "of its own first / the bare server:")
        for client, label in (("sdk", "the SDK's client"), ("plain", "plain HTTP, kept alive")):
            row = floor[client] or {}
            lines.append(f"    {label}: p50 {fmt(row.get('p50'))} ms, "
                         f"{x(row.get('x_bare_p50'))} ({x(row.get('x_bare_p50_paired'))} paired)")
    tok = {c: m["warm_ms"].get(f"token_{c}") for c in ("sdk", "plain")}
    if all(tok.values()):
        lines.append("  users signed in (--auth-issuer, an RS256 token on every call) / no token:")
        for client, label in (("sdk", "the SDK's client"), ("plain", "plain HTTP, kept alive")):
            row = tok[client] or {}
            lines.append(f"    {label}: p50 {fmt(row.get('p50'))} ms, "
                         f"{x(row.get('x_ours_p50'))} ({x(row.get('x_ours_p50_paired'))} paired)")
    s = m["sessions_per_s"]
    lines.append(f"  sessions through serve-mcp (initialize + a first tools/call + DELETE, one after "
                 f"another, until the last is torn down): {s['per_s']:.1f} a second; "
                 f"{s.get('refused_429', 0)} answered 429 at the client's cap, asked again")
    met = m.get("metrics") or {}
    if met.get("share_of_warm_call") is not None:
        lines.append(f"  metrics on a warm engine call: {met['per_call_us'] * 1e3:.0f} ns = "
                     f"{met['share_of_warm_call']:.1%} of its p50")
    return lines


def render_table(result: dict) -> str:
    """The readable report: warm, routing, cold, throughput, memory, discovery, targets."""
    m = result.get("meta", {})
    cfg = m.get("config", {})
    lines = []
    pl = m.get("headline_placement", "split")
    cpus = (f"host thread on CPU {m.get('host_cpu')}, worker on CPU {m.get('worker_cpu')}"
            if pl == "split" else "unpinned (could not split CPUs)")
    src = m.get("engine_source") or {}
    engine = (f"engine {src['commit']}{' + uncommitted changes' if src.get('uncommitted_changes') else ''}"
              if src.get("commit") else f"engine {src.get('path', '?')}")
    lines.append(f"lcp-sandbox bench  {engine}  python {m.get('python')}  {m.get('cpu_count')} CPUs  "
                 f"lollms_client {m.get('lollms_client') or '-'}  took {m.get('duration_s', 0):.0f} s")
    mach = m.get("machine")
    if mach:
        lines.append(f"CPUs busy {100 * mach['busy_fraction']:.0f}% during the run (this run included), "
                     f"hypervisor steal {100 * mach['steal_fraction']:.1f}%; 'runq' below: time runnable "
                     f"but waiting for a CPU, a sign of other load")
    lines.append(f"timer overhead {m.get('timer_overhead_ns', 0):.0f} ns (subtracted); messages "
                 f"{m.get('message_bytes', {}).get('request', '?')} B out / "
                 f"{m.get('message_bytes', {}).get('reply', '?')} B back")
    lines.append("")

    warm = result.get("warm", {})
    head = warm.get(pl, {})
    other = {k: v for k, v in warm.items() if k != pl}
    if head:
        lines.append(f"WARM  one small call on a live process, microseconds; {cpus}; "
                     f"{cfg.get('rounds')} interleaved rounds")
        hdr = ["path", "n", "p50", "p90", "p99", "max", "x floor p50", "x floor p99", "paired p50", "p99",
               "cpu: host", "+threads", "worker", "runq", "spin: host", "worker"]
        for name in other:
            hdr += [f"{name} p50", f"{name} p99", f"{name} x floor"]
        rows = []
        for key, r in head.items():
            c = r.get("cpu_us_per_call") or {}
            row = [r["label"], r["n"], fmt(r.get("p50")), fmt(r.get("p90")), fmt(r.get("p99")),
                   fmt(r.get("max")), x(r.get("x_floor_p50")), x(r.get("x_floor_p99")),
                   x(r.get("x_floor_p50_paired")), x(r.get("x_floor_p99_paired")),
                   fmt(c.get("host_thread")), fmt(c.get("host_other_threads")), fmt(c.get("worker")),
                   fmt(sum(v for v in (r.get("runq_wait_us_per_call") or {}).values() if v) or None),
                   pct((r.get("spin") or {}).get("host_hit_rate")), pct((r.get("spin") or {}).get("worker_hit_rate"))]
            for name, rs in other.items():
                o = rs.get(key, {})
                row += [fmt(o.get("p50")), fmt(o.get("p99")), x(o.get("x_floor_p50"))]
            rows.append(row)
        lines += table(hdr, rows, "lr" + "r" * (len(hdr) - 2))
        lines.append("  paired: median over rounds of the per-round ratio to the floor (robust to bursts of "
                     "outside load)")
        lines.append("  cpu: CPU time per call (us) of the calling thread, the host's other threads and the "
                     "serving process; runq: run-queue wait per call of the calling thread + the serving process "
                     "(/proc schedstat)")
        lines.append("  spin: share of the waits for an answer (host) and for the next call (worker) that ended "
                     "while polling, before sleeping (stats()[i]['spin'])")
        lines.append("")

    if result.get("breakdown"):
        from .breakdown import render as render_breakdown
        lines += render_breakdown(result["breakdown"]) + [""]

    rt = result.get("routing") or {}
    if rt.get("rows"):
        where = (f"host thread on CPU {','.join(map(str, rt.get('host_cpus') or []))}, worker on CPU "
                 f"{','.join(map(str, rt.get('worker_cpus') or []))}" if rt.get("placement") == "split"
                 else "unpinned (could not split CPUs)")
        lines.append(f"ROUTING  a warm call to one worker (tenant t0, bench_route_0) of a Supervisor shared by "
                     f"{rt['tenants']} tenants x {rt['libraries']} small libraries, with 1 vs {rt['workers']} "
                     f"live workers; microseconds; {where}; {rt['rounds']} rounds, conditions alternating, "
                     f"each batch in runs of {rt.get('sub_batch')} calls at random moments of "
                     f"{fmt(rt.get('window_s'))} s")
        lines += live_table(rt)
        tr = rt.get("transitions_s", {})
        st, sp = tr.get("start_others", {}), tr.get("stop_others", {})
        lines.append(f"  between batches, never timed: the other {rt['workers'] - 1} workers started (one call "
                     f"each, p50 {fmt(st.get('p50'))} s) or stopped (p50 {fmt(sp.get('p50'))} s); "
                     f"+threads: CPU of the host's other threads per call (the supervisors' watchdogs...)")
        lines.append("")
    if (result.get("density") or {}).get("rows"):
        lines += density_lines(result["density"])

    cold = result.get("cold", {})
    if cold:
        lines.append(f"COLD  from nothing to the first result, milliseconds; {cfg.get('cold_reps')} fresh "
                     f"starts each, interleaved; phases are p50s from stamps taken in the tool's process")
        hdr = ["path", "n", "p50", "p90", "p99", "max", "x spawn", "x floor", "start", "import+init", "call"]
        rows = []
        for key, r in cold.items():
            ph = r.get("phases", {})
            rows.append([r["label"], r["n"], fmt(r.get("p50")), fmt(r.get("p90")), fmt(r.get("p99")), fmt(r.get("max")),
                         x(r.get("x_spawn_p50")), x(r.get("x_floor_p50")),
                         fmt(ph.get("start", {}).get("p50")), fmt(ph.get("import_init", {}).get("p50")),
                         fmt(ph.get("call", {}).get("p50"))])
        lines += table(hdr, rows, "lr" + "r" * (len(hdr) - 2))
        lines.append("  start: until the library's first line runs (process start, loader); "
                     "import+init: module body and init_tools_library; call: the tool and the way back")
        lines.append("")

    tp = result.get("throughput", [])
    if tp:
        lines.append(f"THROUGHPUT  calls per second, K libraries (one worker each) driven by T host threads; "
                     f"median of {cfg.get('throughput_rounds')} rounds of {cfg.get('duration_s')} s; unpinned")
        hdr = ["path", "tool", "K", "T", "calls/s", "x (K=1, T=1)", "paired", "runq: host", "workers"]
        rows = [[PATHS.get(r["path"], r["path"]),
                 r["tool"] + (f" {cfg.get('cpu_ms'):g} ms" if r["tool"] == "tool_cpu" else ""),
                 r["libraries"], r["threads"], fmt(r["calls_per_s"]), x(r.get("x_one")), x(r.get("x_one_paired")),
                 fmt(r.get("runq_wait_us_per_call", {}).get("host_threads")),
                 fmt(r.get("runq_wait_us_per_call", {}).get("workers"))] for r in tp]
        lines += table(hdr, rows, "llrrrrrrr")
        lines.append("  paired: median over rounds of the per-round ratio (the rows of one block run back to back)")
        lines.append("  ceiling: the same tool_cpu work called in a loop in K processes, no IPC, in the same rounds: "
                     "what this machine gives; runq: run-queue wait per call (us) of the driving threads and of the "
                     "workers")
        par = next((t for t in result.get("targets", []) if t["name"] == "parallel"), None)
        if par and par.get("value") is not None:
            lines.append(f"  2 x 2 over 1 x 1: sandbox {x(par['value'])}, machine ceiling {x(par.get('ceiling'))}, "
                         f"physical limit {x(par.get('physical_limit'))}; the sandbox's 2 x 2 makes "
                         f"{fmt(100 * par['calls_of_ceiling'] if par.get('calls_of_ceiling') else None)}% of the "
                         f"ceiling's calls/s" + ("; above what the machine allows: the 1 x 1 baseline was slowed"
                                                 if par.get("above_ceiling") else "")
                         + (" (NOISE: not counted as met)" if par.get("noise") else ""))
        lines.append("")

    mem = result.get("memory", [])
    if mem:
        lines.append("MEMORY  per process, MB (USS: private to it; PSS: its share of shared pages)")
        hdr = ["process", "calls", "USS", "PSS", "RSS"]
        rows = [[r["what"], "-" if r.get("calls") is None else f"{r['calls']:,}", fmt(r.get("uss_mb")),
                 fmt(r.get("pss_mb")), fmt(r.get("rss_mb"))] for r in mem]
        lines += table(hdr, rows, "lrrrr")
        lines.append("")

    d = result.get("discovery", {})
    if d.get("sandbox"):
        lines.append(f"DISCOVERY  {d['files']:,} generated tool files ({d['tools']:,} tools), milliseconds")
        hdr = ["path", "first p50", "first max", "again p50", "again max"]
        rows = []
        for key, label in (("sandbox", "SandboxedBinding (AST, parse cache)"),
                           ("inprocess", "LCPBinding (AST, no cache)")):
            if key in d:
                rows.append([label, fmt(d[key]["first"]["p50"] * 1e3), fmt(d[key]["first"]["max"] * 1e3),
                             fmt(d[key]["again"]["p50"] * 1e3), fmt(d[key]["again"]["max"] * 1e3)])
        lines += table(hdr, rows, "lrrrr")
        if "new_tenant" in d["sandbox"]:
            lines.append(f"  a new tenant's binding of files already parsed: p50 "
                         f"{fmt(d['sandbox']['new_tenant']['p50'] * 1e3)} ms")
        if "user_folder" in d:
            lines.append(f"  {d['user_folder']['folder']}: first discovery p50 "
                         f"{fmt(d['user_folder']['first']['p50'] * 1e3)} ms")
        lines.append("")

    ray = result.get("ray") or {}
    if ray:
        lines.append(f"RAY  {ray['nodes']} nodes ({ray['cluster']}); warm: microseconds, paths interleaved in "
                     f"rounds; cold: milliseconds")
        rows = [[r["label"], r["n"], fmt(r.get("p50")), fmt(r.get("p90")), fmt(r.get("p99")),
                 x(r.get("x_actor_p50")), x(r.get("x_actor_p50_paired"))] for r in ray["warm"].values()]
        lines += table(["warm", "n", "p50", "p90", "p99", "x actor p50", "paired"], rows, "lrrrrrr")
        rows = [[r["label"], r.get("n", 0), fmt(r.get("p50")), fmt(r.get("max"))] for r in ray["cold"].values()]
        lines += table(["cold", "n", "p50 ms", "max ms"], rows, "lrrr")
        mcp = ray.get("mcp") or {}
        if mcp:
            rows = [[label, mcp[k]["n"], fmt(mcp[k].get("p50")), fmt(mcp[k].get("p90")),
                     x(mcp[k].get("x_local_p50")), x(mcp[k].get("x_local_p50_paired"))]
                    for k, label in (("ray", "serve-mcp --ray"), ("local", "serve-mcp, one machine"))]
            lines += table(["warm tools/call (ms, plain HTTP)", "n", "p50", "p90", "x local p50", "paired"],
                           rows, "lrrrrr")
        lines.append("")

    tg = result.get("targets", [])
    if tg:
        lines.append("TARGETS")
        rows = []
        for t in tg:
            unit = t["unit"]
            val = ("-" if t["value"] is None else x(t["value"]) if unit == "x"
                   else f"{fmt(t['value'])} {unit}")
            lim = f"{t['op']} {t['limit']:g}{'x' if unit == 'x' else ' ' + unit}"
            state = ("NOISE" if t.get("noise") else "n/a" if t["met"] is None else "met" if t["met"]
                     else "MISSED")
            rows.append([t["what"], val, lim, state + (f" ({t['note']})" if t.get("note") else "")])
        lines += table(["target", "measured", "limit", ""], rows, "lrrl")
        lines.append("")

    if result.get("skipped"):
        lines.append("skipped: " + "; ".join(f"{k}: {v}" for k, v in result["skipped"].items()))
        lines.append("")
    if result.get("spawn_burst"):
        from .spawn_burst import render as render_burst
        lines += ["", *render_burst(result["spawn_burst"])]
    if result.get("templates"):
        from .templates import render
        lines += ["", render(result["templates"])]
    if result.get("envs"):
        from .envs import render as render_envs
        lines += ["", render_envs(result["envs"])]
    if result.get("syscalls"):
        from .syscalls import render as render_syscalls
        lines += ["", render_syscalls(result["syscalls"])]
    if result.get("compiled"):
        from .compiled import render as render_compiled
        lines += ["", render_compiled(result["compiled"])]
    if result.get("confined"):
        from .confined import render as render_confined
        lines += ["", render_confined(result["confined"])]
    if result.get("egress"):
        from .egress import render as render_egress
        lines += ["", render_egress(result["egress"])]
    if result.get("secrets"):
        from .secrets import render as render_secrets
        lines += ["", render_secrets(result["secrets"])]
    if result.get("mcp"):
        lines += ["", *_mcp_lines(result["mcp"])]
    return "\n".join(lines)


def write_plot(result: dict, path: str) -> None:
    """PNG: warm and cold latency distributions (ECDFs on a log axis), one series per path;
    cold start by kind (plain, from a template, fresh import) when the templates section ran."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    m = result.get("meta", {})
    pl = m.get("headline_placement", "split")
    warm = result.get("warm", {})
    cold = result.get("cold", {})
    tpl = (result.get("templates") or {}).get("rows") or {}
    fig, axes = plt.subplots(1, 3 if tpl else 2, figsize=(21 if tpl else 14, 5.5))
    a1, a2 = axes[0], axes[1]
    colors = {}

    def color(kind: str) -> Any:
        if kind not in colors:
            colors[kind] = f"C{len(colors)}"
        return colors[kind]

    def dress(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")

    def ecdf(ax: Any, xs: list, **kw: Any) -> None:
        s = sorted(x for x in xs if x > 0)
        if s:
            n = len(s)
            ax.step(s, [(i + 1) / n for i in range(n)], where="post", **kw)

    for key, r in warm.get(pl, {}).items():
        kind = key.split(":")[0]
        ecdf(a1, r.get("samples_us", []), color=color(kind), lw=1.8 if kind != "floor" else 2.4,
             ls="-" if ":" not in key else "-.", label=f"{r['label']} (p50 {fmt(r.get('p50'))} us)")
        for name, rows in warm.items():
            if name != pl and key in rows:
                ecdf(a1, rows[key].get("samples_us", []), color=color(kind), lw=0.9, ls=":", alpha=0.8)
    for cond, r in ((result.get("routing") or {}).get("rows") or {}).items():
        ecdf(a1, r.get("samples_us", []), color=color("routing"), lw=1.4, ls="-" if cond == "one" else "--",
             label=f"routing: {r['label']} (p50 {fmt(r.get('p50'))} us)")
    where = (f"host CPU {m.get('host_cpu')}, worker CPU {m.get('worker_cpu')}" if pl == "split" else "unpinned")
    dress(a1, "round trip, microseconds (log)", "fraction of calls",
          f"warm: one small call ({where}; dotted: unpinned)")

    kinds = {"sandbox": "sandbox", "sandbox_heavy": "sandbox", "spawn": "spawn", "subprocess": "subprocess",
             "ppe": "ppe", "inprocess": "inprocess", "zygote_start": "zygote", "new_host": "zygote"}
    for key, r in cold.items():
        kind = kinds.get(key, key.split(":")[0])
        ls = ("--" if key in ("sandbox_heavy", "new_host") else ":" if key == "zygote_start"
              else "-." if ":" in key else "-")
        ecdf(a2, r.get("samples_ms", []), color=color(kind), lw=1.8, ls=ls,
             label=f"{r['label']} (p50 {fmt(r.get('p50'))} ms)")
    dress(a2, "new process to first result, milliseconds (log)", "fraction of starts", "cold: a never-run library")

    if tpl:
        a3 = axes[2]
        for key, label, ls in (("plain", "plain library, never run (zygote's spare)", "-"),
                               ("plain_off", "  the same, templates off", ":"),
                               ("template", "numpy library, from its template", "-"),
                               ("fresh", "numpy library, fresh import", "--")):
            if key in tpl:
                ecdf(a3, tpl[key].get("samples_ms", []), color=color(f"tpl:{key.split('_')[0]}"), lw=1.8, ls=ls,
                     label=f"{label} (p50 {fmt(tpl[key].get('p50'))} ms)")
        dress(a3, "a new tenant's first call, milliseconds (log)", "fraction of starts",
              "cold start by kind: plain, templated, fresh import")

    met = [t for t in result.get("targets", []) if t.get("met") is not None]
    fig.suptitle(f"lcp-sandbox bench, python {m.get('python')}, {m.get('cpu_count')} CPUs; targets met "
                 f"{sum(1 for t in met if t['met'])}/{len(met)}", fontsize=11)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
