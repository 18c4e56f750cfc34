"""ENVIRONMENTS: a library with its own environment (built, in the store) vs the same library
without one, and the build of a 5-wheel environment from a warm uv cache.

    wheels:  five pure-Python wheels made here, served to uv offline (UV_FIND_LINKS,
             UV_NO_INDEX, UV_OFFLINE) with a cache of this run's own
    rounds, in random order within each, "env" (a PEP 723 block naming the five wheels,
    which it imports) beside "plain" (the same library without the block: the same five
    packages found in the host's environment, a folder on the host's sys.path, as a host
    without per-library environments would have installed them):
        first call of a new tenant, from the library's template
        first call of a never-run library in a fresh host process (its own Supervisor:
            its zygote started and a plain library served first, outside the timing)
        warm calls (a batch per round, p50 of the batch; host thread and worker pinned to
            two CPUs)
        the build of the 5-wheel environment into an empty store (uv's cache warm)
    Ratios are within this run.

Run alone:  python -m benchmarks.envs [rounds]
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.envs import Environments

from .harness import paired_ratio, pin_process, pin_thread, ratio, summarize

WHEELS = tuple(f"bench_wheel{i}" for i in range(5))
LIB = '''{block}
{imports}

def {tool}(x: int = 1) -> dict:
    """A call of a library {what}."""
    return {{"success": True, "output": x}}
'''
#: A host process's first call of a never-run library: the zygote and a first library are up
#: before the clock starts, so what is timed is that library's start alone.
FRESH_HOST = '''
import json, sys, time
from lcp_sandbox import SandboxedBinding, Supervisor
store, warmup, folder, tool, ws = sys.argv[1:6]
with Supervisor(envs_dir=store) as sup:
    with SandboxedBinding(tools_folders=[warmup], supervisor=sup, workspace=ws) as w:
        assert w.execute_tool("tool_env_warmup", {})["status_code"] == 200
    with SandboxedBinding(tools_folders=[folder], supervisor=sup, workspace=ws) as b:
        b.list_tools()
        t0 = time.perf_counter()
        out = b.execute_tool(tool, {})
        took = time.perf_counter() - t0
        assert out["status_code"] == 200, out
print(json.dumps(took))
'''


def wheel(folder: Path, name: str, version: str, source: str, requires: tuple = ()) -> Path:
    """A pure-Python wheel of one package (its dist-info: METADATA, WHEEL, RECORD)."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": source,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: lcp-sandbox\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return out


@contextmanager
def offline_uv(house: Path, cache: Path) -> Iterator[None]:
    """uv reads only ``house`` (no index, no network), with its cache in ``cache``."""
    names = ("UV_FIND_LINKS", "UV_NO_INDEX", "UV_OFFLINE", "UV_CACHE_DIR", "UV_INDEX_URL",
             "UV_EXTRA_INDEX_URL", "UV_INDEX", "UV_DEFAULT_INDEX")
    saved = {k: os.environ.get(k) for k in names}
    for k in names:
        os.environ.pop(k, None)
    os.environ.update(UV_FIND_LINKS=str(house), UV_NO_INDEX="1", UV_OFFLINE="1",
                      UV_CACHE_DIR=str(cache))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _library(folder: Path, name: str, env: bool, tool: str) -> Path:
    """The folder library ``folder/name.py`` whose one tool is ``tool``."""
    folder.mkdir(parents=True)
    deps = ", ".join(repr(w) for w in WHEELS)
    (folder / f"{name}.py").write_text(LIB.format(
        block=f"# /// script\n# dependencies = [{deps}]\n# ///" if env else "",
        imports="\n".join(f"import {w}" for w in WHEELS), tool=tool,
        what="with an environment of five wheels" if env else "without an environment"))
    return folder


def _first_calls(sup: Supervisor, folders: dict, ws: str, r: int, out: dict) -> None:
    for kind in random.sample(list(folders), len(folders)):
        b = SandboxedBinding(tools_folders=[folders[kind]], supervisor=sup, workspace=ws,
                             tenant=f"{kind}-{r}")
        t0 = time.perf_counter()
        res = b.execute_tool(f"tool_env_{kind}", {})
        out[kind].append(time.perf_counter() - t0)
        assert res["status_code"] == 200 and b.stats()[0]["start"] == "template", b.stats()
        b.close()


