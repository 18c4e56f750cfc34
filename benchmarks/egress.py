"""EGRESS: what a network policy costs a confined worker's requests, same run.

    an HTTP server in a process of its own on the host's loopback (a small GET: 12 bytes)
    rounds, the two kinds in a fresh random order in each, ``gets`` GETs per kind and round,
    each a new connection (urllib), timed inside the tool:
        direct   a confined worker with the host's network (network=True)
        policy   a confined worker with {"allow": ["127.0.0.1:<port>"]}: its own network
                 namespace, its relay, the host's egress proxy (resolve, check, connect)
    connections a second: the same GETs, one after another, per kind
    bulk: a body of bulk_mb (200 MB), the two kinds in a fresh random order in each of
    BULK_ROUNDS rounds, read into one buffer in the tool; the proxy's throughput / direct's
    memory: 1,000 policies given and 1,000 dialers connected to the proxy (both ends in this
    process, no worker: what the proxy holds per worker), tracemalloc's peak and current

Run alone:  python -m benchmarks.egress [rounds] [gets]
"""
from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from typing import Any

from lcp_sandbox import SandboxedBinding, Supervisor

from .harness import paired_ratio, percentile, ratio, summarize

LIB = '''
import time
import urllib.request


def tool_gets(url: str, n: int) -> dict:
    """n GETs of url, each a new connection: their durations in ns.

    Args:
        url (str): the URL
        n (int): how many
    """
    took = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        with urllib.request.urlopen(url, timeout=20) as r:
            r.read()
        took.append(time.perf_counter_ns() - t0)
    return {"success": True, "output": took}


def tool_bulk(url: str) -> dict:
    """One GET of url whose body is read into one buffer: its bytes and duration in ns.

    Args:
        url (str): the URL
    """
    view = memoryview(bytearray(1 << 20))
    got = 0
    t0 = time.perf_counter_ns()
    with urllib.request.urlopen(url, timeout=60) as r:
        while n := r.readinto(view):
            got += n
    return {"success": True, "output": {"bytes": got, "ns": time.perf_counter_ns() - t0}}
'''
SERVER = '''
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        if "/bulk/" in self.path:
            mb = int(self.path.rsplit("/", 1)[1])
            chunk = bytes(1 << 20)
            self.send_response(200); self.send_header("Content-Length", str(mb << 20))
            self.end_headers()
            for _ in range(mb):
                self.wfile.write(chunk)
            return
        self.send_response(200); self.send_header("Content-Length", "12"); self.end_headers()
        self.wfile.write(b"hello world!")
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
'''
KINDS = ("direct", "policy")
BULK_ROUNDS = 5


class _Slot:
    """What the proxy reads of a supervisor's slot (memory row: no worker behind it)."""

    def __init__(self, n: int, port: int) -> None:
        self.tenant = f"t{n}"
        self.library = type("L", (), {"name": "bench_egress"})()
        self.limits = type("Lim", (), {"network": {"allow": [f"127.0.0.1:{port}",
                                                             "*.example.com:443"]}})()
        self.secrets: dict = {}


def _memory(sup: Supervisor, port: int, n: int = 1000) -> dict:
    """What the proxy holds for ``n`` workers with policies and dialers."""
    import lcp_sandbox.protocol as P
    proxy = sup.egress
    init = P.Init(*([None] * len(P.Init._fields)))
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    slots = [_Slot(i, port) for i in range(n)]
    dialers = []
    tasks = len(proxy._tasks)
    for slot in slots:
        egress = proxy.give(init, slot).confine["egress"]
        d = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        d.connect(egress["socket"])
        d.sendall(egress["token"].encode() + b"\n")
        dialers.append(d)
    deadline = time.monotonic() + 30
    while len(proxy._tasks) < tasks + n and time.monotonic() < deadline:
        time.sleep(0.01)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    for d in dialers:
        d.close()
    return {"workers": n, "kb_per_worker": (current - base) / n / 1024,
            "mb": (current - base) / 2**20, "peak_mb": (peak - base) / 2**20}


def _bulk(made: dict, url: str, mb: int, rng: random.Random) -> dict:
    """GB/s of an ``mb`` body per kind (median of the rounds), and policy / direct."""
    rates: dict = {k: [] for k in KINDS}
    for _ in range(BULK_ROUNDS):
        for kind in rng.sample(KINDS, len(KINDS)):
            got = made[kind].execute_tool("tool_bulk", {"url": url})
            assert got["success"] and got["output"]["bytes"] == mb << 20, got
            rates[kind].append(got["output"]["bytes"] / got["output"]["ns"])
    gbps = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
    return {"mb": mb, "rounds": BULK_ROUNDS, "gb_per_s": gbps,
            "ratio": gbps["policy"] / gbps["direct"]}


