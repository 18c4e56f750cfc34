"""CONFINED: what a new tenant's first call costs confined (Supervisor(confine=True,
tenants_root=...), shared confined templates) against the same unconfined, same run.

    rounds, the kinds in a fresh random order in each; each call timed alone (the
    templates any call owes are made before the next one starts):
        np        a new tenant of a numpy library whose template exists
        plain     a new tenant of a plain library run before (its template exists)
        new       a never-run plain library's first call (unconfined: the zygote's spare;
                  confined: the base of its folder)
      each open (unconfined) and confined; np also confined without tenants_root (fresh)
    USS (own pages) of each kind's worker after its first call
    density: ``tenants`` confined tenants x (numpy library + plain library), every call
    answered, USS of the workers, nothing left after close() (processes, descriptors,
    temp dirs)
    container: a root host in a default container (tests/support/without_landlock.py
    --docker-default: Docker's seccomp profile and 14 capabilities, Landlock kept) against
    this root host, each a host process of its own (probe()) run in turns, same run: a
    new tenant's first call (a uid of its own, from the shared template) and warm calls
    guard: in that container with one uid for all and fresh workers (guard_probe()), a
    worker whose processes are the host's guard's (Landlock held to ABI 5) against one
    under Landlock's scope (ABI 7), paired by round: its first call and warm calls

Run alone:  python -m benchmarks.confined [rounds] [tenants]
"""
from __future__ import annotations

import gc
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.system.proc import memory, tree_memory

from .harness import paired_ratio, ratio, summarize
from .templates import NUMPY_LIB

PLAIN_LIB = '''
def tool_{name}(x: int = 1) -> dict:
    """plain"""
    return {{"success": True, "output": x}}
'''
KINDS = ("np_open", "np_confined", "np_fresh", "plain_open", "plain_confined", "new_open",
         "new_confined", "plain_fresh", "plain_flat", "plain_shareduid")


def _lib(folder: str, name: str, code: str) -> str:
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o755)
    with open(os.path.join(folder, f"{name}.py"), "w") as f:
        f.write(code)
    return folder


def _settled(sups: list) -> None:
    """Wait until no template of ``sups`` is being made (each call is timed alone)."""
    deadline = time.monotonic() + 60
    while any(t["state"] == "starting" for s in sups for t in s.pool_stats()["templates"]):
        if time.monotonic() > deadline:
            raise TimeoutError("a template was not made within 60 s")
        time.sleep(0.005)
    time.sleep(0.02)                   # (the reserve and spares forked after a call)


class _Bench:
    def __init__(self, tmp: str) -> None:
        self.tmp, self.n = tmp, 0
        self.tenants = os.path.join(tmp, "tenants")
        os.makedirs(self.tenants)
        os.chmod(self.tenants, 0o711)
        self.np = _lib(os.path.join(tmp, "np"), "bench_np", NUMPY_LIB)
        self.plain = _lib(os.path.join(tmp, "plain"), "bench_plain", PLAIN_LIB.format(name="plain"))
        self.open = Supervisor()
        self.conf = Supervisor(confine=True, tenants_root=self.tenants)
        # A root host's default is a uid per tenant (taken from the shared template with
        # its key: worker/confine/handoff.py); the same with one uid for all, same run.
        self.shareduid = Supervisor(confine=True, tenants_root=self.tenants, run_as=(65534, 65534))
        self.fresh = Supervisor(confine=True)
        # The same fresh confined start without its own PID namespace and root (Landlock's
        # layer and scope only): what those namespaces cost, same run.
        self.flat = Supervisor(confine=True)
        self.flat.protections_off = frozenset({"pidns", "root"})

    def first_call(self, sup: Supervisor, folder: str, tool: str, confine: bool) -> tuple:
        """A new tenant's first call: (seconds, its worker's start, its USS)."""
        self.n += 1
        ws = os.path.join(self.tenants, f"t{self.n}")
        os.makedirs(ws)
        b = SandboxedBinding(tools_folders=[folder], supervisor=sup, tenant=f"t{self.n}",
                             workspace=ws, workspace_root=ws, confine=confine)
        b.list_tools()
        gc.collect()
        t0 = time.perf_counter()
        res = b.execute_tool(tool, {})
        elapsed = time.perf_counter() - t0
        assert res["status_code"] == 200, res
        st = b.stats()[0]
        uss = tree_memory(st["pid"])[1]         # (a fresh worker's tree: with its init)
        b.close()
        return elapsed, st["start"], uss

    def one(self, kind: str, r: Any) -> tuple:
        what, how = kind.split("_")
        sup = {"open": self.open, "confined": self.conf, "fresh": self.fresh,
               "flat": self.flat, "shareduid": self.shareduid}[how]
        if what == "np":
            folder, tool = self.np, "tool_np"
        elif what == "plain":
            folder, tool = self.plain, "tool_plain"
        else:
            name = f"bench_new_{how}_{r}"
            folder = _lib(os.path.join(self.tmp, "new", how), name,     # (one folder: one base)
                          PLAIN_LIB.format(name=name))
            tool = f"tool_{name}"
        return self.first_call(sup, folder, tool, how != "open")

    def close(self) -> None:
        for s in (self.open, self.conf, self.fresh, self.flat, self.shareduid):
            s.close()


