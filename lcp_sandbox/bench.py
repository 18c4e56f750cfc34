"""``lcp-sandbox bench``: cold, warm, throughput, memory and discovery figures,
with the baselines measured in the same run and every row as a ratio.

    run_bench(config) ─► dict  (also --json, a table on stdout, --plot PNG)
      setup       temp dir: bundled libraries copied, a workspace; one Supervisor
                  whose zygote is started before anything is timed
      warm        rounds × placements (split CPUs / unpinned) × paths in a fresh
                  random order each time: floor, pickle RPC (no engine), sandbox,
                  in-process LCPBinding, ProcessPoolExecutor, python -c per call
      cold        rounds × paths in random order, each a never-run process:
                  sandbox (zygote fork), spawn, python -c, a new
                  ProcessPoolExecutor, in-process first import; phases come from
                  perf_counter stamps taken inside the tool's process
      routing     one Supervisor, 50 tenants × 4 small libraries: a warm call to one
                  worker with 1 live worker in the pool vs 200 live, alternating
                  in rounds (the other 199 started / stopped between batches)
      throughput  rounds × (tool, libraries K, host threads T)
      memory      USS / PSS / RSS of workers after their first call and after N
      discovery   N generated tool files: first time, again unchanged
      targets     the issue's ratios, each with its limit and met / missed

The floor is a raw AF_UNIX socketpair ping-pong between the host thread and a
small child process, with the byte sizes of a real call and its result.  On
these VMs a round trip costs ~80 us when the two processes are on different
CPUs and ~3 us when they share one, and the scheduler flips between the two:
the headline warm figures pin the host thread and the worker to different CPUs
(``os.sched_setaffinity``); unpinned figures are shown beside them.

What the harness keeps out of what it reports: the timer's own cost (measured,
subtracted), progress output (only between batches), the harness's garbage
(collected before each batch; the garbage collector stays on while timing, so
the engine's own allocations still pay for it), discovery and binding set-up
(cold starts the clock at the first ``execute_tool``), and process teardown.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import pickle
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Optional

now_ns = time.perf_counter_ns

# ---------------------------------------------------------------- configuration


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
    cpus: Optional[tuple] = None          # (host CPU, worker CPU); default: the first two allowed
    skip: tuple = ()                      # any of: floor pickle inprocess ppe subprocess spawn routing throughput memory discovery
    seed: int = 1
    binding_kwargs: dict = field(default_factory=dict)   # extra SandboxedBinding keywords for --folder

    @classmethod
    def quick(cls, **kw: Any) -> "BenchConfig":
        base = dict(calls=2000, rounds=10, subprocess_calls=6, cold_reps=10, zygote_reps=2,
                    duration_s=0.4, throughput_rounds=3, mem_calls=5000, discovery_reps=2,
                    routing_workers=40, routing_calls=1200, routing_rounds=4, routing_window_s=0.5)
        base.update(kw)
        return cls(**base)


SKIPPABLE = ("floor", "pickle", "inprocess", "ppe", "subprocess", "spawn", "routing", "throughput",
             "memory", "discovery")

ROUTING_LIBRARIES = 4                     # small libraries per routing tenant
ROUTING_SUB_BATCH = 125                   # routing: calls back to back, at a random moment of the window
ROUTING_SETTLE_S = 0.5                    # routing: pause after the other workers were started / stopped

TARGETS = {
    "warm_p50": 1.05, "warm_p99": 1.25, "cold_vs_spawn": 0.06, "parallel": 1.9,
    "uss_mb": 8.0, "discovery_first_s": 1.0, "discovery_again_s": 0.05,
}

# ---------------------------------------------------------------- small helpers


def percentile(sorted_xs: list, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_xs:
        return float("nan")
    k = (len(sorted_xs) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (k - lo)


def summarize(xs: list, scale: float) -> dict:
    """p50/p90/p99/max/mean/min of ``xs`` divided by ``scale``."""
    s = sorted(xs)
    if not s:
        return {"n": 0}
    return {"n": len(s), "p50": percentile(s, 50) / scale, "p90": percentile(s, 90) / scale,
            "p99": percentile(s, 99) / scale, "max": s[-1] / scale, "min": s[0] / scale,
            "mean": sum(s) / len(s) / scale}


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or not b or (isinstance(a, float) and math.isnan(a)):
        return None
    return a / b


def timer_overhead_ns(n: int = 20000) -> float:
    """Median cost of the timed region's own bracketing (two perf_counter_ns calls)."""
    xs = []
    for _ in range(n):
        t0 = now_ns()
        t1 = now_ns()
        xs.append(t1 - t0)
    xs.sort()
    return float(xs[len(xs) // 2])


def _pin_thread(cpus: Optional[set]) -> None:
    """Pin the calling thread (Linux: pid 0 is the calling thread)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def _pin_process(pid: Optional[int], cpus: Optional[set]) -> None:
    """Pin every thread of a process."""
    if not pid or not cpus or not hasattr(os, "sched_setaffinity"):
        return
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


def _pin_tid(tid: Optional[int], cpus: Optional[set]) -> None:
    if tid and cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


def _sched(pid: Optional[int], tid: Optional[int] = None, exclude_tid: Optional[int] = None) -> Optional[tuple]:
    """(ns on a CPU, ns waiting on a run queue) so far, summed over the threads of ``pid``
    (or of one thread ``tid``), from /proc/PID/task/TID/schedstat."""
    if not pid:
        return None
    if tid is not None:
        tids = [str(tid)]
    else:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return None
    run = wait = 0
    for t in tids:
        if exclude_tid is not None and int(t) == exclude_tid:
            continue
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                v = f.read().split()
            run += int(v[0])
            wait += int(v[1])
        except (OSError, ValueError, IndexError):
            if tid is not None:
                return None
    return run, wait


def _cpu_snapshot(pids: list) -> list:
    """[this thread's CPU, its run-queue wait, the other host threads' CPU, the pids' CPU,
    their run-queue wait], ns, each None when unknown."""
    me, tid = os.getpid(), threading.get_native_id()
    own = _sched(me, tid=tid)
    others = _sched(me, exclude_tid=tid)
    worker = None
    for pid in pids:
        v = _sched(pid)
        if v is not None:
            worker = (worker[0] + v[0], worker[1] + v[1]) if worker else v
    return [own and own[0], own and own[1], others and others[0], worker and worker[0], worker and worker[1]]


def bundled_bench_libs() -> Path:
    """benchmarks/libs of a source checkout (or of an installed ``benchmarks`` package)."""
    here = Path(__file__).resolve().parent.parent / "benchmarks" / "libs"
    if (here / "bench_noop.py").is_file():
        return here
    import importlib.util
    try:
        spec = importlib.util.find_spec("benchmarks")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            cand = Path(loc) / "libs"
            if (cand / "bench_noop.py").is_file():
                return cand
    raise FileNotFoundError("the benchmark libraries (benchmarks/libs/bench_noop.py) were not found")


class Progress:
    """One stderr line, redrawn between batches (never inside a timed region)."""

    def __init__(self, total: int, enabled: bool, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.total = max(1, total)
        self.done = 0
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.phase = ""
        self.t0 = time.monotonic()

    def step(self, phase: str, detail: str = "", n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        if not self.enabled:
            return
        if self.tty:
            width = 28
            fill = int(width * self.done / self.total)
            line = (f"\r[{'#' * fill}{'.' * (width - fill)}] {100 * self.done // self.total:3d}% "
                    f"{time.monotonic() - self.t0:5.0f}s  {phase}: {detail}")
            self.stream.write(line[:110].ljust(110))
            self.stream.flush()
        elif phase != self.phase:
            self.stream.write(f"[{100 * self.done // self.total:3d}%] {phase}\n")
            self.stream.flush()
        self.phase = phase

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r" + " " * 110 + "\r")
            self.stream.flush()


# ---------------------------------------------------------------- code run in other processes

# Loads one tool file as the in-process binding does (import, init_tools_library), in a
# fresh interpreter too: kept free of heavy imports (no inspect) so baselines pay only
# for what a minimal loader needs.
_LOADER = '''
def _lcp_bench_load(path, name):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    init = getattr(mod, "init_tools_library", None)
    if callable(init):
        code = getattr(init, "__code__", None)
        if code is None or code.co_argcount or code.co_flags & 4:
            init({})
        else:
            init()
    return mod
'''
exec(_LOADER)          # defines _lcp_bench_load here too (ProcessPoolExecutor workers use it)

_SUBPROCESS_CODE = _LOADER + '''
import json, sys
_m = _lcp_bench_load(sys.argv[1], "lcp_bench_tool")
print(json.dumps(getattr(_m, sys.argv[2])(**json.loads(sys.argv[3])), default=str))
'''

_SPAWN_CODE = _LOADER + '''
conn.send(getattr(_lcp_bench_load(path, "lcp_bench_tool"), tool)(**params))
conn.close()
'''

_FLOOR_CHILD = '''
import os, sys
fd, n, m = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
reply = b"r" * m
read, write = os.read, os.write
while True:
    got = 0
    while got < n:
        d = read(fd, 65536)
        if not d:
            os._exit(0)
        got += len(d)
    write(fd, reply)
'''

# The pickle RPC child: the floor's child plus what any Python engine must do per call,
# a 4-byte length header ("!I", as lcp_sandbox.wire) + a protocol-5 pickle each way.
_PICKLE_CHILD = '''
import os, sys, pickle, struct
fd = int(sys.argv[1])
read, write, loads, dumps = os.read, os.write, pickle.loads, pickle.dumps
hdr = struct.Struct("!I")
buf = b""
while True:
    while len(buf) < 4:
        d = read(fd, 65536)
        if not d:
            os._exit(0)
        buf += d
    (n,) = hdr.unpack_from(buf)
    while len(buf) < 4 + n:
        d = read(fd, 65536)
        if not d:
            os._exit(0)
        buf += d
    msg = loads(buf[4:4 + n])
    buf = buf[4 + n:]
    body = dumps((10, {"output": 1, "status_code": 200, "success": True}, None), protocol=5)
    write(fd, hdr.pack(len(body)) + body)
'''

_ppe_modules: dict = {}


def _ppe_call(path: str, tool: str, params: dict) -> Any:
    """Runs in a ProcessPoolExecutor worker: load the file once, call the tool."""
    mod = _ppe_modules.get(path)
    if mod is None:
        mod = _ppe_modules[path] = _lcp_bench_load(path, "lcp_bench_ppe_" + Path(path).stem)  # noqa: F821
    return getattr(mod, tool)(**params)


def _phases(t0: float, t1: float, stamps: Any) -> Optional[dict]:
    """Split [t0, t1] (perf_counter seconds) with the stamps a bench tool returned."""
    if not isinstance(stamps, dict) or "import_start" not in stamps:
        return None
    imp = stamps["import_start"]
    ready = stamps.get("init_end") or stamps.get("import_end") or imp
    return {"start": imp - t0, "import_init": ready - imp, "call": t1 - ready}


# ---------------------------------------------------------------- warm paths


class WarmPath:
    """One way of making a call; ``run(n)`` returns n round-trip times in ns."""
    key = ""
    label = ""
    kind = ""          # floor / pickle / sandbox / inprocess / ppe / subprocess
    warmup = 5

    def place(self, host: Optional[set], worker: Optional[set]) -> None:
        pass

    def cpu_pids(self) -> list:
        """The processes that serve this path's calls (their CPU time is accounted)."""
        return []

    def run(self, n: int) -> list:
        raise NotImplementedError

    def close(self) -> None:
        pass


class FloorPath(WarmPath):
    kind = "floor"

    def __init__(self, req_bytes: int, reply_bytes: int) -> None:
        import socket
        self.key, self.label = "floor", "floor: raw socketpair ping-pong"
        self.req = b"q" * req_bytes
        self.reply_bytes = reply_bytes
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _FLOOR_CHILD, str(child.fileno()), str(req_bytes),
             str(reply_bytes)], pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        child.close()
        self.fd = self.sock.fileno()
        self.run(3)

    def place(self, host: Optional[set], worker: Optional[set]) -> None:
        _pin_process(self.proc.pid, worker)

    def cpu_pids(self) -> list:
        return [self.proc.pid]

    def run(self, n: int) -> list:
        fd, req, m = self.fd, self.req, self.reply_bytes
        read, write = os.read, os.write
        out = []
        append = out.append
        for _ in range(n):
            t0 = now_ns()
            write(fd, req)
            got = len(read(fd, 65536))
            while got < m:
                got += len(read(fd, 65536))
            t1 = now_ns()
            append(t1 - t0)
        return out

    def close(self) -> None:
        # A process forked from the host since (a ProcessPoolExecutor worker) holds a copy
        # of our end, so the child may never see EOF: stop it outright.
        self.sock.close()
        self.proc.kill()
        self.proc.wait()


class PicklePath(FloorPath):
    """The floor's placement and socketpair, each round trip a minimal Python RPC: the host
    pickles a CALL-like tuple and frames it, the child unpickles it, pickles a result tuple
    and frames it, the host unpickles it.  What any Python engine pays on top of the floor."""
    kind = "pickle"

    def __init__(self) -> None:
        import socket
        self.key, self.label = "pickle", "pickle RPC (no engine)"
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _PICKLE_CHILD, str(child.fileno())],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        child.close()
        self.fd = self.sock.fileno()
        self.run(3)

    def run(self, n: int) -> list:
        import struct
        fd = self.fd
        read, write, dumps, loads = os.read, os.write, pickle.dumps, pickle.loads
        hdr = struct.Struct("!I")
        pack, unpack_from = hdr.pack, hdr.unpack_from
        out = []
        append = out.append
        for _ in range(n):
            t0 = now_ns()
            body = dumps((2, "tool_noop", 0, {"x": 1}, "/tmp", None, 0), protocol=5)
            write(fd, pack(len(body)) + body)
            buf = read(fd, 65536)
            while len(buf) < 4:
                buf += read(fd, 65536)
            m = unpack_from(buf)[0] + 4
            while len(buf) < m:
                buf += read(fd, 65536)
            res = loads(buf[4:m])
            t1 = now_ns()
            append(t1 - t0)
        if n and res[0] != 10:
            raise RuntimeError(f"pickle RPC child answered {res!r}")
        return out


