"""BREAKDOWN: where a warm call's CPU goes, part by part, on each side.

Each part is the engine's own code for it, run in a tight loop in this process
(host CPU), on the bench library's ``tool_noop``:

    host    pickle the CALL                       protocol.dumps(Call)
            the worker's FIFO lock, uncontended   FifoLock acquire + release
            decode and check the RESULT           protocol.parse_from_worker + invalid_answer
    worker  unpickle the CALL                     protocol.loads_from_host
            the call itself                       Worker.call: workspace check, parameters, the
                                                  tool, normalization
            encode the RESULT                     Encoder.encode

Tight loops run on warm caches; a real call runs each part once after a wake-up,
slower.  So the WARM section's CPU per call is the total, and what the parts do
not explain (sockets, wake-ups, spinning, the layers between the parts) is shown
as the rest: CPU per call minus the parts.
"""
from __future__ import annotations

import gc
import os
import sys
import time
from typing import Any, Callable

from lcp_sandbox import protocol as P
from lcp_sandbox.backends.local.slot import FifoLock
from lcp_sandbox.worker.loop import Worker


def _per_call_us(fn: Callable[[], Any], n: int) -> float:
    """Median over 5 batches of the CPU time of one ``fn()``, microseconds."""
    fn()
    batches = []
    for _ in range(5):
        t0 = time.thread_time_ns()
        for _ in range(n):
            fn()
        batches.append((time.thread_time_ns() - t0) / n / 1000)
    return sorted(batches)[2]


def measure(library: str, ws: str, n: int = 20000) -> dict:
    init = P.loads_from_host(P.INIT, P.dumps(P.Init("bench_noop", [library], None, {}, 0, None, None, None, None,
                                                    [], {"max_result_mb": 64})))
    worker = Worker(None, init)
    call = P.Call("tool_noop", 0, {}, ws, None, 0)
    wire = P.dumps(call)
    msg = P.loads_from_host(P.CALL, wire)
    cwd = os.getcwd()
    modules = dict(sys.modules)              # the library's module is put back as it was after
    gc_was = gc.isenabled()
    gc.disable()
    try:
        fields = list(worker.call(msg))      # loads the library; enters the workspace
        frame = worker.encoder.encode(P.RESULT, fields)
        payload = frame[5:]                  # after the frame's header (length, kind)
        decoder = P.Decoder()
        lock = FifoLock()

        def check() -> None:
            reply = P.parse_from_worker(P.RESULT, payload, decoder)
            P.invalid_answer(call, reply[0])

        def locked() -> None:
            lock.acquire()
            lock.release()

        host = [("pickle the CALL", _per_call_us(lambda: P.dumps(call), n)),
                ("the worker's FIFO lock, uncontended", _per_call_us(locked, n)),
                ("decode and check the RESULT (msgpack; see \"What a hostile worker can send\")",
                 _per_call_us(check, n))]
        side = [("unpickle the CALL", _per_call_us(lambda: P.loads_from_host(P.CALL, wire), n)),
                ("the call: workspace check, parameters, the tool, normalization", _per_call_us(
                    lambda: worker.call(msg), n)),
                ("encode the RESULT (msgpack)", _per_call_us(lambda: worker.encoder.encode(P.RESULT, fields), n))]
    finally:
        if gc_was:
            gc.enable()
        os.chdir(cwd)
        for name in set(sys.modules) - set(modules):
            del sys.modules[name]
        sys.modules.update(modules)
    return {"host": [{"part": p, "us": us} for p, us in host],
            "worker": [{"part": p, "us": us} for p, us in side], "loops": n}


def with_totals(bd: dict, warm_row: dict, floor_row: dict) -> dict:
    """The parts next to the WARM section's CPU per call: the rest is what they do not explain."""
    cpu, fl = warm_row.get("cpu_us_per_call") or {}, floor_row.get("cpu_us_per_call") or {}
    for side, key in (("host", "host_thread"), ("worker", "worker")):
        total = cpu.get(key)
        if total is not None:
            parts = sum(r["us"] for r in bd[side])
            bd[f"{side}_total_us"] = total
            bd[f"{side}_rest_us"] = total - parts
            bd[f"{side}_floor_us"] = fl.get(key)
    return bd


def render(bd: dict) -> list:
    out = [f"BREAKDOWN  CPU of a warm call's parts, microseconds (tight loops of {bd['loops']:,} on warm caches; "
           "total: the WARM section's CPU per call)"]
    for side in ("host", "worker"):
        for r in bd[side]:
            out.append(f"  {side:<7}{r['part']:<92}{r['us']:8.2f}")
        if f"{side}_total_us" in bd:
            out.append(f"  {side:<7}{'the rest: sockets, wake-ups, spinning, the layers between the parts':<92}"
                       f"{bd[f'{side}_rest_us']:8.2f}")
            out.append(f"  {side:<7}{'total CPU per call (the pipe floor: ' + format(bd[f'{side}_floor_us'] or 0, '.1f') + ')':<92}"
                       f"{bd[f'{side}_total_us']:8.2f}")
    return out


def run(ctx: Any, prog: Any) -> None:
    bd = measure(str(ctx.libs / "bench_noop.py"), str(ctx.ws), 20000 if ctx.cfg.calls >= 10000 else 4000)
    warm = ctx.result["warm"].get(ctx.headline, {})
    ctx.result["breakdown"] = with_totals(bd, warm.get("sandbox", {}), warm.get("floor", {}))
    prog.step("breakdown", "done", 0)
