"""The speed table of docs/performance.md, made from a run's JSON: no figure in it is typed
by hand.  (The module keeps its name from when the table was in the README.)

    python -m benchmarks --json bench.json                   # a full run
    python -m benchmarks.readme_table bench.json             # print the table
    python -m benchmarks.readme_table bench.json --write     # and put it in docs/performance.md
                                                             # (between its speed-table markers),
                                                             # with the run's summary in RUN_FILE

``RUN_FILE`` keeps the numbers of the run the page shows (samples and this machine's
paths dropped); tests/project/test_readme.py checks the page's table is ``render()`` of it, so
the table cannot drift from a run.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, Callable, Optional

from .config import BenchConfig
from .report import fmt, x

ROOT = Path(__file__).resolve().parent.parent
RUN_FILE = ROOT / "benchmarks" / "readme_run.json"
PAGE = ROOT / "docs" / "performance.md"
BEGIN = "<!-- speed table: made by `python -m benchmarks.readme_table`; do not edit by hand -->"
END = "<!-- end of speed table -->"


def summary(result: dict) -> dict:
    """The run without its samples and without the paths of the machine it ran on."""
    def strip(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: strip(w) for k, w in v.items()
                    if not k.startswith(("samples", "phases_samples")) and k != "round_of_sample"
                    and not (k == "rounds" and isinstance(w, list)) and not _is_path(w)}
        if isinstance(v, list):
            return [strip(w) for w in v if not _is_path(w)]
        if isinstance(v, str):
            # A text that names a file of this machine (a section's error) keeps its name only.
            return _FOLDERS.sub("", v)
        return v
    return strip(result)


#: The folders of an absolute path inside a text.
_FOLDERS = re.compile(r"(?<![\w.])/(?:[\w.-]+/)+")


def _is_path(v: Any) -> bool:
    return isinstance(v, str) and (v.startswith(("/", "~")) or "/tmp" in v)


def _get(d: Any, *keys: Any) -> Any:
    for k in keys:
        if not isinstance(d, (dict, list)):
            return None
        try:
            d = d[k]
        except (KeyError, IndexError, TypeError):
            return None
    return d


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def _rows(r: dict) -> list:
    """(what, sandbox, baselines) for each section the run has."""
    rows: list = []
    m = r.get("meta", {})
    pl = m.get("headline_placement", "split")
    w = _get(r, "warm", pl) or {}
    sb, fl = w.get("sandbox") or {}, w.get("floor") or {}

    if sb:
        where = (f"host CPU {m.get('host_cpu')} / worker CPU {m.get('worker_cpu')}" if pl == "split"
                 else "unpinned")
        base = []
        for key, label in (("inprocess", "in-process `LCPBinding`"), ("pickle", "bare pickle RPC, no engine"),
                           ("ppe", "`ProcessPoolExecutor`")):
            if w.get(key):
                base.append(f"{label} {fmt(w[key]['p50'])} us (the sandbox is {x(_ratio(sb['p50'], w[key]['p50']))})")
        if w.get("subprocess"):
            base.append(f"`python -c` per call {fmt(w['subprocess']['p50'] / 1000)} ms")
        rows.append((f"warm call p50, {where}",
                     f"{fmt(sb['p50'])} us = **{x(sb.get('x_floor_p50'))}** the pipe floor ({fmt(fl.get('p50'))} us); "
                     f"paired by round {x(sb.get('x_floor_p50_paired'))}", "; ".join(base)))
        base = [f"{lbl} {x(_get(w, k, 'x_floor_p99'))}" for k, lbl in
                (("pickle", "pickle RPC"), ("inprocess", "in-process"), ("ppe", "`ProcessPoolExecutor`")) if w.get(k)]
        rows.append(("warm call p99", f"{fmt(sb.get('p99'))} us = **{x(sb.get('x_floor_p99'))}** the floor's p99 "
                     f"({fmt(fl.get('p99'))} us); paired by round {x(sb.get('x_floor_p99_paired'))}",
                     ", ".join(base) + " of the floor's p99"))
        c, sp = sb.get("cpu_us_per_call") or {}, sb.get("spin") or {}
        cpu = lambda k: (f"{fmt(_get(w, k, 'cpu_us_per_call', 'host_thread'))} / "    # noqa: E731
                         f"{fmt(_get(w, k, 'cpu_us_per_call', 'worker'))}")
        hits = (f"; the host's poll caught {100 * sp['host_hit_rate']:.0f}% of answers, the worker's "
                f"{100 * sp['worker_hit_rate']:.0f}% of calls" if sp.get("host_hit_rate") is not None else "")
        rows.append(("CPU per warm call (host / worker)",
                     f"{fmt(c.get('host_thread'))} / {fmt(c.get('worker'))} us{hits}",
                     f"floor {cpu('floor')}" + (f", pickle RPC {cpu('pickle')}" if w.get("pickle") else "")))
    cold = r.get("cold") or {}
    cs = cold.get("sandbox")
    if cs:
        base = [f"{lbl} {x(_ratio(cs['p50'], cold[k]['p50']))}" for k, lbl in
                (("ppe", "a new `ProcessPoolExecutor`"), ("subprocess", "`python -c`"),
                 ("inprocess", "in-process first import")) if cold.get(k)]
        spawn = cold.get("spawn")
        rows.append(("cold first call of a never-run plain library",
                     f"p50 **{fmt(cs['p50'])} ms**, p99 {fmt(cs.get('p99'))} ms"
                     + (f" = {x(cs.get('x_spawn_p50'))} a fresh interpreter (`spawn`, {fmt(spawn['p50'])} ms)"
                        if spawn else ""), "p50 against " + ", ".join(base) if base else ""))
    t = r.get("templates") or {}
    if t.get("rows"):
        rows.append(("a new tenant's first call of a numpy library",
                     f"p50 **{fmt(t['rows']['template']['p50'])} ms** from its template",
                     f"fresh import {fmt(t['rows']['fresh']['p50'])} ms ({x(t.get('fresh_over_template'))})"))
    par = next((g for g in r.get("targets", []) if g["name"] == "parallel"), None)
    if par and par.get("value") is not None:
        rows.append(("2 libraries x 2 threads, 1 ms of CPU per call",
                     f"**{x(par['value'])}** the calls/s of 1 x 1"
                     + (f" ({fmt(100 * par['calls_of_ceiling'])}% of what 2 processes without IPC reach)"
                        if par.get("calls_of_ceiling") else ""),
                     f"the machine's own ceiling in the same rounds: {x(par.get('ceiling'))}"))
    mem = {row["key"]: row for row in r.get("memory") or []}
    if mem.get("small_first"):
        tu = t.get("uss_mb") or {}
        sb_mem = (f"USS **{fmt(mem['small_first'].get('uss_mb'))} MB** after 1 call, "
                  f"{fmt(_get(mem, 'small_after', 'uss_mb'))} MB after {_get(mem, 'small_after', 'calls') or 0:,}")
        if tu:
            sb_mem += (f"; a never-run plain library's first worker {fmt(tu.get('plain'))} MB; a worker from a numpy "
                       f"template {fmt(tu.get('template'))} MB")
        base = []
        if mem.get("ppe"):
            base.append(f"a `ProcessPoolExecutor` worker forked from the host {fmt(mem['ppe'].get('uss_mb'))} MB")
        if tu.get("fresh"):
            base.append(f"a fresh numpy worker {fmt(tu['fresh'])} MB")
        rows.append(("worker memory", sb_mem, "; ".join(base)))
    d = r.get("discovery") or {}
    if d.get("sandbox"):
        rows.append((f"discovery of {d['files']:,} tool files",
                     f"**{fmt(d['sandbox']['first']['p50'] * 1e3)} ms** first, "
                     f"**{fmt(d['sandbox']['again']['p50'] * 1e3)} ms** again unchanged",
                     f"`LCPBinding` {fmt(_get(d, 'inprocess', 'first', 'p50') and d['inprocess']['first']['p50'] * 1e3)}"
                     f" ms first, {fmt(_get(d, 'inprocess', 'again', 'p50') and d['inprocess']['again']['p50'] * 1e3)}"
                     " ms again"))
    rt = r.get("routing") or {}
    if rt.get("ratio"):
        ra = rt["ratio"]
        rows.append((f"routing: a call to one worker with {rt['workers']} live workers ({rt['tenants']} tenants) vs 1",
                     f"**{x(ra.get('p50'))}** p50 (p99 {x(ra.get('p99'))}; paired by round "
                     f"{x(ra.get('p50_paired'))} / {x(ra.get('p99_paired'))})", ""))
    rows += _density_rows(r.get("density") or {})
    rows += _safe_and_portable_rows(r)
    ray = r.get("ray") or {}
    if ray:
        rw, loc = ray["warm"]["ray"], ray["warm"]["local"]
        rows.append((f"over Ray: warm call to a worker on the other node of a {ray['nodes']}-node local cluster",
                     f"{fmt(rw['p50'])} us = **{x(rw.get('x_actor_p50'))}** a bare Ray actor call "
                     f"({x(rw.get('x_actor_p50_paired'))} paired by round)",
                     f"local `Supervisor` warm call {fmt(loc['p50'])} us in the same rounds"))
        rows.append(("over Ray: a new library's first call on the other node",
                     f"**{fmt(ray['cold']['ray_remote']['p50'])} ms**", f"local {fmt(ray['cold']['local']['p50'])} ms"))
    return rows


def _safe_and_portable_rows(r: dict) -> list:
    """Confined starts, the system call allowlist, the spawn start path, MCP."""
    rows = []
    cf = r.get("confined") or {}
    if cf.get("rows"):
        c = cf["rows"]
        rows.append(("a new confined tenant's first call (from confined templates)",
                     f"numpy library p50 **{fmt(c['np_confined']['p50'])} ms** "
                     f"({x(cf.get('np_ratio'))} unconfined), USS {fmt(cf['uss_mb'].get('np_confined'))} "
                     f"MB; plain library {fmt(c['plain_confined']['p50'])} ms "
                     f"({x(cf.get('plain_ratio'))} unconfined)",
                     f"confined fresh numpy import {fmt(_get(c, 'np_fresh', 'p50'))} ms"))
        d = cf.get("density") or {}
        if d:
            rows.append((f"density: {d.get('tenants')} confined tenants x 2 libraries (one numpy)",
                         f"{d.get('answered')} of {d.get('calls')} answered; USS of the workers "
                         f"**{fmt(d.get('uss_mb'))} MB** ({fmt(d.get('per_worker_mb'))} each)",
                         "left after `close()`: " + ", ".join(
                             f"{n} {k.replace('_', ' ')}" for k, n in sorted((d.get("left") or {}).items()))))
    sc = r.get("syscalls") or {}
    if sc.get("warm_ratio") is not None:
        rows.append(("confined warm call, system call allowlist on / off",
                     f"**{x(sc.get('warm_ratio_paired') or sc['warm_ratio'])}** p50 (paired by round)",
                     f"a confined worker's cold start on / off {x(sc.get('cold_ratio'))}"))
    cc = r.get("compiled") or {}
    if cc.get("rows"):
        c = cc["rows"]
        rows.append((f"a {cc['kb']:.0f} KB library without a `.pyc`, new tenant's first call",
                     f"with the host's compiled code: confined **{fmt(c['confined_host']['p50'])} ms**, "
                     f"unconfined {fmt(c['open_host']['p50'])} ms",
                     f"the worker compiling: confined {fmt(c['confined_worker']['p50'])} ms "
                     f"({x(cc.get('confined_ratio_paired'))}), unconfined "
                     f"{fmt(c['open_worker']['p50'])} ms ({x(cc.get('open_ratio_paired'))})"))
    cold, warm = r.get("cold") or {}, _get(r, "warm", _get(r, "meta", "headline_placement")) or {}
    if cold.get("sandbox_spawn") and warm.get("sandbox_spawn"):
        rows.append(("spawn start path (what macOS and Windows run), forced here",
                     f"first call of a new library p50 **{fmt(cold['sandbox_spawn']['p50'])} ms**; "
                     f"warm call {fmt(warm['sandbox_spawn'].get('p50'))} us",
                     f"a bare `multiprocessing` spawn + first result {fmt(_get(cold, 'spawn', 'p50'))} "
                     f"ms; the zygote path's warm call {fmt(_get(warm, 'sandbox', 'p50'))} us"))
    burst = r.get("spawn_burst") or {}
    if burst.get("p50") is not None:
        p50s = burst.get("p50s") or []
        which = (f"the median of {len(p50s)} bursts' ({', '.join(fmt(v) for v in p50s)} ms); "
                 if p50s else "one burst; ")
        rows.append((f"spawn start path: {burst['n']} new libraries' first calls back to back",
                     f"p50 **{fmt(burst['p50'])} ms** = {x(burst.get('x_spawn_p50'))} a bare spawn "
                     f"({which}p90 {fmt(burst.get('p90'))} ms, max {fmt(burst.get('max'))} ms)",
                     "two spares up ahead; none up: one interpreter per CPU spawned at once, each "
                     "start taking the first up"))
    m = r.get("mcp") or {}
    if m.get("warm_ms"):
        w = m["warm_ms"]
        rows.append(("MCP: a warm `tools/call` through `serve-mcp` (Streamable HTTP)",
                     f"SDK client {fmt(w['ours_sdk']['p50'])} ms = "
                     f"**{x(w['ours_sdk'].get('x_bare_p50_paired'))}**, kept-alive plain HTTP "
                     f"{fmt(w['ours_plain']['p50'])} ms = **{x(w['ours_plain'].get('x_bare_p50_paired'))}** "
                     f"a bare SDK server (paired by round); "
                     f"{fmt(m['sessions_per_s']['per_s'])} new sessions a second, torn down",
                     f"bare SDK server: {fmt(w['bare_sdk']['p50'])} / {fmt(w['bare_plain']['p50'])} ms; "
                     f"metrics on a warm engine call "
                     f"{fmt(100 * (_get(m, 'metrics', 'share_of_warm_call') or 0))}%"))
    return rows


def _density_rows(dn: dict) -> list:
    if not dn.get("rows"):
        return []
    n, u, ia, ip = dn["workers"], dn["uss_mb"], dn["idle_all"], dn["idle_pool"]
    ra = dn.get("ratio") or {}
    return [
        (f"density: {n:,} live workers ({dn['tenants']} tenants x {len(dn['libraries'])} libraries, one importing "
         "numpy)", f"{dn['answered']:,} answered; USS of everything **{fmt(u['total'])} MB** ({fmt(u['per_worker'])} "
         f"MB per worker, templates {fmt(u['templates'])}, zygote {fmt(u['zygote'])}, host {fmt(u['host'])}); "
         f"{fmt(dn['fds']['per_worker'])} host descriptors per worker", f"started in {fmt(dn['start_s'])} s"),
        (f"density: a warm call with {n:,} live vs 1", f"**{x(ra.get('p50'))}** p50 (paired by round "
         f"{x(ra.get('p50_paired'))}); `stats()` over all {fmt(dn['stats_ms']['p50'])} ms", ""),
        ("density: idle", f"host threads **{100 * ia['host_cpu_fraction']:.1f}%** of a CPU with {n:,} idle "
         f"({ia['host_runs']} runs in {fmt(ia['seconds'])} s); with {dn['idle_pool_workers']} idle, host and pool "
         f"ran {ip['host_runs'] + ip['pool_runs']} times in {fmt(ip['seconds'])} s",
         f"left after `close()`: {dn['left']['processes']} processes, {dn['left']['fds']} descriptors, "
         f"{dn['left']['tmpdirs']} temporary directories" if dn.get("left") else ""),
    ]


def render(result: dict) -> str:
    m = result.get("meta", {})
    mach = m.get("machine") or {}
    src = m.get("engine_source") or {}
    quick = m.get("config", {}).get("calls") == BenchConfig.quick().calls
    head = (f"Command: `python -m benchmarks{' --quick' if quick else ''} --json bench.json` ({m.get('duration_s', 0):.0f} s, engine "
            f"{src.get('commit', '?')}{' + changes' if src.get('uncommitted_changes') else ''}, python "
            f"{m.get('python')}, {m.get('cpu_count')} CPUs"
            + (f", CPUs {100 * mach['busy_fraction']:.0f}% busy during the run, steal "
               f"{100 * mach['steal_fraction']:.1f}%" if mach else "") + "):")
    lines = [head, "", "| what | sandbox | baselines (same run) |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in _rows(result)]
    bd = result.get("breakdown") or {}
    if bd.get("host"):
        lines += ["", "Where a warm call's CPU goes (`BREAKDOWN`: the engine's code for each part in a tight loop on "
                  "warm caches; total: the CPU per call above; the rest: sockets, wake-ups, spinning and the "
                  "layers between the parts):", "", "| side | part | CPU, us |", "|---|---|---|"]
        for side in ("host", "worker"):
            lines += [f"| {side} | {r['part']} | {fmt(r['us'])} |" for r in bd[side]]
            if f"{side}_total_us" in bd:
                lines += [f"| {side} | the rest | {fmt(bd[f'{side}_rest_us'])} |",
                          f"| {side} | **total per call** (the pipe floor's: {fmt(bd[f'{side}_floor_us'])}) | "
                          f"**{fmt(bd[f'{side}_total_us'])}** |"]
    tg = [t for t in result.get("targets", []) if t.get("met") is not None]
    if tg:
        lines += ["", f"Targets met in this run: {sum(1 for t in tg if t['met'])} of {len(tg)}. Missed: "
                  + ("; ".join(f"{t['what']} {_val(t)} (limit {t['op']} {t['limit']:g}"
                               f"{'x' if t['unit'] == 'x' else ' ' + t['unit']}"
                               f"{'; above what the machine allows: noise' if t.get('noise') else ''})"
                               for t in tg if not t["met"])
                     or "none") + "."]
    return "\n".join(lines)


def _val(t: dict) -> str:
    return x(t["value"]) if t["unit"] == "x" else f"{fmt(t['value'])} {t['unit']}".strip()


def readme_block(text: str) -> Optional[str]:
    """The table as it stands in a page's text, None without the markers."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def write_readme(result: dict, readme: Path = PAGE, run_file: Path = RUN_FILE,
                 out: Callable[[str], Any] = print) -> None:
    s = summary(result)
    run_file.write_text(json.dumps(s, indent=1, sort_keys=True, default=str) + "\n")
    text = readme.read_text()
    if readme_block(text) is None:
        raise SystemExit(f"{readme.name} has no speed-table markers ({BEGIN} ... {END})")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    readme.write_text(f"{before}{BEGIN}\n{render(s)}\n{END}{after}")
    out(f"wrote the speed table into {readme.name} and the run into {run_file.relative_to(ROOT)}")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.readme_table", description=__doc__.split("\n")[0])
    ap.add_argument("json_path", help="a run's JSON (python -m benchmarks --json PATH)")
    ap.add_argument("--write", action="store_true", help=f"put the table into {PAGE.relative_to(ROOT)} and "
                    f"the run into {RUN_FILE.relative_to(ROOT)}")
    return ap


def main(argv: Optional[list] = None) -> None:
    args = build_parser().parse_args(argv)
    result = json.loads(Path(args.json_path).read_text())
    if args.write:
        write_readme(result)
    else:
        print(render(summary(result)))


if __name__ == "__main__":
    main()