class SandboxPath(WarmPath):
    kind = "sandbox"

    def __init__(self, key: str, binding: Any, tool: str, params: dict, library: str) -> None:
        self.key, self.label = key, f"sandbox {tool}"
        self.b, self.tool, self.params, self.library = binding, tool, params, library
        r = binding.execute_tool(tool, dict(params))
        if r.get("status_code") != 200:
            raise RuntimeError(f"{tool} failed in the sandbox: {r.get('error')}")
        self.first_result = r

    def pid(self) -> Optional[int]:
        for s in self.b.stats():
            if s["library"] == self.library and s["pid"]:
                return s["pid"]
        return None

    def place(self, host: Optional[set], worker: Optional[set]) -> None:
        _pin_process(self.pid(), worker)

    def cpu_pids(self) -> list:
        return [self.pid()]

    def run(self, n: int) -> list:
        call, tool, params = self.b.execute_tool, self.tool, self.params
        out = []
        append = out.append
        for _ in range(n):
            t0 = now_ns()
            call(tool, params)
            t1 = now_ns()
            append(t1 - t0)
        return out


class InProcessPath(WarmPath):
    kind = "inprocess"

    def __init__(self, key: str, lcp: Any, tool: str, params: dict) -> None:
        self.key, self.label = key, f"in-process LCPBinding {tool}"
        self.lcp, self.tool, self.params = lcp, tool, params
        r = lcp.execute_tool(tool, dict(params))
        if not r.get("success", r.get("status_code") == 200):
            raise RuntimeError(f"{tool} failed in-process: {r.get('error')}")

    def run(self, n: int) -> list:
        call, tool, params = self.lcp.execute_tool, self.tool, self.params
        out = []
        append = out.append
        for _ in range(n):
            p = dict(params)             # LCPBinding fills defaults into the caller's dict
            t0 = now_ns()
            call(tool, p)
            t1 = now_ns()
            append(t1 - t0)
        return out


class PPEPath(WarmPath):
    kind = "ppe"

    def __init__(self, key: str, path: str, tool: str, params: dict) -> None:
        import concurrent.futures
        self.key, self.label = key, f"ProcessPoolExecutor {tool}"
        self.path, self.tool, self.params = path, tool, params
        self.ex = concurrent.futures.ProcessPoolExecutor(max_workers=1)
        self.ex.submit(_ppe_call, path, tool, params).result(60)

    def pids(self) -> list:
        return list(getattr(self.ex, "_processes", None) or {})

    def manager_tid(self) -> Optional[int]:
        t = getattr(self.ex, "_executor_manager_thread", None)
        return getattr(t, "native_id", None)

    def place(self, host: Optional[set], worker: Optional[set]) -> None:
        for pid in self.pids():
            _pin_process(pid, worker)
        _pin_tid(self.manager_tid(), host)

    def cpu_pids(self) -> list:
        return self.pids()

    def run(self, n: int) -> list:
        submit, fn, path, tool, params = self.ex.submit, _ppe_call, self.path, self.tool, self.params
        out = []
        append = out.append
        for _ in range(n):
            t0 = now_ns()
            submit(fn, path, tool, params).result()
            t1 = now_ns()
            append(t1 - t0)
        return out

    def close(self) -> None:
        self.ex.shutdown(wait=True, cancel_futures=True)


class SubprocessPath(WarmPath):
    kind = "subprocess"
    warmup = 0

    def __init__(self, key: str, path: str, tool: str, params: dict) -> None:
        self.key, self.label = key, f"python -c per call {tool}"
        self.argv = [sys.executable, "-c", _SUBPROCESS_CODE, path, tool, json.dumps(params)]
        r = subprocess.run(self.argv, capture_output=True, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"python -c failed: {r.stderr.decode(errors='replace')[-300:]}")

    def run(self, n: int) -> list:
        run, argv, pipe = subprocess.run, self.argv, subprocess.PIPE
        out = []
        for _ in range(n):
            t0 = now_ns()
            run(argv, stdout=pipe, stderr=pipe, stdin=subprocess.DEVNULL)
            t1 = now_ns()
            out.append(t1 - t0)
        return out


# ---------------------------------------------------------------- cold paths


class ColdPath:
    """``once()`` times one never-run start: (t0, t1, what the tool returned), perf_counter seconds."""
    key = ""
    label = ""

    def once(self) -> tuple:
        raise NotImplementedError

    def close(self) -> None:
        pass


class SandboxCold(ColdPath):
    def __init__(self, key: str, label: str, sup: Any, folders: list, ws: str, tool: str,
                 params: dict, binding_kwargs: Optional[dict] = None) -> None:
        self.key, self.label = key, label
        self.sup, self.folders, self.ws, self.tool, self.params = sup, folders, ws, tool, params
        self.kw = binding_kwargs or {}
        self.n = 0

    def once(self) -> tuple:
        from .binding import SandboxedBinding
        self.n += 1
        b = SandboxedBinding(tools_folders=self.folders, workspace=self.ws, supervisor=self.sup,
                             tenant=f"bench-cold-{self.key}-{self.n}", **self.kw)
        try:
            p = dict(self.params)
            t0 = time.perf_counter()
            r = b.execute_tool(self.tool, p)
            t1 = time.perf_counter()
        finally:
            b.close()
        if r.get("status_code") != 200:
            raise RuntimeError(f"{self.tool} failed cold in the sandbox: {r.get('error')}")
        return t0, t1, r.get("output")


class SpawnCold(ColdPath):
    def __init__(self, key: str, path: str, tool: str, params: dict) -> None:
        import multiprocessing
        self.key, self.label = key, f"spawn (fresh interpreter) {tool}"
        self.ctx = multiprocessing.get_context("spawn")
        self.path, self.tool, self.params = path, tool, params

    def once(self) -> tuple:
        parent, child = self.ctx.Pipe(duplex=False)
        p = self.ctx.Process(target=exec, args=(_SPAWN_CODE, {"conn": child, "path": self.path,
                                                            "tool": self.tool, "params": self.params}),
                             daemon=True)
        # The child must not re-import the harness's own __main__ (a script that imports
        # the whole engine): hide it while the preparation data is built in start().
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            t0 = time.perf_counter()
            p.start()
        finally:
            sys.modules["__main__"] = main
        try:
            if not parent.poll(60):
                raise RuntimeError("the spawned child did not answer")
            out = parent.recv()
            t1 = time.perf_counter()
        finally:
            child.close()
            parent.close()
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
        return t0, t1, out