def measure(rounds: int = 10, gets: int = 200, seed: int = 1, bulk_mb: int = 200) -> dict:
    tmp = tempfile.mkdtemp(prefix="lcp-bench-egress-")
    os.chmod(tmp, 0o711)
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        lib = os.path.join(tmp, "lib")
        os.makedirs(lib)
        os.chmod(lib, 0o755)
        with open(os.path.join(lib, "bench_egress.py"), "w") as f:
            f.write(LIB)
        url = f"http://127.0.0.1:{port}/"
        with Supervisor(confine=True) as sup:
            made = {}
            for kind in KINDS:
                ws = os.path.join(tmp, kind)
                os.makedirs(ws)
                net = True if kind == "direct" else {"allow": [f"127.0.0.1:{port}"]}
                made[kind] = SandboxedBinding(
                    tools_folders=[lib], supervisor=sup, tenant=kind, workspace=ws,
                    workspace_root=ws, host_tool_configs={"bench_egress": {"sandbox": {
                        "network": net}}})
                made[kind].execute_tool("tool_gets", {"url": url, "n": 5})     # warm up
            rng = random.Random(seed)
            took: dict = {k: [] for k in KINDS}
            p50: dict = {k: {} for k in KINDS}
            rate: dict = {k: [] for k in KINDS}
            for r in range(rounds):
                order = list(KINDS)
                rng.shuffle(order)
                for kind in order:
                    got = made[kind].execute_tool("tool_gets", {"url": url, "n": gets})
                    assert got["success"], got
                    xs = sorted(got["output"])
                    took[kind] += xs
                    p50[kind][r] = percentile(xs, 50)
                    rate[kind].append(len(xs) / (sum(xs) / 1e9))
            bulk = _bulk(made, f"{url}bulk/{bulk_mb}", bulk_mb, rng)
            network = made["policy"].stats()[0]["protections"]["network"]
            memory = _memory(sup, port)
        rows = {k: summarize(v, 1e3) for k, v in took.items()}
        per_s = {k: sorted(v)[len(v) // 2] for k, v in rate.items()}
        return {"rows": rows, "rounds": rounds, "gets": gets, "network": network,
                "ratio": ratio(rows["policy"]["p50"], rows["direct"]["p50"]),
                "added_us": rows["policy"]["p50"] - rows["direct"]["p50"],
                "ratio_paired": paired_ratio(p50["policy"], p50["direct"]),
                "connections_per_s": per_s, "memory": memory, "bulk": bulk}
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def render(res: dict) -> str:
    out = ["EGRESS  a small GET on loopback, new connection each (us)        p50      p99",
           f"  ({res['rounds']} rounds interleaved, {res['gets']} GETs per kind and round, "
           f"timed in the tool)"]
    for kind, label in (("direct", "direct (confined, host network)"),
                        ("policy", "through the egress proxy (a policy)")):
        row = res["rows"][kind]
        out.append(f"  {label:<58} {row['p50']:8.1f} {row['p99']:8.1f}")
    paired = res.get("ratio_paired")
    cps = res["connections_per_s"]
    mem = res["memory"]
    out += [f"  proxy / direct p50: {res['ratio']:.2f}x"
            + ("" if paired is None else f" (paired by round {paired:.2f}x)")
            + f"; {res['added_us']:.0f} us added a connection",
            f"  connections a second, one after another: direct {cps['direct']:.0f}, "
            f"through the proxy {cps['policy']:.0f}",
            f"  the proxy's memory for {mem['workers']} workers with policies and dialers: "
            f"{mem['mb']:.1f} MB ({mem['kb_per_worker']:.1f} KB each; peak {mem['peak_mb']:.1f} MB)",
            f"  a {res['bulk']['mb']} MB body, GB/s: direct {res['bulk']['gb_per_s']['direct']:.2f}, "
            f"through the proxy {res['bulk']['gb_per_s']['policy']:.2f} "
            f"({res['bulk']['ratio']:.2f}x; median of {res['bulk']['rounds']} rounds)",
            f"  in force: {res['network']}"]
    return "\n".join(out)


def run(ctx: Any, prog: Any) -> None:
    ctx.result["egress"] = measure(max(4, ctx.cfg.cold_reps // 2), ctx.cfg.egress_gets,
                                   ctx.cfg.seed, ctx.cfg.egress_bulk_mb)
    prog.step("egress", "done", 0)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    print(render(measure(n, int(sys.argv[2]) if len(sys.argv) > 2 else 200)))