def _warm(bindings: dict, calls: int, out: dict) -> None:
    """A batch of warm calls per library, the host thread and the worker on two CPUs (the
    headline placement of the warm section), the libraries in random order."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    for kind in random.sample(list(bindings), len(bindings)):
        b, tool, xs = bindings[kind], f"tool_env_{kind}", []
        b.execute_tool(tool, {"x": 2})                 # (its worker exists before pinning)
        if len(cpus) >= 2:
            pin_process(b.stats()[0]["pid"], {cpus[1]})
            pin_thread({cpus[0]})
        for _ in range(20):
            b.execute_tool(tool, {"x": 2})
        for _ in range(calls):
            t0 = time.perf_counter()
            b.execute_tool(tool, {"x": 2})
            xs.append(time.perf_counter() - t0)
        out[kind].append(sorted(xs)[len(xs) // 2])
        if len(cpus) >= 2:
            pin_thread(set(cpus))


def _fresh_host(tmp: Path, store: str, kind: str, r: int, ws: str) -> float:
    folder = _library(tmp / f"never-{kind}-{r}" / f"never_{kind}", f"never_{kind}", kind == "env",
                      "tool_env_never")
    warmup = _library(tmp / f"warmup-{kind}-{r}" / "env_warmup", "env_warmup", False,
                      "tool_env_warmup")
    env = {**os.environ, "PYTHONPATH": str(tmp / "host-packages")}
    done = subprocess.run([sys.executable, "-c", FRESH_HOST, store, str(warmup.parent),
                           str(folder.parent), "tool_env_never", ws], capture_output=True,
                          text=True, timeout=300, check=True, env=env)
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def measure(rounds: int = 8, warm_calls: int = 400, seed: int = 1) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="lcp-bench-envs-"))
    # (passable by any user: on a root host, builds run as a uid of their own and read the
    # wheels as that uid)
    tmp.chmod(0o711)
    rng = random.Random(seed)
    random.seed(seed)
    try:
        house = tmp / "wheels"
        house.mkdir()
        for i, name in enumerate(WHEELS):
            with zipfile.ZipFile(wheel(house, name, "1.0", f"N = {i}\n")) as z:
                z.extractall(tmp / "host-packages")        # "plain": the host has them
        sys.path.append(str(tmp / "host-packages"))
        store, ws = str(tmp / "store"), str(tmp / "ws")
        os.makedirs(ws)
        folders = {k: _library(tmp / k / f"env_{k}", f"env_{k}", k == "env", f"tool_env_{k}").parent
                   for k in ("env", "plain")}
        first: dict = {"env": [], "plain": []}
        warm: dict = {"env": [], "plain": []}
        fresh: dict = {"env": [], "plain": []}
        builds: list = []
        with offline_uv(house, tmp / "uv-cache"), Supervisor(envs_dir=store) as sup:
            built = _first_time(sup, folders, ws)
            keep = {k: SandboxedBinding(tools_folders=[folders[k]], supervisor=sup, workspace=ws,
                                        tenant=f"warm-{k}") for k in folders}
            for r in range(rounds):
                _first_calls(sup, folders, ws, r, first)
                _warm(keep, warm_calls, warm)
                for kind in rng.sample(["env", "plain"], 2):
                    fresh[kind].append(_fresh_host(tmp, store, kind, r, ws))
                empty = Environments(str(tmp / f"build-{r}"))
                t0 = time.perf_counter()
                empty.ensure(WHEELS, "benchmarks/envs.py", "bench", "build")
                builds.append(time.perf_counter() - t0)
            for b in keep.values():
                b.close()
        rows = {f"first_{k}": summarize(v, 1e-3) for k, v in first.items()}
        rows.update({f"fresh_host_{k}": summarize(v, 1e-3) for k, v in fresh.items()})
        rows.update({f"warm_{k}": summarize(v, 1e-6) for k, v in warm.items()})
        rows["build_5"] = summarize(builds, 1.0)
        return {"rows": rows, "first_build_s": built,
                "first_ratio": ratio(rows["first_env"]["p50"], rows["first_plain"]["p50"]),
                "fresh_host_ratio": ratio(rows["fresh_host_env"]["p50"],
                                          rows["fresh_host_plain"]["p50"]),
                "warm_ratio": ratio(rows["warm_env"]["p50"], rows["warm_plain"]["p50"]),
                "warm_ratio_paired": paired_ratio(dict(enumerate(warm["env"])),
                                                  dict(enumerate(warm["plain"]))),
                "build_5_s": rows["build_5"]["p50"]}
    finally:
        if str(tmp / "host-packages") in sys.path:
            sys.path.remove(str(tmp / "host-packages"))
        shutil.rmtree(tmp, ignore_errors=True)


def _first_time(sup: Supervisor, folders: dict, ws: str) -> float:
    """Both libraries run twice (the environment built, each library's template made);
    the seconds the first call of the environment's library took (its build)."""
    took = 0.0
    for t in ("first-0", "first-1"):
        for kind in folders:
            b = SandboxedBinding(tools_folders=[folders[kind]], supervisor=sup, workspace=ws,
                                 tenant=t)
            t0 = time.perf_counter()
            assert b.execute_tool(f"tool_env_{kind}", {})["status_code"] == 200
            took = took or (time.perf_counter() - t0 if kind == "env" else 0.0)
            b.close()
    return took


def render(res: dict) -> str:
    rows = res["rows"]
    out = ["ENVIRONMENTS  a library with its own environment (5 wheels, in the store) vs without",
           "                                                   env p50    plain p50   ratio"]
    for key, label, unit in (("first", "new tenant's first call, from its template", "ms"),
                             ("fresh_host", "never-run library, first call, fresh host", "ms"),
                             ("warm", "warm call", "us")):
        e, p = rows[f"{key}_env"]["p50"], rows[f"{key}_plain"]["p50"]
        out.append(f"  {label:<46} {e:8.2f} {unit} {p:8.2f} {unit} {ratio(e, p) or 0:6.2f}x")
    if res.get("warm_ratio_paired") is not None:
        out.append(f"  warm call, paired by round: {res['warm_ratio_paired']:.3f}x")
    out.append(f"  5-wheel environment built from a warm uv cache: {res['build_5_s']:.3f} s p50 "
               f"(the first build, cold cache, in a first call: {res['first_build_s']:.3f} s)")
    return "\n".join(out)


def run(ctx: Any, prog: Any) -> None:
    ctx.result["envs"] = measure(max(3, min(ctx.cfg.cold_reps, 8)),
                                 min(400, max(20, ctx.cfg.calls // 25)), ctx.cfg.seed)
    prog.step("envs", "done", 0)


if __name__ == "__main__":
    print(render(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 8)))