class SubprocessCold(ColdPath):
    def __init__(self, key: str, path: str, tool: str, params: dict) -> None:
        self.key, self.label = key, f"python -c {tool}"
        self.argv = [sys.executable, "-c", _SUBPROCESS_CODE, path, tool, json.dumps(params)]

    def once(self) -> tuple:
        t0 = time.perf_counter()
        r = subprocess.run(self.argv, capture_output=True, stdin=subprocess.DEVNULL)
        t1 = time.perf_counter()
        if r.returncode != 0:
            raise RuntimeError(f"python -c failed: {r.stderr.decode(errors='replace')[-300:]}")
        try:
            out = json.loads(r.stdout)
        except ValueError:
            out = None
        return t0, t1, out


class PPECold(ColdPath):
    def __init__(self, key: str, path: str, tool: str, params: dict) -> None:
        self.key, self.label = key, f"new ProcessPoolExecutor {tool}"
        self.path, self.tool, self.params = path, tool, params

    def once(self) -> tuple:
        import concurrent.futures
        t0 = time.perf_counter()
        ex = concurrent.futures.ProcessPoolExecutor(max_workers=1)
        try:
            out = ex.submit(_ppe_call, self.path, self.tool, self.params).result(60)
            t1 = time.perf_counter()
        finally:
            ex.shutdown(wait=True)
        return t0, t1, out


class InProcessCold(ColdPath):
    def __init__(self, key: str, lcp: Any, tool: str, params: dict, module_name: str) -> None:
        self.key, self.label = key, f"in-process LCPBinding first import {tool}"
        self.lcp, self.tool, self.params, self.module_name = lcp, tool, params, module_name

    def once(self) -> tuple:
        sys.modules.pop(self.module_name, None)
        p = dict(self.params)
        t0 = time.perf_counter()
        r = self.lcp.execute_tool(self.tool, p)
        t1 = time.perf_counter()
        return t0, t1, r.get("output")


# ---------------------------------------------------------------- the run


