"""WARM: one small call on a live process, every path in the same rounds.

    rounds × placements (split CPUs / unpinned) × paths in a fresh random order:
    floor (raw socketpair ping-pong), bare pickle RPC (no engine), sandbox,
    in-process LCPBinding, ProcessPoolExecutor, python -c per call
"""
from __future__ import annotations

import json
import os
import pickle
import socket
import struct
import subprocess
import sys
from typing import Any, Callable, Optional

from .harness import CpuAccount, latency_rows, now_ns, pin_process, pin_thread, pin_tid, share, timed_calls
from .loader import child_code, load_tool_file
from .spin_stats import add_spin, spin_summary

# ---------------------------------------------------------------- code run in other processes

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

# A bare RPC: the floor's child plus what any Python engine must do per call, a 4-byte
# length header + a protocol-5 pickle each way.  Framed here, not by the engine.
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
    body = dumps(RESULT, protocol=5)
    write(fd, hdr.pack(len(body)) + body)
'''

CALL = (2, "tool_noop", 0, {"x": 1}, "/tmp", None, 0)        # the pickle RPC's request ...
RESULT = (10, {"output": 1, "status_code": 200, "success": True}, None)      # ... and reply

SUBPROCESS_BODY = '''
import json, sys
_m = load_tool_file(sys.argv[1], "lcp_bench_tool")
print(json.dumps(getattr(_m, sys.argv[2])(**json.loads(sys.argv[3])), default=str))
'''

_ppe_modules: dict = {}


def ppe_call(path: str, tool: str, params: dict) -> Any:
    """Runs in a ProcessPoolExecutor worker: load the file once, call the tool."""
    mod = _ppe_modules.get(path)
    if mod is None:
        mod = _ppe_modules[path] = load_tool_file(path, "lcp_bench_ppe_" + os.path.basename(path)[:-3])
    return getattr(mod, tool)(**params)


def worker_pid(binding: Any, library: str) -> Optional[int]:
    """The live worker of ``library`` for the binding's tenant (``stats()``)."""
    return next((s["pid"] for s in binding.stats() if s["library"] == library and s["pid"]), None)


# ---------------------------------------------------------------- paths


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

    def spin_counters(self) -> Optional[dict]:
        """The serving slot's spin counters (``stats()["spin"]``), for the sandbox's paths."""
        return None

    def close(self) -> None:
        pass


class _SocketChild(WarmPath):
    """A minimal child process at the other end of an AF_UNIX stream socketpair (the
    engine's transport; a few percent faster than a pipe, so a stricter floor)."""

    def __init__(self, code: str, *args: Any) -> None:
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", code, str(child.fileno()),
                                      *map(str, args)], pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        child.close()
        self.fd = self.sock.fileno()
        self.run(3)

    def place(self, host: Optional[set], worker: Optional[set]) -> None:
        pin_process(self.proc.pid, worker)

    def cpu_pids(self) -> list:
        return [self.proc.pid]

    def close(self) -> None:
        # A process forked from the host since (a ProcessPoolExecutor worker) holds a copy
        # of our end, so the child may never see EOF: stop it outright.
        self.sock.close()
        self.proc.kill()
        self.proc.wait()


class FloorPath(_SocketChild):
    key, label, kind = "floor", "floor: raw socketpair ping-pong", "floor"

    def __init__(self, req_bytes: int, reply_bytes: int) -> None:
        self.req, self.reply_bytes = b"q" * req_bytes, reply_bytes
        super().__init__(_FLOOR_CHILD, req_bytes, reply_bytes)

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


class PicklePath(_SocketChild):
    """Each round trip a minimal Python RPC: the host pickles a CALL-like tuple and frames
    it, the child unpickles it, pickles a result tuple and frames it, the host unpickles
    it.  What any Python engine pays on top of the floor."""
    key, label, kind = "pickle", "pickle RPC (no engine)", "pickle"

    def __init__(self) -> None:
        super().__init__(f"RESULT = {RESULT!r}\n" + _PICKLE_CHILD)

    def run(self, n: int) -> list:
        fd = self.fd
        read, write, dumps, loads = os.read, os.write, pickle.dumps, pickle.loads
        hdr = struct.Struct("!I")
        pack, unpack_from = hdr.pack, hdr.unpack_from
        out = []
        append = out.append
        res = None
        for _ in range(n):
            t0 = now_ns()
            body = dumps(CALL, protocol=5)
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
        if n and res != RESULT:
            raise RuntimeError(f"pickle RPC child answered {res!r}")
        return out


class SandboxPath(WarmPath):
    kind = "sandbox"

    def __init__(self, key: str, binding: Any, tool: str, params: dict, library: str,
                 label: str = "") -> None:
        self.key, self.label = key, label or f"sandbox {tool}"
        self.b, self.tool, self.params, self.library = binding, tool, params, library
        r = binding.execute_tool(tool, dict(params))
        if r.get("status_code") != 200:
            raise RuntimeError(f"{tool} failed in the sandbox: {r.get('error')}")
        self.first_result = r

    def pid(self) -> Optional[int]:
        return worker_pid(self.b, self.library)

    def place(self, host: Optional[set], worker: Optional[set]) -> None:
        pin_process(self.pid(), worker)

    def cpu_pids(self) -> list:
        return [self.pid()]

    def run(self, n: int) -> list:
        return timed_calls(self.b.execute_tool, (self.tool, self.params), n)

    def spin_counters(self) -> Optional[dict]:
        return next((s["spin"] for s in self.b.stats() if s["library"] == self.library and "spin" in s), None)


class InProcessPath(WarmPath):
    kind = "inprocess"

    def __init__(self, key: str, lcp: Any, tool: str, params: dict) -> None:
        self.key, self.label = key, f"in-process LCPBinding {tool}"
        self.lcp, self.tool, self.params = lcp, tool, params
        r = lcp.execute_tool(tool, dict(params))
        if not r.get("success", r.get("status_code") == 200):
            raise RuntimeError(f"{tool} failed in-process: {r.get('error')}")

    def run(self, n: int) -> list:
        # LCPBinding fills defaults into the caller's dict: a fresh copy per call
        return timed_calls(self.lcp.execute_tool, (self.tool, self.params), n, fresh_params=True)


class PPEPath(WarmPath):
    kind = "ppe"

    def __init__(self, key: str, path: str, tool: str, params: dict) -> None:
        import concurrent.futures
        self.key, self.label = key, f"ProcessPoolExecutor {tool}"
        self.path, self.tool, self.params = path, tool, params
        self.ex = concurrent.futures.ProcessPoolExecutor(max_workers=1)
        self.ex.submit(ppe_call, path, tool, params).result(60)
        self.worker = self.ex.submit(os.getpid).result(60)      # its one worker

    def manager_tid(self) -> Optional[int]:
        t = getattr(self.ex, "_executor_manager_thread", None)
        return getattr(t, "native_id", None)

    def place(self, host: Optional[set], worker: Optional[set]) -> None:
        pin_process(self.worker, worker)
        pin_tid(self.manager_tid(), host)

    def cpu_pids(self) -> list:
        return [self.worker]

    def run(self, n: int) -> list:
        submit, path, tool, params = self.ex.submit, self.path, self.tool, self.params
        return timed_calls(lambda: submit(ppe_call, path, tool, params).result(), (), n)

    def close(self) -> None:
        self.ex.shutdown(wait=True, cancel_futures=True)


class SubprocessPath(WarmPath):
    kind = "subprocess"
    warmup = 0

    def __init__(self, key: str, path: str, tool: str, params: dict) -> None:
        self.key, self.label = key, f"python -c per call {tool}"
        self.argv = [sys.executable, "-c", child_code(SUBPROCESS_BODY), path, tool, json.dumps(params)]
        r = subprocess.run(self.argv, capture_output=True, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"python -c failed: {r.stderr.decode(errors='replace')[-300:]}")

    def run(self, n: int) -> list:
        pipe = subprocess.PIPE
        return timed_calls(lambda: subprocess.run(self.argv, stdout=pipe, stderr=pipe, stdin=subprocess.DEVNULL),
                           (), n)


def message_sizes(result: dict, tool: str, params: dict, cwd: str) -> tuple:
    """Bytes of one small call and its result framed as a bare pickle RPC would (a 4-byte
    length + a pickle of a CALL-like / RESULT-like tuple): the floor's message sizes."""
    req = len(pickle.dumps((2, tool, 0, dict(params), cwd, None, 0), protocol=5)) + 4
    reply = len(pickle.dumps((10, result, None), protocol=5)) + 4
    return req, reply


# ---------------------------------------------------------------- the section

ORDER = {"floor": 0, "pickle": 1, "sandbox": 2, "inprocess": 3, "ppe": 4, "subprocess": 5}


def build_paths(ctx: Any) -> list:
    """Every warm path this run measures (a failed one is recorded in ``skipped``)."""
    cfg = ctx.cfg
    paths: list = []

    def add(make: Callable[[], WarmPath], kind: str, key: str) -> None:
        if kind in cfg.skip:
            ctx.skipped[key] = "skipped by request"
            return
        try:
            p = make()
        except Exception as exc:                               # noqa: BLE001
            ctx.skipped[key] = f"{type(exc).__name__}: {exc}"
            return
        paths.append(p)
        ctx.cleanup.append(p.close)

    sb = SandboxPath("sandbox", ctx.binding, "tool_noop", {}, "bench_noop")
    paths.append(sb)
    if ctx.binding_spawn is not None:
        add(lambda: SandboxPath("sandbox_spawn", ctx.binding_spawn, "tool_noop", {}, "bench_noop",
                                "sandbox (spawn path) tool_noop"), "spawn_path", "sandbox_spawn")
    req, reply = message_sizes(sb.first_result, "tool_noop", {}, ctx.ws)
    ctx.result["meta"]["message_bytes"] = {"request": req, "reply": reply}
    add(lambda: FloorPath(req, reply), "floor", "floor")
    add(PicklePath, "pickle", "pickle")
    if ctx.lcp_cls is not None:
        lcp = ctx.lcp_cls(tools_folders=[str(ctx.libs)])
        add(lambda: InProcessPath("inprocess", lcp, "tool_noop", {}), "inprocess", "inprocess")
    add(lambda: PPEPath("ppe", ctx.noop_path, "tool_noop", {}), "ppe", "ppe")
    add(lambda: SubprocessPath("subprocess", ctx.noop_path, "tool_noop", {}), "subprocess", "subprocess")
    u = ctx.user
    if u:
        t, prm = u["tool"], u["params"]
        add(lambda: SandboxPath(f"sandbox:{t}", u["binding"], t, prm, u["library"]), "sandbox", f"sandbox:{t}")
        if ctx.lcp_cls is not None:
            add(lambda: InProcessPath(f"inprocess:{t}", ctx.lcp_cls(tools_folders=[u["folder"]]), t, prm),
                "inprocess", f"inprocess:{t}")
        if u["path"]:
            add(lambda: PPEPath(f"ppe:{t}", u["path"], t, prm), "ppe", f"ppe:{t}")
            add(lambda: SubprocessPath(f"subprocess:{t}", u["path"], t, prm), "subprocess", f"subprocess:{t}")
    return paths


def run(ctx: Any, paths: list, prog: Any) -> None:
    cfg = ctx.cfg
    rounds = max(1, cfg.rounds)
    samples = {pl: {p.key: [] for p in paths} for pl in ctx.placements}
    cpu = {pl: CpuAccount() for pl in ctx.placements}
    spin: dict = {pl: {} for pl in ctx.placements}
    try:
        for r in range(rounds):
            for pl, (host, worker) in ctx.placements.items():
                order = list(paths)
                ctx.rng.shuffle(order)
                for p in order:
                    n = share(cfg.subprocess_calls if p.kind == "subprocess" else cfg.calls, rounds, r)
                    if n <= 0:
                        continue
                    pin_thread(host)
                    p.place(host, worker)
                    if p.warmup:
                        p.run(p.warmup)
                    before = p.spin_counters()
                    samples[pl][p.key].append((r, cpu[pl].batch(p.key, p.cpu_pids(), p.run, n)))
                    add_spin(spin[pl], p.key, before, p.spin_counters())
                    prog.step("warm", f"round {r + 1}/{rounds} {pl:<8} {p.label}")
    finally:
        pin_thread(ctx.all_cpus)
        for p in paths:
            p.place(ctx.all_cpus, ctx.all_cpus)
    paths = sorted(paths, key=lambda p: (ORDER.get(p.kind, 9), ":" in p.key))
    kinds = {p.key: p.kind for p in paths}
    for pl, by in samples.items():
        rows = latency_rows({p.key: by[p.key] for p in paths}, ctx.overhead_ns, "floor", "floor", (50, 99),
                            cpu[pl], served=lambda key: kinds[key] in ("floor", "pickle", "sandbox", "ppe"))
        for p in paths:
            rows[p.key].update(label=p.label, kind=p.kind)
            if p.key in spin[pl]:
                rows[p.key]["spin"] = spin_summary(spin[pl][p.key])
        ctx.result["warm"][pl] = rows