def _expected(kind: str, start: str) -> bool:
    if kind.startswith("new_"):
        return start.startswith("base (") if kind == "new_confined" else start.startswith("fresh")
    if kind in ("np_fresh", "plain_fresh", "plain_flat"):
        return start.startswith("fresh")
    return start == "template"


def measure(rounds: int = 20, seed: int = 1) -> dict:
    tmp = tempfile.mkdtemp(prefix="lcp-bench-conf-")
    os.chmod(tmp, 0o711)
    bench = _Bench(tmp)
    try:
        sups = [bench.open, bench.conf, bench.fresh, bench.flat, bench.shareduid]
        for w in ("w0", "w1"):               # templates and bases made, warm
            for kind in ("np_open", "np_confined", "plain_open", "plain_confined", "new_confined",
                         "plain_fresh", "plain_flat", "plain_shareduid"):
                bench.one(kind, w)
                _settled(sups)
        rng = random.Random(seed)
        times: dict = {k: [] for k in KINDS}
        uss: dict = {k: [] for k in KINDS}
        for r in range(rounds):
            kinds = list(KINDS)
            rng.shuffle(kinds)
            for kind in kinds:
                if kind == "np_fresh" and r % 4:
                    continue                 # (100 ms each: a quarter of the rounds)
                elapsed, start, own = bench.one(kind, r)
                assert _expected(kind, start), (kind, start)
                times[kind].append(elapsed)
                uss[kind].append(own)
                _settled(sups)
        rows = {k: {**summarize(v, 1e-3), "samples_ms": [round(x * 1e3, 4) for x in v]}
                for k, v in times.items() if v}
        p50 = {k: v["p50"] for k, v in rows.items()}
        return {"rows": rows, "uss_mb": {k: sorted(v)[len(v) // 2] / 1048576
                                         for k, v in uss.items() if v},
                "np_ratio": ratio(p50["np_confined"], p50["np_open"]),
                "plain_ratio": ratio(p50["plain_confined"], p50["plain_open"]),
                "new_ratio": ratio(p50["new_confined"], p50["new_open"]),
                "fresh_over_template": ratio(p50.get("np_fresh"), p50["np_confined"]),
                "namespaces_ratio": ratio(p50["plain_fresh"], p50["plain_flat"]),
                "uid_per_tenant_ratio": ratio(p50["plain_confined"], p50["plain_shareduid"]),
                "namespaces_uss_mb": (sorted(uss["plain_fresh"])[len(uss["plain_fresh"]) // 2]
                                      - sorted(uss["plain_flat"])[len(uss["plain_flat"]) // 2])
                / 1048576}
    finally:
        bench.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _ours() -> set:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def density(tenants: int = 200) -> dict:
    """``tenants`` confined tenants x (numpy library + plain library): all answer; the
    workers' USS; what is left after close()."""
    tmp = tempfile.mkdtemp(prefix="lcp-bench-cdens-")
    os.chmod(tmp, 0o711)
    own_tmp = os.path.join(tmp, "tmp")           # the engine's temp dirs go here, counted after
    os.mkdir(own_tmp, 0o711)
    saved, tempfile.tempdir = tempfile.tempdir, own_tmp
    before_fds, before_procs = len(os.listdir("/proc/self/fd")), _ours()
    bench = _Bench(tmp)
    try:
        bench.fresh.close()
        t0 = time.perf_counter()
        answered, starts = 0, {}
        bindings = []
        for i in range(tenants):
            ws = os.path.join(bench.tenants, f"d{i}")
            os.makedirs(ws)
            b = SandboxedBinding(tools_folders=[bench.np, bench.plain], supervisor=bench.conf,
                                 tenant=f"d{i}", workspace=ws, workspace_root=ws)
            bindings.append(b)
            for tool in ("tool_np", "tool_plain"):
                answered += b.execute_tool(tool, {})["status_code"] == 200
        seconds = time.perf_counter() - t0
        stats = bench.conf.stats()
        for s in stats:
            starts[s["start"]] = starts.get(s["start"], 0) + 1
        workers = [s["pid"] for s in stats if s["pid"]]
        uss = sum(memory(p)[1] for p in workers) / 1048576
        tpl_uss = sum(t["uss"] for t in bench.conf.pool_stats()["templates"]) / 1048576
        for b in bindings:
            b.close()
    finally:
        bench.close()
        tempfile.tempdir = saved
        left_tmp = os.listdir(own_tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    deadline = time.monotonic() + 10
    while _ours() - before_procs and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"tenants": tenants, "workers": len(workers), "answered": answered,
            "calls": 2 * tenants, "seconds": seconds, "starts": starts, "uss_mb": uss,
            "per_worker_mb": uss / max(1, len(workers)), "templates_uss_mb": tpl_uss,
            "left": {"processes": len(_ours() - before_procs),
                     "descriptors": len(os.listdir("/proc/self/fd")) - before_fds,
                     "temp_dirs": len(left_tmp)}}


#: The emulation of a default container the host-kind tests use.
DOCKER_DEFAULT = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "tests", "support", "without_landlock.py"),
                  "--docker-default",
                  "--keep-landlock"]
WARM_CALLS = 20                          # per new tenant, after its first call


def _warm_p50(binding: Any) -> float:
    """The median of WARM_CALLS warm calls of ``tool_plain`` (s), one after another."""
    times = []
    for _ in range(WARM_CALLS):
        t0 = time.perf_counter()
        binding.execute_tool("tool_plain", {})
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def probe(rounds: int) -> dict:
    """(A host process of its own) ``rounds`` new tenants of a plain library on a root
    host with a tenants_root: each one's first call, then WARM_CALLS warm calls; seconds."""
    tmp = tempfile.mkdtemp(prefix="lcp-bench-kind-")
    os.chmod(tmp, 0o711)
    bench_tenants = os.path.join(tmp, "tenants")
    os.makedirs(bench_tenants, mode=0o711)
    os.chmod(bench_tenants, 0o711)
    plain = _lib(os.path.join(tmp, "plain"), "bench_plain", PLAIN_LIB.format(name="plain"))
    sup = Supervisor(confine=True, tenants_root=bench_tenants)
    first: list = []
    warm: list = []
    try:
        r = 0
        # (until the library's template serves: the first tenants made it)
        while len(first) < rounds and r < rounds + 20:
            r += 1
            ws = os.path.join(bench_tenants, f"t{r}")
            os.makedirs(ws)
            b = SandboxedBinding(tools_folders=[plain], supervisor=sup, tenant=f"t{r}",
                                 workspace=ws, workspace_root=ws)
            b.list_tools()
            gc.collect()
            t0 = time.perf_counter()
            got = b.execute_tool("tool_plain", {})
            elapsed = time.perf_counter() - t0
            assert got["status_code"] == 200, got
            start = b.stats()[0]["start"]
            warm_p50 = _warm_p50(b)
            b.close()
            _settled([sup])
            if start == "template" and r > 2:
                first.append(elapsed)
                warm.append(warm_p50)
    finally:
        sup.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"first": first, "warm": warm}


def container(rounds: int = 8, turns: int = 4) -> dict:
    """probe() on this root host and under the Docker-default emulation, in turns (each
    turn runs both, in a fresh random order): p50 of each and the ratios, paired by turn."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return {"skipped": "a root host on Linux emulates the container"}
    per = max(1, rounds // turns)
    got: dict = {"root": {"first": [], "warm": []}, "docker": {"first": [], "warm": []}}
    by_turn: dict = {"root": {}, "docker": {}}
    rng = random.Random(turns)
    for turn in range(turns):
        kinds = ["root", "docker"]
        rng.shuffle(kinds)
        for kind in kinds:
            cmd = [sys.executable, "-m", "benchmarks.confined", "--probe", str(per)]
            if kind == "docker":
                cmd = [sys.executable, *DOCKER_DEFAULT, *cmd]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                                  cwd=os.path.dirname(os.path.dirname(os.path.abspath(
                                      __file__))))
            if done.returncode != 0:
                raise RuntimeError(f"the {kind} host failed: {done.stderr[-2000:]}")
            one = json.loads(done.stdout.strip().splitlines()[-1])
            for k in ("first", "warm"):
                got[kind][k] += one[k]
            by_turn[kind][turn] = {k: sorted(one[k])[len(one[k]) // 2] for k in one}
    rows = {f"{kind}_{k}": summarize(v, 1e-3) for kind, d in got.items() for k, v in d.items()}
    return {"rows": rows, **{f"{k}_ratio": paired_ratio(
        {t: v[k] for t, v in by_turn["docker"].items()},
        {t: v[k] for t, v in by_turn["root"].items()}) for k in ("first", "warm")}}


def guard_probe(rounds: int) -> dict:
    """(A host process of its own, in the Docker-default emulation) one uid for all
    tenants, every worker fresh: ``rounds`` pairs of new tenants, in a fresh random order
    in each pair, one held to Landlock ABI 5 (no scope: its processes are the host's guard's)
    and one at this kernel's ABI (Landlock's scope, no guard); each one's first call and the
    p50 of WARM_CALLS warm calls, seconds, by round."""
    from lcp_sandbox.testing import landlock_abi_at_most
    tmp = tempfile.mkdtemp(prefix="lcp-bench-guard-")
    os.chmod(tmp, 0o755)
    plain = _lib(os.path.join(tmp, "plain"), "bench_plain", PLAIN_LIB.format(name="plain"))
    cfg = {"bench_plain": {"sandbox": {"template": False}}}
    sup = Supervisor(confine=True)
    got: dict = {"guard": {"first": {}, "warm": {}}, "scope": {"first": {}, "warm": {}}}
    rng = random.Random(rounds)
    try:
        for r in range(rounds):
            kinds = ["guard", "scope"]
            rng.shuffle(kinds)
            for kind in kinds:
                ws = os.path.join(tmp, f"{kind}{r}")
                os.makedirs(ws, mode=0o777)
                os.chmod(ws, 0o777)
                b = SandboxedBinding(tools_folders=[plain], supervisor=sup, tenant=f"{kind}{r}",
                                     workspace=ws, workspace_root=ws, host_tool_configs=cfg)
                b.list_tools()
                gc.collect()
                capped = landlock_abi_at_most(sup, 5) if kind == "guard" else None
                if capped is not None:
                    capped.__enter__()
                try:
                    t0 = time.perf_counter()
                    answer = b.execute_tool("tool_plain", {})
                    elapsed = time.perf_counter() - t0
                finally:
                    if capped is not None:
                        capped.__exit__(None, None, None)
                assert answer["status_code"] == 200, answer
                guarded = b.stats()[0]["protections"]["processes"].startswith(
                    "on (the host's guard")
                assert guarded == (kind == "guard"), b.stats()
                got[kind]["warm"][r] = _warm_p50(b)
                b.close()
                got[kind]["first"][r] = elapsed
    finally:
        sup.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return got


def guard(rounds: int = 8) -> dict:
    """guard_probe() under the Docker-default emulation: p50 of each kind and the ratios
    guard / scope, paired by round."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return {"skipped": "a root host on Linux emulates the container"}
    cmd = [sys.executable, *DOCKER_DEFAULT, sys.executable, "-m", "benchmarks.confined",
           "--guard-probe", str(rounds)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if done.returncode != 0:
        raise RuntimeError(f"the guarded host failed: {done.stderr[-2000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    rows = {f"{kind}_{k}": summarize(list(v.values()), 1e-3) for kind, d in got.items()
            for k, v in d.items()}
    return {"rows": rows, **{f"{k}_ratio": paired_ratio(got["guard"][k], got["scope"][k])
                             for k in ("first", "warm")}}


def render(res: dict) -> str:
    out = ["CONFINED  a new tenant's first call (ms)           p50      p99   USS MB"]
    labels = {"np_open": "numpy library, template, unconfined",
              "np_confined": "numpy library, confined template",
              "np_fresh": "numpy library, confined, fresh import",
              "plain_open": "plain library run before, unconfined",
              "plain_confined": "plain library run before, confined",
              "new_open": "never-run plain library, unconfined",
              "new_confined": "never-run plain library, confined (base)",
              "plain_fresh": "plain library, confined fresh (own PID ns + root)",
              "plain_flat": "plain library, confined fresh, Landlock only",
              "plain_shareduid": "plain library, confined, one uid for all tenants"}
    rows = [(label, res["rows"][k], res["uss_mb"].get(k, 0)) for k, label in labels.items()
            if k in res["rows"]]
    out += [f"  {label:<44} {row['p50']:8.2f} {row['p99']:8.2f} {uss:8.2f}" for label, row, uss in rows]
    ratios = ", ".join(f"{name} {res[key]:.2f}x" for name, key in
                       (("numpy", "np_ratio"), ("plain", "plain_ratio"), ("never-run", "new_ratio")))
    out.append(f"  confined / unconfined (p50): {ratios}")
    if res.get("uid_per_tenant_ratio") is not None:
        out.append(f"  a uid per tenant (the default) / one uid for all: "
                   f"{res['uid_per_tenant_ratio']:.2f}x (p50, both from the shared template)")
    if res.get("namespaces_ratio") is not None:
        out.append(f"  a fresh confined worker's own PID namespace and root: "
                   f"{res['namespaces_ratio']:.2f}x its first call without them (p50), "
                   f"{res.get('namespaces_uss_mb', 0):+.2f} MB USS of its tree (the init)")
    d = res.get("density") or {}
    parts = [f"{d.get('tenants')} confined tenants x 2 libraries",
             f"{d.get('answered')} of {d.get('calls')} answered in {d.get('seconds', 0):.1f} s",
             f"USS of the workers {d.get('uss_mb', 0):.0f} MB ({d.get('per_worker_mb', 0):.2f} each)",
             f"templates {d.get('templates_uss_mb', 0):.1f} MB", f"left after close(): {d.get('left')}"]
    if d:
        out.append("  density: " + "; ".join(parts))
    c = res.get("container") or {}
    if c.get("rows"):
        out.append("  Docker default (emulated) / this root host, a uid per tenant, same run:")
        for k, label in (("first", "a new tenant's first call"), ("warm", "a confined warm call")):
            root, docker = c["rows"][f"root_{k}"], c["rows"][f"docker_{k}"]
            out.append(f"    {label:<28} {docker['p50']:8.3f} ms / {root['p50']:8.3f} ms p50: "
                       f"{c[f'{k}_ratio']:.2f}x (paired by turn)")
    g = res.get("guard") or {}
    if g.get("rows"):
        out.append("  one uid for all, fresh workers, Docker default (emulated): the host's guard "
                   "(Landlock ABI 5) / Landlock's scope (ABI 7), same run:")
        for k, label in (("first", "a new tenant's first call"), ("warm", "a confined warm call")):
            guarded, scoped = g["rows"][f"guard_{k}"], g["rows"][f"scope_{k}"]
            out.append(f"    {label:<28} {guarded['p50']:8.3f} ms / {scoped['p50']:8.3f} ms p50: "
                       f"{g[f'{k}_ratio']:.2f}x (paired by round)")
    return "\n".join(out)


def run(ctx: Any, prog: Any) -> None:
    res = measure(max(4, ctx.cfg.cold_reps), ctx.cfg.seed)
    res["density"] = density(ctx.cfg.confined_tenants)
    res["container"] = container(max(4, ctx.cfg.cold_reps))
    res["guard"] = guard(max(4, ctx.cfg.cold_reps))
    ctx.result["confined"] = res
    prog.step("confined", "done", 0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"]:
        print(json.dumps(probe(int(sys.argv[2]))))
        sys.exit(0)
    if sys.argv[1:2] == ["--guard-probe"]:
        print(json.dumps(guard_probe(int(sys.argv[2]))))
        sys.exit(0)
    if sys.argv[1:2] == ["--guard"]:
        print(render({"rows": {}, "uss_mb": {}, "np_ratio": 0, "plain_ratio": 0, "new_ratio": 0,
                      "guard": guard(*map(int, sys.argv[2:3]))}))
        sys.exit(0)
    if sys.argv[1:2] == ["--container"]:
        print(render({"rows": {}, "uss_mb": {}, "np_ratio": 0, "plain_ratio": 0, "new_ratio": 0,
                      "container": container(*map(int, sys.argv[2:4]))}))
        sys.exit(0)
    got = measure(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
    got["density"] = density(int(sys.argv[2]) if len(sys.argv) > 2 else 200)
    print(render(got))