class _Run:
    def __init__(self, cfg: BenchConfig, progress: bool) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.show_progress = progress
        self.result: dict = {"meta": {}, "skipped": {}, "warm": {}, "routing": {}, "cold": {},
                             "throughput": [], "memory": [], "discovery": {}, "targets": []}
        self.skipped = self.result["skipped"]
        self.cleanup: list[Callable[[], None]] = []

    # ------------------------------------------------------------ setup
    def setup(self) -> None:
        from .binding import SandboxedBinding
        from .supervisor import Supervisor
        cfg = self.cfg
        self.cleanup.append(_stop_resource_tracker_if_new())      # runs last
        self.tmp = Path(tempfile.mkdtemp(prefix="lcp-bench-"))
        self.cleanup.append(lambda: shutil.rmtree(self.tmp, ignore_errors=True))
        self.libs = self.tmp / "libs"
        shutil.copytree(bundled_bench_libs(), self.libs,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        # Installed libraries usually have their bytecode cached; compile the copies now so no
        # path pays for compiling them (the import system reads a .pyc even when
        # PYTHONDONTWRITEBYTECODE keeps it from writing one).
        import compileall
        compileall.compile_dir(str(self.libs), quiet=1)
        self.ws = str(self.tmp / "workspace")
        os.makedirs(self.ws)
        self.noop_path = str((self.libs / "bench_noop.py").resolve())
        self.heavy_path = str((self.libs / "bench_heavy.py").resolve())

        self.all_cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        _pin_thread(self.all_cpus)
        if cfg.cpus:
            host_cpu, worker_cpu = cfg.cpus
        elif self.all_cpus and len(self.all_cpus) >= 2:
            host_cpu, worker_cpu = sorted(self.all_cpus)[:2]
        else:
            host_cpu = worker_cpu = None
        self.placements = {"unpinned": (self.all_cpus, self.all_cpus)}
        if host_cpu is not None and worker_cpu is not None and host_cpu != worker_cpu:
            self.placements = {"split": ({host_cpu}, {worker_cpu}), **self.placements}
        else:
            self.skipped["split"] = "fewer than two CPUs to pin the host thread and the worker apart"
        self.headline = "split" if "split" in self.placements else "unpinned"

        self.lcp_cls = None
        if "inprocess" in cfg.skip:
            self.skipped["inprocess"] = "skipped by request"
        else:
            try:
                from lollms_client.tools_bindings.lcp import LCPBinding
                self.lcp_cls = LCPBinding
            except Exception as exc:                           # noqa: BLE001
                self.skipped["inprocess"] = f"lollms_client is not available ({type(exc).__name__}: {exc})"

        # The supervisor (and so the zygote, and every worker it forks) starts while
        # this thread is unpinned: a process inherits the affinity of its creator.
        self.sup = Supervisor()
        t0 = time.perf_counter()
        self.sup.start()
        self.zygote_first_s = time.perf_counter() - t0
        self.cleanup.append(self.sup.close)
        self.binding = SandboxedBinding(tools_folders=[str(self.libs)], workspace=self.ws,
                                        supervisor=self.sup, tenant="bench-warm")

        self.user = None
        if cfg.folder:
            self.user = self._user_setup(SandboxedBinding)

        m = self.result["meta"]
        m.update({
            "python": sys.version.split()[0], "implementation": platform.python_implementation(),
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "allowed_cpus": sorted(self.all_cpus) if self.all_cpus else None,
            "host_cpu": host_cpu, "worker_cpu": worker_cpu, "headline_placement": self.headline,
            "placements": list(self.placements), "config": _jsonable(asdict(cfg)),
            "lollms_client": _version("lollms-client") if self.lcp_cls else None,
            "lcp_sandbox": _version("lcp-sandbox"),
            "timer_overhead_ns": timer_overhead_ns(),
            "dont_write_bytecode": bool(sys.dont_write_bytecode),
            "engine_source": _engine_source(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "targets": TARGETS,
        })

    def _user_setup(self, SandboxedBinding: Any) -> dict:
        cfg = self.cfg
        folder = str(Path(cfg.folder).resolve())
        b = SandboxedBinding(tools_folders=[folder], workspace=self.ws, supervisor=self.sup,
                             tenant="bench-user", **cfg.binding_kwargs)
        specs = {s["name"]: s for s in b.discovered_tools}
        tool = cfg.tool
        if tool is None:
            free = [s["name"] for s in b.discovered_tools if not s["input_schema"].get("required")]
            if not free:
                raise SystemExit(f"no tool of {folder} can be called without parameters: pass --tool and --params")
            tool = free[0]
        if tool not in specs:
            raise SystemExit(f"tool {tool!r} not found in {folder} (found: {', '.join(sorted(specs)) or 'none'})")
        self.cleanup.append(b.close)
        spec = specs[tool]
        return {"folder": folder, "tool": tool, "params": dict(cfg.params), "binding": b,
                "library": spec.get("_library"), "path": spec.get("_python_file_path")}

    # ------------------------------------------------------------ warm
    def warm_paths(self) -> list:
        cfg = self.cfg
        paths: list = []

        def add(make: Callable[[], WarmPath], kind: str, key: str) -> None:
            if kind in cfg.skip:
                self.skipped[key] = "skipped by request"
                return
            try:
                p = make()
            except Exception as exc:                           # noqa: BLE001
                self.skipped[key] = f"{type(exc).__name__}: {exc}"
                return
            paths.append(p)
            self.cleanup.append(p.close)

        sb = SandboxPath("sandbox", self.binding, "tool_noop", {}, "bench_noop")
        paths.append(sb)
        req, reply = _message_sizes(sb.first_result, "tool_noop", {}, self.ws)
        self.result["meta"]["message_bytes"] = {"request": req, "reply": reply}
        add(lambda: FloorPath(req, reply), "floor", "floor")
        add(PicklePath, "pickle", "pickle")
        if self.lcp_cls is not None:
            self.lcp = self.lcp_cls(tools_folders=[str(self.libs)])
            add(lambda: InProcessPath("inprocess", self.lcp, "tool_noop", {}), "inprocess", "inprocess")
        add(lambda: PPEPath("ppe", self.noop_path, "tool_noop", {}), "ppe", "ppe")
        add(lambda: SubprocessPath("subprocess", self.noop_path, "tool_noop", {}), "subprocess", "subprocess")
        u = self.user
        if u:
            t, prm = u["tool"], u["params"]
            add(lambda: SandboxPath(f"sandbox:{t}", u["binding"], t, prm, u["library"]), "sandbox", f"sandbox:{t}")
            if self.lcp_cls is not None:
                def make_inproc() -> WarmPath:
                    u["lcp"] = self.lcp_cls(tools_folders=[u["folder"]])
                    return InProcessPath(f"inprocess:{t}", u["lcp"], t, prm)
                add(make_inproc, "inprocess", f"inprocess:{t}")
            if u["path"]:
                add(lambda: PPEPath(f"ppe:{t}", u["path"], t, prm), "ppe", f"ppe:{t}")
                add(lambda: SubprocessPath(f"subprocess:{t}", u["path"], t, prm), "subprocess",
                    f"subprocess:{t}")
        return paths

    def warm(self, paths: list, prog: Progress) -> None:
        cfg = self.cfg
        rounds = max(1, cfg.rounds)
        samples = {pl: {p.key: [] for p in paths} for pl in self.placements}
        cpu: dict = {pl: {} for pl in self.placements}      # key -> [calls, *_cpu_snapshot deltas]
        overhead = self.result["meta"]["timer_overhead_ns"]
        try:
            for r in range(rounds):
                for pl, (host, worker) in self.placements.items():
                    order = list(paths)
                    self.rng.shuffle(order)
                    for p in order:
                        n = _share(cfg.subprocess_calls if p.kind == "subprocess" else cfg.calls, rounds, r)
                        if n <= 0:
                            continue
                        _pin_thread(host)
                        p.place(host, worker)
                        if p.warmup:
                            p.run(p.warmup)
                        pids = p.cpu_pids()
                        gc.collect(1)
                        c0 = _cpu_snapshot(pids)
                        xs = p.run(n)
                        c1 = _cpu_snapshot(pids)
                        samples[pl][p.key].append((r, xs))
                        acc = cpu[pl].setdefault(p.key, [0] * 6)
                        acc[0] += n
                        for i in range(5):
                            if c0[i] is not None and c1[i] is not None:
                                acc[i + 1] += c1[i] - c0[i]
                        prog.step("warm", f"round {r + 1}/{rounds} {pl:<8} {p.label}")
        finally:
            _pin_thread(self.all_cpus)
            for p in paths:
                p.place(self.all_cpus, self.all_cpus)
        order = {"floor": 0, "pickle": 1, "sandbox": 2, "inprocess": 3, "ppe": 4, "subprocess": 5}
        paths = sorted(paths, key=lambda p: (order.get(p.kind, 9), ":" in p.key))
        samples = {pl: {p.key: by[p.key] for p in paths} for pl, by in samples.items()}
        labels = {p.key: p.label for p in paths}
        kinds = {p.key: p.kind for p in paths}
        for pl, by in samples.items():
            out = self.result["warm"][pl] = {}
            per_round: dict = {}
            for key, batches in by.items():
                per_round[key] = {r: sorted(max(0.0, x - overhead) for x in xs) for r, xs in batches}
                xs = [max(0.0, x - overhead) for _, batch in batches for x in batch]
                row = summarize(xs, 1000.0)           # microseconds
                row.update(label=labels[key], kind=kinds[key], unit="us",
                           samples_us=[round(x / 1000.0, 3) for x in xs],
                           round_of_sample=[r for r, batch in batches for _ in batch])
                acc = cpu[pl].get(key)
                if acc and acc[0]:
                    per = [v / acc[0] / 1000.0 for v in acc[1:]]
                    served = kinds[key] in ("floor", "pickle", "sandbox", "ppe")
                    row["cpu_us_per_call"] = {
                        "host_thread": per[0], "host_other_threads": per[2],
                        "worker": per[3] if served else None}
                    # time runnable but not running (another task had the CPU): noise, per call
                    row["runq_wait_us_per_call"] = {"host_thread": per[1], "worker": per[4] if served else None}
                out[key] = row
            floor = out.get("floor")
            for key, row in out.items():
                row["x_floor_p50"] = _ratio(row.get("p50"), floor and floor.get("p50"))
                row["x_floor_p99"] = _ratio(row.get("p99"), floor and floor.get("p99"))
                # Paired by round: the path's and the floor's batches of one round ran back to
                # back, so a burst of outside load hits both; the median over rounds of the
                # per-round ratio shrugs off the rounds such a burst spoiled.
                for q in (50, 99):
                    ratios = sorted(
                        percentile(xs, q) / percentile(per_round["floor"][r], q)
                        for r, xs in per_round[key].items()
                        if floor and r in per_round["floor"] and percentile(per_round["floor"][r], q) > 0)
                    row[f"x_floor_p{q}_paired"] = percentile(ratios, 50) if ratios else None

    # ------------------------------------------------------------ routing
    def routing(self, prog: Progress) -> None:
        """A warm call to one worker with 1 live worker in the pool vs N live.

        One Supervisor (its own, started while this thread is unpinned) shared by N/4
        tenants' bindings over 4 small libraries; the measured worker is (t0, library 0).
        The other N-1 are started (one call each) or stopped between batches, never
        while timing; the conditions alternate (N, 1 | 1, N | N, 1...), so every round
        has one transition and each condition follows one half of the time.  A batch is
        spread over ``routing_window_s`` in runs of ROUTING_SUB_BATCH calls at random
        moments: the supervisor's periodic work (its watchdog's sweeps, whose length
        grows with the live workers) is sampled at every phase, not at one that the
        schedule of the transitions happens to lock onto."""
        import compileall
        import concurrent.futures
        from .binding import SandboxedBinding
        from .supervisor import Supervisor
        cfg = self.cfg
        nlib = ROUTING_LIBRARIES
        n_many = max(2, cfg.routing_workers)
        n_tenants = -(-n_many // nlib)
        rounds = max(1, cfg.routing_rounds)
        window = max(0.0, cfg.routing_window_s)
        rng = random.Random(cfg.seed + 1)     # its own: the other sections' orders stay as they were
        host, worker = self.placements[self.headline]
        overhead = self.result["meta"]["timer_overhead_ns"]
        folder = self.tmp / "routing"
        folder.mkdir()
        for j in range(nlib):
            (folder / f"bench_route_{j}.py").write_text(_ROUTING_LIB.format(j=j))
        compileall.compile_dir(str(folder), quiet=1)

        _pin_thread(self.all_cpus)        # the zygote, and so every worker, inherits this affinity
        sup = Supervisor()
        self.cleanup.append(sup.close)
        try:
            sup.start()
            bindings = [SandboxedBinding(tools_folders=[str(folder)], workspace=self.ws, supervisor=sup,
                                         tenant=f"t{i}") for i in range(n_tenants)]
            pairs = [(b, f"tool_route{j}_noop") for b in bindings for j in range(nlib)][:n_many]
            (b0, tool0), others = pairs[0], pairs[1:]
            key_of = {t: b0._routes[t].library.key for _, t in pairs}

            def one_call(pair: tuple) -> None:
                b, t = pair
                r = b.execute_tool(t, {})
                if r.get("status_code") != 200:
                    raise RuntimeError(f"{t} failed for tenant {b.tenant}: {r.get('error')}")

            def start_others() -> float:
                t0 = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(4) as ex:
                    list(ex.map(one_call, others))
                return time.perf_counter() - t0

            def stop_others() -> float:
                t0 = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(8) as ex:
                    list(ex.map(lambda p: sup.stop(p[0].tenant, key_of[p[1]]), others))
                return time.perf_counter() - t0

            path = SandboxPath("routing", b0, tool0, {}, "bench_route_0")
            pid = path.pid()
            transitions: dict = {"start_others": [start_others()], "stop_others": []}
            time.sleep(ROUTING_SETTLE_S)
            prog.step("routing", f"{n_many} workers started")
            live_of = {"one": 1, "many": len(pairs)}
            samples: dict = {c: [] for c in live_of}
            seen: dict = {c: set() for c in live_of}
            acc: dict = {c: [0] * 6 for c in live_of}
            state = "many"
            try:
                for r in range(rounds):
                    for cond in (("many", "one") if r % 2 == 0 else ("one", "many")):
                        if cond != state:
                            _pin_thread(self.all_cpus)
                            if cond == "many":
                                transitions["start_others"].append(start_others())
                            else:
                                transitions["stop_others"].append(stop_others())
                            state = cond
                            time.sleep(ROUTING_SETTLE_S)     # the zygote's spare forked again...
                        live = sup.pool_stats()["live_workers"]
                        seen[cond].add(live)
                        if live != live_of[cond]:
                            raise RuntimeError(f"{live} live workers where {live_of[cond]} were expected")
                        n = _share(cfg.routing_calls, rounds, r)
                        if n <= 0:
                            continue
                        _pin_thread(host)
                        _pin_process(pid, worker)
                        k = -(-n // ROUTING_SUB_BATCH)
                        offsets = sorted(rng.uniform(0.0, window) for _ in range(k))
                        xs = []
                        a = acc[cond]
                        start = time.perf_counter()
                        for i, off in enumerate(offsets):
                            delay = start + off - time.perf_counter()
                            if delay > 0:
                                time.sleep(delay)
                            path.run(path.warmup)   # untimed: the first calls after a pause are slower
                            m = _share(n, k, i)
                            gc.collect(1)
                            c0 = _cpu_snapshot([pid])
                            xs += path.run(m)
                            c1 = _cpu_snapshot([pid])
                            a[0] += m
                            for j in range(5):
                                if c0[j] is not None and c1[j] is not None:
                                    a[j + 1] += c1[j] - c0[j]
                        samples[cond].append((r, xs))
                        prog.step("routing", f"round {r + 1}/{rounds} {live_of[cond]} live")
            finally:
                _pin_thread(self.all_cpus)
                _pin_process(pid, self.all_cpus)
            measured = next((s for s in sup.stats(tenant="t0") if s["library"] == "bench_route_0"), {})
            if measured.get("pid") != pid or measured.get("restarts"):
                raise RuntimeError(f"the measured worker was replaced during the run ({measured})")
        finally:
            sup.close()

        labels = {"one": "1 live worker in the pool",
                  "many": f"{len(pairs)} live workers ({n_tenants} tenants x {nlib} libraries"
                          + (")" if len(pairs) == 200 else "; the full run uses 200)")}
        rows: dict = {}
        per_round: dict = {}
        for cond, batches in samples.items():
            per_round[cond] = {r: sorted(max(0.0, x - overhead) for x in xs) for r, xs in batches}
            xs = [max(0.0, x - overhead) for _, batch in batches for x in batch]
            row = summarize(xs, 1000.0)
            row.update(label=labels[cond], live_workers=live_of[cond], unit="us",
                       live_workers_seen=sorted(seen[cond]),
                       samples_us=[round(x / 1000.0, 3) for x in xs],
                       round_of_sample=[r for r, batch in batches for _ in batch])
            a = acc[cond]
            if a[0]:
                per = [v / a[0] / 1000.0 for v in a[1:]]
                row["cpu_us_per_call"] = {"host_thread": per[0], "host_other_threads": per[2], "worker": per[3]}
                row["runq_wait_us_per_call"] = {"host_thread": per[1], "worker": per[4]}
            rows[cond] = row
        one, many = rows["one"], rows["many"]
        ratio: dict = {}
        for q in (50, 90, 99):
            ratio[f"p{q}"] = _ratio(many.get(f"p{q}"), one.get(f"p{q}"))
            paired = sorted(percentile(xs, q) / percentile(per_round["one"][r], q)
                            for r, xs in per_round["many"].items()
                            if r in per_round["one"] and percentile(per_round["one"][r], q) > 0)
            ratio[f"p{q}_paired"] = percentile(paired, 50) if paired else None
        for cond, row in rows.items():
            for q in (50, 90, 99):
                row[f"x_one_p{q}"] = _ratio(row.get(f"p{q}"), one.get(f"p{q}"))
        self.result["routing"] = {
            "workers": len(pairs), "tenants": n_tenants, "libraries": nlib, "rounds": rounds,
            "window_s": window, "sub_batch": ROUTING_SUB_BATCH, "settle_s": ROUTING_SETTLE_S,
            "placement": self.headline, "host_cpus": sorted(host) if host else None,
            "worker_cpus": sorted(worker) if worker else None,
            "measured": {"tenant": "t0", "library": "bench_route_0", "tool": tool0, "pid": pid,
                         "calls": measured.get("calls"), "restarts": measured.get("restarts")},
            "rows": rows, "ratio": ratio,
            "transitions_s": {k: _secs(v) for k, v in transitions.items() if v},
        }
        prog.step("routing", "closed")

    # ------------------------------------------------------------ cold
    def cold_paths(self) -> list:
        cfg = self.cfg
        paths: list = [
            SandboxCold("sandbox", "sandbox (zygote fork) tool_stamp", self.sup, [str(self.libs)],
                        self.ws, "tool_stamp", {}),
            SandboxCold("sandbox_heavy", "sandbox (zygote fork) heavy import", self.sup,
                        [str(self.libs)], self.ws, "tool_heavy_stamp", {}),
        ]
        if "spawn" in cfg.skip:
            self.skipped["cold:spawn"] = "skipped by request"
        else:
            paths.append(SpawnCold("spawn", self.noop_path, "tool_stamp", {}))
        if "subprocess" not in cfg.skip:
            paths.append(SubprocessCold("subprocess", self.noop_path, "tool_stamp", {}))
        if "ppe" not in cfg.skip:
            paths.append(PPECold("ppe", self.noop_path, "tool_stamp", {}))
        if self.lcp_cls is not None:
            lcp = self.lcp_cls(tools_folders=[str(self.libs)])
            paths.append(InProcessCold("inprocess", lcp, "tool_stamp", {},
                                       "lollms_client.tools_bindings.lcp.persistent_bench_noop"))
        u = self.user
        if u:
            paths.append(SandboxCold(f"sandbox:{u['tool']}", f"sandbox (zygote fork) {u['tool']}", self.sup,
                                     [u["folder"]], self.ws, u["tool"], u["params"], cfg.binding_kwargs))
        return paths

    def cold(self, paths: list, prog: Progress) -> None:
        cfg = self.cfg
        reps = max(1, cfg.cold_reps)
        totals: dict = {p.key: [] for p in paths}
        phases: dict = {p.key: [] for p in paths}
        errors: dict = {}
        live = list(paths)
        for r in range(reps):
            order = list(live)
            self.rng.shuffle(order)
            for p in order:
                gc.collect()
                try:
                    t0, t1, out = p.once()
                except Exception as exc:                       # noqa: BLE001
                    errors[p.key] = f"{type(exc).__name__}: {exc}"
                    live.remove(p)
                    continue
                totals[p.key].append(t1 - t0)
                phases[p.key].append(_phases(t0, t1, out))
                prog.step("cold", f"round {r + 1}/{reps} {p.label}")
        for key, err in errors.items():
            self.skipped[f"cold:{key}"] = err
        self._cold_rows(paths, totals, phases)

    def _cold_rows(self, paths: list, totals: dict, phases: dict) -> None:
        out = self.result["cold"]
        for p in paths:
            xs = totals[p.key]
            if not xs:
                continue
            row = summarize(xs, 1e-3)                 # milliseconds
            row.update(label=p.label, unit="ms", samples_ms=[round(x * 1e3, 4) for x in xs])
            phs = phases[p.key]
            if phs and all(phs):
                split = {k: [ph[k] for ph in phs] for k in ("start", "import_init", "call")}
                row["phases"] = {k: summarize(v, 1e-3) for k, v in split.items()}
                row["phases_samples_ms"] = {k: [round(x * 1e3, 4) for x in v] for k, v in split.items()}
            out[p.key] = row

    def zygote(self, prog: Progress) -> None:
        """Fresh supervisors: zygote start alone, and a new host's very first call."""
        from .binding import SandboxedBinding
        from .supervisor import Supervisor
        starts, firsts = [self.zygote_first_s], []
        for i in range(max(0, self.cfg.zygote_reps)):
            gc.collect()
            sup = Supervisor()
            b = SandboxedBinding(tools_folders=[str(self.libs)], workspace=self.ws, supervisor=sup)
            try:
                t0 = time.perf_counter()
                sup.start()
                t1 = time.perf_counter()
                b.execute_tool("tool_stamp", {})
                t2 = time.perf_counter()
            finally:
                sup.close()
            starts.append(t1 - t0)
            firsts.append(t2 - t0)
            prog.step("cold", f"fresh supervisor {i + 1}/{self.cfg.zygote_reps}")
        out = self.result["cold"]
        for key, label, xs in (("zygote_start", "zygote start (once per host)", starts),
                               ("new_host", "new host: zygote start + first call", firsts)):
            if xs:
                row = summarize(xs, 1e-3)
                row.update(label=label, unit="ms", samples_ms=[round(x * 1e3, 4) for x in xs])
                out[key] = row

    def cold_ratios(self) -> None:
        out = self.result["cold"]
        spawn = out.get("spawn", {}).get("p50")
        floor = self.result["warm"].get(self.headline, {}).get("floor", {}).get("p50")
        for row in out.values():
            row["x_spawn_p50"] = _ratio(row.get("p50"), spawn)
            row["x_floor_p50"] = _ratio(row.get("p50") and row["p50"] * 1000.0, floor)

    # ------------------------------------------------------------ throughput
    def throughput(self, prog: Progress) -> None:
        from .binding import SandboxedBinding
        cfg = self.cfg
        _pin_thread(self.all_cpus)
        bindings = []

        def sandbox_calls(k: int, tool: str, params: dict, folder: str, tag: str) -> tuple:
            fns = []
            for i in range(k):
                b = SandboxedBinding(tools_folders=[folder], workspace=self.ws, supervisor=self.sup,
                                     tenant=f"bench-tp-{tag}-{i}",
                                     **(cfg.binding_kwargs if tag == "user" else {}))
                bindings.append(b)
                self.cleanup.append(b.close)
                r = b.execute_tool(tool, dict(params))
                if r.get("status_code") != 200:
                    raise RuntimeError(f"{tool} failed: {r.get('error')}")
                fns.append(lambda b=b: b.execute_tool(tool, params))
            return fns, bindings[-k:]

        cpu = {"ms": cfg.cpu_ms}
        libs = str(self.libs)
        configs = []          # (path, tool, K, T, fns, bindings serving them)

        def add_sandbox(tool: str, params: dict, folder: str, tag: str, shapes: tuple) -> None:
            pools = {k: sandbox_calls(k, tool, params, folder, f"{tag}{k}") for k in {k for k, _ in shapes}}
            for k, t in shapes:
                fns, bs = pools[k]
                configs.append(("sandbox", tool, k, t, [fns[i % k] for i in range(t)], bs))

        add_sandbox("tool_cpu", cpu, libs, "cpu", ((1, 1), (1, 2), (2, 2)))
        add_sandbox("tool_noop", {}, libs, "noop", ((1, 1), (2, 2)))
        if self.lcp_cls is not None:
            lcp = self.lcp_cls(tools_folders=[libs])
            lcp.execute_tool("tool_cpu", dict(cpu))
            for t in (1, 2):
                configs.append(("inprocess", "tool_cpu", 1, t,
                                [lambda: lcp.execute_tool("tool_cpu", dict(cpu))] * t, []))
        u = self.user
        if u:
            add_sandbox(u["tool"], u["params"], u["folder"], "user", ((1, 1), (2, 2)))

        runs: dict = {i: [] for i in range(len(configs))}
        for r in range(max(1, cfg.throughput_rounds)):
            order = list(range(len(configs)))
            self.rng.shuffle(order)
            for i in order:
                path, tool, k, t, fns, bs = configs[i]
                pids = [st["pid"] for b in bs for st in b.stats() if st["pid"]]
                gc.collect()
                runs[i].append(_drive(fns, cfg.duration_s, pids))
                prog.step("throughput", f"round {r + 1} {path} {tool} K={k} T={t}")
        rows = []
        for i, (path, tool, k, t, _, _) in enumerate(configs):
            cps = sorted(x["calls_per_s"] for x in runs[i])
            calls = sum(x["calls"] for x in runs[i]) or 1
            rows.append({"path": path, "tool": tool, "libraries": k, "threads": t,
                         "calls_per_s": percentile(cps, 50), "rounds": runs[i],
                         "runq_wait_us_per_call": {
                             "host_threads": sum(x["host_wait_ns"] for x in runs[i]) / calls / 1000.0,
                             "workers": (sum(x["workers_wait_ns"] for x in runs[i]) / calls / 1000.0
                                         if path == "sandbox" else None)}})
        for row in rows:
            base = next((x for x in rows if x["path"] == row["path"] and x["tool"] == row["tool"]
                         and x["libraries"] == 1 and x["threads"] == 1), None)
            row["x_one"] = _ratio(row["calls_per_s"], base and base["calls_per_s"])
        self.result["throughput"] = rows
        for b in bindings:
            b.close()

    # ------------------------------------------------------------ memory
    def memory(self, prog: Progress, ppe: Optional[PPEPath]) -> None:
        from .binding import SandboxedBinding
        cfg = self.cfg
        rows = self.result["memory"]
        b = SandboxedBinding(tools_folders=[str(self.libs)], workspace=self.ws, supervisor=self.sup,
                             tenant="bench-mem")
        self.cleanup.append(b.close)

        def pid_of(binding: Any, library: str) -> Optional[int]:
            return next((s["pid"] for s in binding.stats() if s["library"] == library), None)

        b.execute_tool("tool_noop", {})
        pid = pid_of(b, "bench_noop")
        rows.append(_mem_row("sandbox worker bench_noop (small library)", pid, 1, "small_first"))
        call = b.execute_tool
        done = 1
        chunk = max(1, cfg.mem_calls // 20)
        while done < cfg.mem_calls:
            n = min(chunk, cfg.mem_calls - done)
            for _ in range(n):
                call("tool_noop", {})
            done += n
            prog.step("memory", f"{done}/{cfg.mem_calls} calls", 0)
        rows.append(_mem_row("sandbox worker bench_noop (small library)", pid, done, "small_after"))
        b.execute_tool("tool_heavy_stamp", {})
        rows.append(_mem_row("sandbox worker bench_heavy", pid_of(b, "bench_heavy"), 1, "heavy"))
        zyg = getattr(self.sup, "_zygote", None)
        rows.append(_mem_row("zygote (shared by all workers)", getattr(zyg, "pid", None), None, "zygote"))
        if self.user:
            u = self.user
            rows.append(_mem_row(f"sandbox worker {u['library']} ({u['tool']})",
                                 pid_of(u["binding"], u["library"]), None, "user"))
        if ppe is not None:
            for pid in ppe.pids():
                rows.append(_mem_row("ProcessPoolExecutor worker (forked from the host)", pid, None, "ppe"))
        rows.append(_mem_row("this host process (for scale)", os.getpid(), None, "host"))
        prog.step("memory", "done")

    # ------------------------------------------------------------ discovery
    def discovery(self, prog: Progress) -> None:
        from .binding import SandboxedBinding
        cfg = self.cfg
        n = cfg.discovery_files
        folder = self.tmp / "discovery"
        folder.mkdir()
        for i in range(n):
            (folder / f"gen_lib_{i:04d}.py").write_text(_GENERATED.format(i=i))
        out = self.result["discovery"] = {"files": n, "tools": 0}
        first, again = [], []
        b = None
        for _ in range(max(1, cfg.discovery_reps)):
            gc.collect()
            t0 = time.perf_counter()
            b = SandboxedBinding(tools_folders=[str(folder)], workspace=self.ws, supervisor=self.sup,
                                 tenant="bench-discovery")
            first.append(time.perf_counter() - t0)
            for _ in range(3):
                t0 = time.perf_counter()
                b.discover_tools(force_refresh=True)
                again.append(time.perf_counter() - t0)
            prog.step("discovery", f"{n} files")
        out["tools"] = len(b.discovered_tools) if b else 0
        out["sandbox"] = {"first": _secs(first), "again": _secs(again)}
        if self.lcp_cls is not None:
            lf, la = [], []
            for _ in range(max(1, cfg.discovery_reps)):
                gc.collect()
                t0 = time.perf_counter()
                lcp = self.lcp_cls(tools_folders=[str(folder)])
                lf.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                lcp.discover_tools(force_refresh=True)
                la.append(time.perf_counter() - t0)
                prog.step("discovery", "LCPBinding")
            out["inprocess"] = {"first": _secs(lf), "again": _secs(la)}
        if self.user:
            uf = []
            for _ in range(max(1, cfg.discovery_reps)):
                t0 = time.perf_counter()
                SandboxedBinding(tools_folders=[self.user["folder"]], supervisor=self.sup, tenant="bench-discovery")
                uf.append(time.perf_counter() - t0)
            out["user_folder"] = {"folder": self.user["folder"], "first": _secs(uf)}

    # ------------------------------------------------------------ targets
    def targets(self) -> None:
        T = TARGETS
        res = self.result
        tg = res["targets"]
        pl = self.headline
        warm = res["warm"].get(pl, {})
        sb, fl = warm.get("sandbox", {}), warm.get("floor", {})

        def add(name: str, what: str, value: Optional[float], limit: float, op: str, unit: str = "x",
                note: str = "") -> None:
            met = None if value is None else (value <= limit if op == "<=" else
                                              value < limit if op == "<" else value >= limit)
            tg.append({"name": name, "what": what, "value": value, "limit": limit, "op": op,
                       "unit": unit, "met": met, "note": note})

        def paired(q: int) -> str:
            v = sb.get(f"x_floor_p{q}_paired")
            return "" if v is None else f"paired by round: {_x(v)}"
        add("warm_p50", f"warm call p50 / floor p50 ({pl})", _ratio(sb.get("p50"), fl.get("p50")), T["warm_p50"], "<=",
            note=paired(50))
        add("warm_p99", f"warm call p99 / floor p99 ({pl})", _ratio(sb.get("p99"), fl.get("p99")), T["warm_p99"], "<=",
            note=paired(99))
        cold = res["cold"]
        add("cold_vs_spawn", "cold first call p50 / spawn p50",
            _ratio(cold.get("sandbox", {}).get("p50"), cold.get("spawn", {}).get("p50")), T["cold_vs_spawn"], "<=")
        tp = res["throughput"]

        def cps(k: int, t: int) -> Optional[float]:
            return next((r["calls_per_s"] for r in tp if r["path"] == "sandbox" and r["tool"] == "tool_cpu"
                         and r["libraries"] == k and r["threads"] == t), None)
        add("parallel", f"2 libraries x 2 threads / 1 x 1 (tool_cpu {self.cfg.cpu_ms:g} ms)",
            _ratio(cps(2, 2), cps(1, 1)), T["parallel"], ">=")
        mem = {r["key"]: r for r in res["memory"]}
        first = mem.get("small_first", {}).get("uss_mb")
        after = mem.get("small_after", {})
        add("uss_first", "worker USS, small library, after its first call", first, T["uss_mb"], "<=", "MB")
        add("uss_after", f"worker USS, small library, after {after.get('calls', 0):,} calls",
            after.get("uss_mb"), T["uss_mb"], "<=", "MB",
            "" if after.get("calls", 0) >= 25000 else "target is after 25,000 calls")
        d = res["discovery"].get("sandbox")
        nfiles = res["discovery"].get("files", 0)
        note = "" if nfiles == 1000 else "target is for 1,000 files"
        add("discovery_first", f"discovery of {nfiles:,} tool files, first time (p50)",
            d and d["first"]["p50"], T["discovery_first_s"], "<", "s", note)
        add("discovery_again", f"re-discovery of {nfiles:,} unchanged files (p50)",
            d and d["again"]["p50"], T["discovery_again_s"], "<", "s", note)

    # ------------------------------------------------------------ driver
    def run(self) -> dict:
        cfg = self.cfg
        t_start = time.monotonic()
        stat0 = _cpu_busy_jiffies()
        self.setup()
        try:
            wpaths = self.warm_paths()
            nsteps = max(1, cfg.rounds) * len(self.placements) * len(wpaths)
            cpaths = self.cold_paths()
            nsteps += max(1, cfg.cold_reps) * len(cpaths) + max(0, cfg.zygote_reps)
            ntp = 7 + (2 if self.lcp_cls else 0) + (2 if self.user else 0)
            if "routing" not in cfg.skip:
                nsteps += 2 * max(1, cfg.routing_rounds) + 2
            if "throughput" not in cfg.skip:
                nsteps += ntp * max(1, cfg.throughput_rounds)
            if "memory" not in cfg.skip:
                nsteps += 1
            if "discovery" not in cfg.skip:
                nsteps += max(1, cfg.discovery_reps) * (2 if self.lcp_cls else 1)
            prog = Progress(nsteps, self.show_progress)
            try:
                self.warm(wpaths, prog)
                ppe = next((p for p in wpaths if p.key == "ppe"), None)
                for p in wpaths:
                    if p is not ppe:
                        p.close()
                if "routing" in cfg.skip:
                    self.skipped["routing"] = "skipped by request"
                else:
                    try:
                        self.routing(prog)
                    except Exception as exc:                   # noqa: BLE001
                        self.result["routing"] = {}
                        self.skipped["routing"] = f"{type(exc).__name__}: {exc}"
                self.cold(cpaths, prog)
                self.zygote(prog)
                self.cold_ratios()
                if "throughput" in cfg.skip:
                    self.skipped["throughput"] = "skipped by request"
                else:
                    self.throughput(prog)
                if "memory" in cfg.skip:
                    self.skipped["memory"] = "skipped by request"
                else:
                    self.memory(prog, ppe)
                if "discovery" in cfg.skip:
                    self.skipped["discovery"] = "skipped by request"
                else:
                    self.discovery(prog)
            finally:
                prog.close()
            self.targets()
        finally:
            _pin_thread(self.all_cpus if hasattr(self, "all_cpus") else None)
            for fn in reversed(self.cleanup):
                try:
                    fn()
                except Exception:                              # noqa: BLE001
                    pass
        self.result["meta"]["duration_s"] = time.monotonic() - t_start
        stat1 = _cpu_busy_jiffies()
        if stat0 and stat1 and stat1[2] > stat0[2]:
            span = stat1[2] - stat0[2]
            self.result["meta"]["machine"] = {
                "busy_fraction": (stat1[0] - stat0[0]) / span,        # this run included
                "steal_fraction": (stat1[1] - stat0[1]) / span,
                "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None}
        return self.result


def _share(total: int, rounds: int, r: int) -> int:
    """Round r's part of ``total`` calls spread evenly over ``rounds``."""
    return (r + 1) * total // rounds - r * total // rounds


def _cpu_busy_jiffies() -> Optional[tuple]:
    """(busy, steal, total) jiffies of the whole machine from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    steal = v[7] if len(v) > 7 else 0
    total = sum(v[:8])
    return total - idle - steal, steal, total


def _stop_resource_tracker_if_new() -> Callable[[], None]:
    """The spawn baseline starts multiprocessing's resource tracker; stop it at the end
    if it was not running before (the host would otherwise keep a stray child)."""
    try:
        from multiprocessing import resource_tracker
        tracker = resource_tracker._resource_tracker
        was_running = tracker._fd is not None
    except Exception:                                          # noqa: BLE001
        return lambda: None

    def stop() -> None:
        if was_running or tracker._fd is None:
            return
        with tracker._lock:
            fd, pid = tracker._fd, tracker._pid
            tracker._fd = tracker._pid = None
            os.close(fd)                  # its "alive" pipe: the tracker exits on EOF
            deadline = time.monotonic() + 2.0
            while pid and time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.01)
    return stop


def _drive(fns: list, duration: float, pids: Optional[list] = None) -> dict:
    """Run each fn in its own thread in a loop for ``duration`` s: calls per second, and the
    run-queue wait (ns) of the driving threads and of ``pids`` meanwhile."""
    n = len(fns)
    stop = [False]
    counts = [0] * n
    ends = [0.0] * n
    waits = [0] * n
    errors: list = []
    barrier = threading.Barrier(n + 1)
    me = os.getpid()

    def loop(i: int) -> None:
        fn = fns[i]
        c = 0
        tid = threading.get_native_id()
        barrier.wait()
        w0 = _sched(me, tid=tid)
        try:
            while not stop[0]:
                fn()
                c += 1
        except Exception as exc:                               # noqa: BLE001
            errors.append(exc)
        w1 = _sched(me, tid=tid)
        counts[i] = c
        ends[i] = time.perf_counter()
        waits[i] = w1[1] - w0[1] if w0 and w1 else 0

    def workers_wait() -> int:
        return sum((_sched(p) or (0, 0))[1] for p in pids or ())

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    ww0 = workers_wait()
    barrier.wait()
    t0 = time.perf_counter()
    time.sleep(duration)
    stop[0] = True
    for t in threads:
        t.join()
    ww1 = workers_wait()
    if errors:
        raise errors[0]
    elapsed = max(ends) - t0
    return {"calls": sum(counts), "seconds": elapsed, "calls_per_s": sum(counts) / elapsed if elapsed else 0.0,
            "host_wait_ns": sum(waits), "workers_wait_ns": ww1 - ww0}


def _mem_row(what: str, pid: Optional[int], calls: Optional[int], key: str) -> dict:
    row: dict = {"what": what, "key": key, "pid": pid, "calls": calls}
    if not pid:
        row["error"] = "no live process"
        return row
    try:
        import psutil
        info = psutil.Process(pid).memory_full_info()
        row.update(uss_mb=info.uss / 1048576, pss_mb=getattr(info, "pss", 0) / 1048576,
                   rss_mb=info.rss / 1048576)
    except Exception as exc:                                   # noqa: BLE001
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def _secs(xs: list) -> dict:
    row = summarize(xs, 1.0)
    row["samples_s"] = [round(x, 6) for x in xs]
    return row


def _message_sizes(result: dict, tool: str, params: dict, cwd: str) -> tuple:
    """Bytes on the wire of one small call and its result (4-byte header + pickle)."""
    req = len(pickle.dumps((2, tool, 0, dict(params), cwd, None, 0), protocol=5)) + 4
    reply = len(pickle.dumps((10, result, None), protocol=5)) + 4
    return req, reply


def _engine_source() -> dict:
    """Where the measured lcp_sandbox comes from, and its git commit when it is a checkout."""
    pkg = Path(__file__).resolve().parent
    out: dict = {"path": str(pkg)}
    try:
        git = ["git", "-C", str(pkg.parent)]
        out["commit"] = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True, timeout=10).stdout.strip() or None
        if out["commit"]:
            status = subprocess.run(git + ["status", "--porcelain", "--", "lcp_sandbox"], capture_output=True,
                                    text=True, timeout=10).stdout
            out["uncommitted_changes"] = bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def _version(dist: str) -> Optional[str]:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:                                          # noqa: BLE001
        return None


def _jsonable(v: Any) -> Any:
    return json.loads(json.dumps(v, default=str))


_ROUTING_LIB = '''"""Generated tool library {j} for the routing benchmark: one tool that does nothing."""


def tool_route{j}_noop() -> dict:
    """Does nothing and returns a tiny result.

    Returns:
        dict: {{"ok": True}}
    """
    return {{"ok": True}}
'''


_GENERATED = '''"""Generated tool library {i} for the discovery benchmark."""
import os

TOOL_LIBRARY_NAME = "Generated {i}"


def tool_gen{i}_search(query: str, max_results: int = 10, exact: bool = False) -> dict:
    """Searches the records of library {i}.

    Args:
        query (str): What to look for.
        max_results (int): At most this many matches.
        exact (bool): Only exact matches.

    Returns:
        dict: the matches.
    """
    return {{"query": query, "max_results": max_results, "exact": exact}}


def tool_gen{i}_describe(item_id: int, fields: list = None, verbose: bool = False) -> dict:
    """Describes one record of library {i}.

    Args:
        item_id (int): The record.
        fields (list): Which fields to show.
        verbose (bool): Add details.

    Returns:
        dict: the record.
    """
    return {{"id": item_id, "fields": fields or [], "cwd": os.getcwd()}}


def _helper(x):
    return x
'''


# ---------------------------------------------------------------- public entry points


def run_bench(folder: Optional[str] = None, tool: Optional[str] = None, params: Optional[dict] = None, *,
              calls: Optional[int] = None, quick: bool = False, json_path: Optional[str] = None,
              plot_path: Optional[str] = None, progress: bool = False, out: Any = None,
              **overrides: Any) -> dict:
    """Run the whole benchmark and return every number as a dict.

    ``folder``/``tool``/``params`` add rows for a host's own tool next to the bundled
    ``bench_noop`` library (the targets are always judged on ``bench_noop``).
    ``overrides`` are :class:`BenchConfig` fields (``rounds=``, ``cold_reps=``...).
    ``out``: a stream to print the table to (None: no table).  ``json_path`` /
    ``plot_path``: where to write the JSON / PNG (the PNG needs matplotlib)."""
    kw = dict(overrides)
    kw.update(folder=folder, tool=tool, params=dict(params or {}))
    if calls is not None:
        kw["calls"] = calls
    if kw.get("cpus") is not None:
        kw["cpus"] = tuple(kw["cpus"])
    kw["skip"] = tuple(kw.get("skip") or ())
    unknown = set(kw) - {f.name for f in fields(BenchConfig)}
    if unknown:
        raise TypeError(f"unknown benchmark option(s): {', '.join(sorted(unknown))}")
    cfg = BenchConfig.quick(**kw) if quick else BenchConfig(**kw)
    result = _Run(cfg, progress).run()
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        result["meta"]["json_path"] = str(json_path)
    if plot_path:
        try:
            write_plot(result, plot_path)
            result["meta"]["plot_path"] = str(plot_path)
        except ImportError as exc:
            result["skipped"]["plot"] = f"matplotlib is not installed ({exc}); pip install 'lcp-sandbox[plot]'"
    if out is not None:
        out.write(render_table(result))
        out.flush()
    return result


def _f(v: Any, digits: int = 3) -> str:
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


def _x(v: Optional[float]) -> str:
    return "-" if v is None else (f"{v:,.0f}x" if v >= 100 else f"{v:.2f}x")


def _table(headers: list, rows: list, align: str) -> list:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]

    def line(cells: list) -> str:
        out = []
        for i, c in enumerate(cells):
            out.append(str(c).ljust(widths[i]) if align[i] == "l" else str(c).rjust(widths[i]))
        return "  ".join(out).rstrip()
    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]


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
               "cpu: host", "+threads", "worker", "runq"]
        for name in other:
            hdr += [f"{name} p50", f"{name} p99", f"{name} x floor"]
        rows = []
        for key, r in head.items():
            c = r.get("cpu_us_per_call") or {}
            row = [r["label"], r["n"], _f(r.get("p50")), _f(r.get("p90")), _f(r.get("p99")),
                   _f(r.get("max")), _x(r.get("x_floor_p50")), _x(r.get("x_floor_p99")),
                   _x(r.get("x_floor_p50_paired")), _x(r.get("x_floor_p99_paired")),
                   _f(c.get("host_thread")), _f(c.get("host_other_threads")), _f(c.get("worker")),
                   _f(sum(v for v in (r.get("runq_wait_us_per_call") or {}).values() if v) or None)]
            for name, rs in other.items():
                o = rs.get(key, {})
                row += [_f(o.get("p50")), _f(o.get("p99")), _x(o.get("x_floor_p50"))]
            rows.append(row)
        lines += _table(hdr, rows, "lr" + "r" * (len(hdr) - 2))
        lines.append("  paired: median over rounds of the per-round ratio to the floor (robust to bursts of "
                     "outside load)")
        lines.append("  cpu: CPU time per call (us) of the calling thread, the host's other threads and the "
                     "serving process; runq: run-queue wait per call of the calling thread + the serving process "
                     "(/proc schedstat)")
        lines.append("")

    rt = result.get("routing") or {}
    if rt.get("rows"):
        where = (f"host thread on CPU {','.join(map(str, rt.get('host_cpus') or []))}, worker on CPU "
                 f"{','.join(map(str, rt.get('worker_cpus') or []))}" if rt.get("placement") == "split"
                 else "unpinned (could not split CPUs)")
        lines.append(f"ROUTING  a warm call to one worker (tenant t0, bench_route_0) of a Supervisor shared by "
                     f"{rt['tenants']} tenants x {rt['libraries']} small libraries, with 1 vs {rt['workers']} "
                     f"live workers; microseconds; {where}; {rt['rounds']} rounds, conditions alternating, "
                     f"each batch in runs of {rt.get('sub_batch')} calls at random moments of "
                     f"{_f(rt.get('window_s'))} s")
        hdr = ["pool", "n", "p50", "p90", "p99", "max", "x 1 live p50", "p90", "p99", "cpu: host", "+threads",
               "worker", "runq"]
        rows = []
        for r in rt["rows"].values():
            c = r.get("cpu_us_per_call") or {}
            rows.append([r["label"], r["n"], _f(r.get("p50")), _f(r.get("p90")), _f(r.get("p99")),
                         _f(r.get("max")), _x(r.get("x_one_p50")), _x(r.get("x_one_p90")), _x(r.get("x_one_p99")),
                         _f(c.get("host_thread")), _f(c.get("host_other_threads")), _f(c.get("worker")),
                         _f(sum(v for v in (r.get("runq_wait_us_per_call") or {}).values() if v) or None)])
        lines += _table(hdr, rows, "lr" + "r" * (len(hdr) - 2))
        ra = rt.get("ratio", {})
        lines.append(f"  {rt['workers']} live vs 1 live: p50 {_x(ra.get('p50'))}, p90 {_x(ra.get('p90'))}, "
                     f"p99 {_x(ra.get('p99'))}; paired by round: p50 {_x(ra.get('p50_paired'))}, "
                     f"p90 {_x(ra.get('p90_paired'))}, p99 {_x(ra.get('p99_paired'))}")
        tr = rt.get("transitions_s", {})
        st, sp = tr.get("start_others", {}), tr.get("stop_others", {})
        lines.append(f"  between batches, never timed: the other {rt['workers'] - 1} workers started (one call "
                     f"each, p50 {_f(st.get('p50'))} s) or stopped (p50 {_f(sp.get('p50'))} s); "
                     f"+threads: CPU of the host's other threads per call (the supervisors' watchdogs...)")
        lines.append("")

    cold = result.get("cold", {})
    if cold:
        lines.append(f"COLD  from nothing to the first result, milliseconds; {cfg.get('cold_reps')} fresh "
                     f"starts each, interleaved; phases are p50s from stamps taken in the tool's process")
        hdr = ["path", "n", "p50", "p90", "max", "x spawn", "x floor", "start", "import+init", "call"]
        rows = []
        for key, r in cold.items():
            ph = r.get("phases", {})
            rows.append([r["label"], r["n"], _f(r.get("p50")), _f(r.get("p90")), _f(r.get("max")),
                         _x(r.get("x_spawn_p50")), _x(r.get("x_floor_p50")),
                         _f(ph.get("start", {}).get("p50")), _f(ph.get("import_init", {}).get("p50")),
                         _f(ph.get("call", {}).get("p50"))])
        lines += _table(hdr, rows, "lr" + "r" * (len(hdr) - 2))
        lines.append("  start: until the library's first line runs (process start, loader); "
                     "import+init: module body and init_tools_library; call: the tool and the way back")
        lines.append("")

    tp = result.get("throughput", [])
    if tp:
        lines.append(f"THROUGHPUT  calls per second, K libraries (one worker each) driven by T host threads; "
                     f"median of {cfg.get('throughput_rounds')} rounds of {cfg.get('duration_s')} s; unpinned")
        hdr = ["path", "tool", "K", "T", "calls/s", "x (K=1, T=1)", "runq: host", "workers"]
        rows = [[r["path"], r["tool"] + (f" {cfg.get('cpu_ms'):g} ms" if r["tool"] == "tool_cpu" else ""),
                 r["libraries"], r["threads"], _f(r["calls_per_s"]), _x(r.get("x_one")),
                 _f(r.get("runq_wait_us_per_call", {}).get("host_threads")),
                 _f(r.get("runq_wait_us_per_call", {}).get("workers"))] for r in tp]
        lines += _table(hdr, rows, "llrrrrrr")
        lines.append("  runq: run-queue wait per call (us) of the driving threads and of the workers")
        lines.append("")

    mem = result.get("memory", [])
    if mem:
        lines.append("MEMORY  per process, MB (USS: private to it; PSS: its share of shared pages)")
        hdr = ["process", "calls", "USS", "PSS", "RSS"]
        rows = [[r["what"], "-" if r.get("calls") is None else f"{r['calls']:,}", _f(r.get("uss_mb")),
                 _f(r.get("pss_mb")), _f(r.get("rss_mb"))] for r in mem]
        lines += _table(hdr, rows, "lrrrr")
        lines.append("")

    d = result.get("discovery", {})
    if d.get("sandbox"):
        lines.append(f"DISCOVERY  {d['files']:,} generated tool files ({d['tools']:,} tools), milliseconds")
        hdr = ["path", "first p50", "first max", "again p50", "again max"]
        rows = []
        for key, label in (("sandbox", "SandboxedBinding (AST, parse cache)"),
                           ("inprocess", "LCPBinding (AST, no cache)")):
            if key in d:
                rows.append([label, _f(d[key]["first"]["p50"] * 1e3), _f(d[key]["first"]["max"] * 1e3),
                             _f(d[key]["again"]["p50"] * 1e3), _f(d[key]["again"]["max"] * 1e3)])
        lines += _table(hdr, rows, "lrrrr")
        if "user_folder" in d:
            lines.append(f"  {d['user_folder']['folder']}: first discovery p50 "
                         f"{_f(d['user_folder']['first']['p50'] * 1e3)} ms")
        lines.append("")

    tg = result.get("targets", [])
    if tg:
        lines.append("TARGETS")
        rows = []
        for t in tg:
            unit = t["unit"]
            val = ("-" if t["value"] is None else _x(t["value"]) if unit == "x"
                   else f"{_f(t['value'])} {unit}")
            lim = f"{t['op']} {t['limit']:g}{'x' if unit == 'x' else ' ' + unit}"
            state = "n/a" if t["met"] is None else "met" if t["met"] else "MISSED"
            rows.append([t["what"], val, lim, state + (f" ({t['note']})" if t.get("note") else "")])
        lines += _table(["target", "measured", "limit", ""], rows, "lrrl")
        lines.append("")

    if result.get("skipped"):
        lines.append("skipped: " + "; ".join(f"{k}: {v}" for k, v in result["skipped"].items()))
        lines.append("")
    return "\n".join(lines)


def write_plot(result: dict, path: str) -> None:
    """PNG: warm and cold latency distributions (ECDFs on a log axis), one series per path."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    m = result.get("meta", {})
    pl = m.get("headline_placement", "split")
    warm = result.get("warm", {})
    cold = result.get("cold", {})
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 5.5))
    colors = {}

    def color(kind: str) -> Any:
        if kind not in colors:
            colors[kind] = f"C{len(colors)}"
        return colors[kind]

    def ecdf(ax: Any, xs: list, **kw: Any) -> None:
        s = sorted(x for x in xs if x > 0)
        if s:
            n = len(s)
            ax.step(s, [(i + 1) / n for i in range(n)], where="post", **kw)

    for key, r in warm.get(pl, {}).items():
        kind = key.split(":")[0]
        ecdf(a1, r.get("samples_us", []), color=color(kind), lw=1.8 if kind != "floor" else 2.4,
             ls="-" if ":" not in key else "-.", label=f"{r['label']} (p50 {_f(r.get('p50'))} us)")
        for name, rows in warm.items():
            if name != pl and key in rows:
                ecdf(a1, rows[key].get("samples_us", []), color=color(kind), lw=0.9, ls=":", alpha=0.8)
    for cond, r in ((result.get("routing") or {}).get("rows") or {}).items():
        ecdf(a1, r.get("samples_us", []), color=color("routing"), lw=1.4, ls="-" if cond == "one" else "--",
             label=f"routing: {r['label']} (p50 {_f(r.get('p50'))} us)")
    a1.set_xscale("log")
    a1.set_ylim(0, 1.02)
    a1.set_xlabel("round trip, microseconds (log)")
    a1.set_ylabel("fraction of calls")
    where = (f"host CPU {m.get('host_cpu')}, worker CPU {m.get('worker_cpu')}" if pl == "split" else "unpinned")
    a1.set_title(f"warm: one small call ({where}; dotted: unpinned)")
    a1.grid(True, which="both", alpha=0.3)
    a1.legend(fontsize=7, loc="lower right")

    kinds = {"sandbox": "sandbox", "sandbox_heavy": "sandbox", "spawn": "spawn", "subprocess": "subprocess",
             "ppe": "ppe", "inprocess": "inprocess", "zygote_start": "zygote", "new_host": "zygote"}
    for key, r in cold.items():
        kind = kinds.get(key, key.split(":")[0])
        ls = ("--" if key in ("sandbox_heavy", "new_host") else ":" if key == "zygote_start"
              else "-." if ":" in key else "-")
        ecdf(a2, r.get("samples_ms", []), color=color(kind), lw=1.8, ls=ls,
             label=f"{r['label']} (p50 {_f(r.get('p50'))} ms)")
    a2.set_xscale("log")
    a2.set_ylim(0, 1.02)
    a2.set_xlabel("new process to first result, milliseconds (log)")
    a2.set_ylabel("fraction of starts")
    a2.set_title("cold: a never-run library")
    a2.grid(True, which="both", alpha=0.3)
    a2.legend(fontsize=7, loc="lower right")

    met = [t for t in result.get("targets", []) if t.get("met") is not None]
    fig.suptitle(f"lcp-sandbox bench, python {m.get('python')}, {m.get('cpu_count')} CPUs; targets met "
                 f"{sum(1 for t in met if t['met'])}/{len(met)}", fontsize=11)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", nargs="?", default=None,
                   help="a tools folder of your own: its --tool gets rows next to the bundled bench_noop")
    p.add_argument("--tool", default=None, help="tool of FOLDER to benchmark (default: the first without "
                                                "required parameters)")
    p.add_argument("--params", default="{}", help="JSON parameters for --tool")
    p.add_argument("--calls", type=int, default=None, help="warm calls per path and placement (default 10000)")
    p.add_argument("--quick", action="store_true", help="a smaller budget (about a third of the time)")
    p.add_argument("--json", dest="json_path", default=None, help="write every number (and sample) here")
    p.add_argument("--plot", dest="plot_path", default=None, help="write a PNG here (needs matplotlib: the "
                                                                  "'plot' extra)")
    p.add_argument("--rounds", type=int, default=None, help="warm rounds (paths interleaved in each)")
    p.add_argument("--cold", dest="cold_reps", type=int, default=None, help="fresh starts per cold path")
    p.add_argument("--duration", dest="duration_s", type=float, default=None,
                   help="throughput: seconds per measurement")
    p.add_argument("--mem-calls", dest="mem_calls", type=int, default=None,
                   help="memory: calls before the second reading (default 25000)")
    p.add_argument("--discovery-files", dest="discovery_files", type=int, default=None)
    p.add_argument("--subprocess-calls", dest="subprocess_calls", type=int, default=None)
    p.add_argument("--routing-workers", dest="routing_workers", type=int, default=None,
                   help="routing: live workers in the large pool (default 200, --quick 40; 4 per tenant)")
    p.add_argument("--cpus", default=None, help="HOST,WORKER CPUs for the pinned figures (default: the first two)")
    p.add_argument("--skip", default="", help=f"comma-separated: {','.join(SKIPPABLE)}")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--check", action="store_true", help="exit with status 1 when a target is missed")


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        params = json.loads(args.params)
    except json.JSONDecodeError as exc:
        print(f"--params is not valid JSON: {exc}", file=sys.stderr)
        return 2
    skip = tuple(s.strip() for s in args.skip.split(",") if s.strip())
    bad = [s for s in skip if s not in SKIPPABLE]
    if bad:
        print(f"--skip: unknown {', '.join(bad)} (known: {', '.join(SKIPPABLE)})", file=sys.stderr)
        return 2
    over = {k: getattr(args, k) for k in ("rounds", "cold_reps", "duration_s", "mem_calls",
                                          "discovery_files", "subprocess_calls", "routing_workers", "seed")
            if getattr(args, k) is not None}
    if args.cpus:
        try:
            host, worker = (int(x) for x in args.cpus.split(","))
        except ValueError:
            print("--cpus takes two CPU numbers: HOST,WORKER", file=sys.stderr)
            return 2
        over["cpus"] = (host, worker)
    result = run_bench(args.folder, args.tool, params, calls=args.calls, quick=args.quick,
                       json_path=args.json_path, plot_path=args.plot_path,
                       progress=not args.no_progress, out=sys.stdout, skip=skip, **over)
    for what in ("json_path", "plot_path"):
        if result["meta"].get(what):
            print(f"wrote {result['meta'][what]}")
    if args.check and any(t["met"] is False for t in result["targets"]):
        return 1
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on the ``lcp-sandbox`` command line."""
    p = subparsers.add_parser("bench", help="cold / warm / throughput / memory / discovery figures, with "
                                            "baselines and the targets' ratios")
    add_arguments(p)
    p.set_defaults(fn=cmd_bench)
    return p


def main(argv: Optional[list] = None) -> int:
    """``python -m lcp_sandbox.bench`` / ``python -m benchmarks.run``."""
    import logging
    parser = argparse.ArgumentParser(prog="lcp-sandbox bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    return cmd_bench(args)


if __name__ == "__main__":
    sys.exit(main())
