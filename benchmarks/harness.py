"""The harness every section shares: statistics, CPU placement, the scheduler's
accounts, the timed loop, the per-round (paired) summary, progress output.

What it keeps out of the figures: the timer's own cost (measured, subtracted),
progress output (only between batches), the harness's garbage (collected before
each batch; the collector stays on while timing, so the engine's own allocations
still pay for it), and the reading of /proc (before and after a batch, never
inside it).
"""
from __future__ import annotations

import gc
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

now_ns = time.perf_counter_ns

LIBS = Path(__file__).resolve().parent / "libs"      # bench_noop, bench_heavy

# ---------------------------------------------------------------- statistics


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


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or not b or (isinstance(a, float) and math.isnan(a)):
        return None
    return a / b


def paired_ratio(a: dict, b: dict) -> Optional[float]:
    """Median over rounds of ``a[round] / b[round]`` (rounds both have, b > 0).

    Two batches of one round ran close together, so a burst of outside load (another
    tenant of the VM, a test suite) lands on both; the rounds it spoiled do not move
    the median."""
    xs = sorted(a[r] / b[r] for r in a if r in b and b[r] > 0 and not math.isnan(a[r]))
    return percentile(xs, 50) if xs else None


def secs(xs: list) -> dict:
    """A summary in seconds, with every sample."""
    row = summarize(xs, 1.0)
    row["samples_s"] = [round(x, 6) for x in xs]
    return row


def share(total: int, rounds: int, r: int) -> int:
    """Round r's part of ``total`` calls spread evenly over ``rounds``."""
    return (r + 1) * total // rounds - r * total // rounds


def interleaved(batches: dict, rounds: int, rng: Any, step: Callable[[int], None],
                collect: bool = False) -> tuple[dict, dict]:
    """Run ``batches`` (key: a function returning one batch's samples) ``rounds`` times,
    in a fresh random order each round (``collect``: the garbage collected before each
    batch); ``step(round)`` after each round.  Every sample by key, and each batch's
    median by key and round (for paired_ratio)."""
    samples: dict = {k: [] for k in batches}
    per_round: dict = {k: {} for k in batches}
    for r in range(max(1, rounds)):
        order = list(batches)
        rng.shuffle(order)
        for key in order:
            if collect:
                gc.collect()
            xs = batches[key]()
            samples[key] += xs
            per_round[key][r] = sorted(xs)[len(xs) // 2]
        step(r)
    return samples, per_round


def timer_overhead_ns(n: int = 20000) -> float:
    """Median cost of the timed region's own bracketing (two perf_counter_ns calls)."""
    xs = []
    for _ in range(n):
        t0 = now_ns()
        t1 = now_ns()
        xs.append(t1 - t0)
    xs.sort()
    return float(xs[len(xs) // 2])


# ---------------------------------------------------------------- CPU placement


def pin_thread(cpus: Optional[set]) -> None:
    """Pin the calling thread (Linux: pid 0 is the calling thread)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def pin_tid(tid: Optional[int], cpus: Optional[set]) -> None:
    """Pin one thread of any process of ours."""
    if tid and cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


def pin_process(pid: Optional[int], cpus: Optional[set]) -> None:
    """Pin every thread of a process."""
    if not pid or not cpus:
        return
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        pin_tid(tid, cpus)


# ---------------------------------------------------------------- the scheduler's accounts


def sched(pid: Optional[int], tid: Optional[int] = None, exclude_tid: Optional[int] = None) -> Optional[tuple]:
    """(ns on a CPU, ns waiting on a run queue, times it ran) so far, summed over the
    threads of ``pid`` (or of one thread ``tid``), from /proc/PID/task/TID/schedstat."""
    if not pid:
        return None
    if tid is not None:
        tids = [str(tid)]
    else:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return None
    run = wait = slices = 0
    for t in tids:
        if exclude_tid is not None and int(t) == exclude_tid:
            continue
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                v = f.read().split()
            run += int(v[0])
            wait += int(v[1])
            slices += int(v[2])
        except (OSError, ValueError, IndexError):
            if tid is not None:
                return None
    return run, wait, slices


def cpu_snapshot(pids: list) -> list:
    """[this thread's CPU, its run-queue wait, the other host threads' CPU, the pids' CPU,
    their run-queue wait], ns, each None when unknown."""
    me, tid = os.getpid(), threading.get_native_id()
    own = sched(me, tid=tid)
    others = sched(me, exclude_tid=tid)
    worker = None
    for pid in pids:
        v = sched(pid)
        if v is not None:
            worker = (worker[0] + v[0], worker[1] + v[1]) if worker else v
    return [own and own[0], own and own[1], others and others[0], worker and worker[0], worker and worker[1]]


def cpu_busy_jiffies() -> Optional[tuple]:
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


# ---------------------------------------------------------------- the timed loop


def timed_calls(fn: Callable, args: tuple, n: int, fresh_params: bool = False) -> list:
    """n round-trip times (ns) of ``fn(*args)``.  ``fresh_params``: ``args`` is
    (tool, params) and each call gets its own copy of params, made outside the timed
    region (a callee that fills defaults into the caller's dict must not see them again)."""
    out = []
    append = out.append
    tool, params = args if fresh_params else (None, None)
    for _ in range(n):
        if fresh_params:
            args = (tool, dict(params))
        t0 = now_ns()
        fn(*args)
        t1 = now_ns()
        append(t1 - t0)
    return out


class CpuAccount:
    """Runs timed batches and keeps, per key, the CPU time and the run-queue wait of the
    calling thread, the host's other threads and the serving processes (/proc schedstat,
    read just before and just after each batch)."""

    def __init__(self) -> None:
        self.acc: dict = {}          # key -> [calls, *cpu_snapshot deltas]

    def batch(self, key: str, pids: list, run: Callable[[int], list], n: int) -> list:
        gc.collect(1)                # the harness's garbage, not the engine's
        c0 = cpu_snapshot(pids)
        xs = run(n)
        c1 = cpu_snapshot(pids)
        a = self.acc.setdefault(key, [0] * 6)
        a[0] += n
        for i in range(5):
            if c0[i] is not None and c1[i] is not None:
                a[i + 1] += c1[i] - c0[i]
        return xs

    def fields(self, key: str, served: bool = True) -> dict:
        """Per call, microseconds; ``served``: a process of its own serves the calls."""
        a = self.acc.get(key)
        if not a or not a[0]:
            return {}
        per = [v / a[0] / 1000.0 for v in a[1:]]
        return {"cpu_us_per_call": {"host_thread": per[0], "host_other_threads": per[2],
                                    "worker": per[3] if served else None},
                # time runnable but not running (another task had the CPU): noise, per call
                "runq_wait_us_per_call": {"host_thread": per[1], "worker": per[4] if served else None}}


def latency_rows(batches: dict, overhead_ns: float, ref: str, name: str, qs: tuple,
                 cpu: Optional[CpuAccount] = None, served: Callable[[str], bool] = lambda key: True) -> dict:
    """One row per key from its batches of round trips taken in rounds (microseconds).

    ``batches``: key -> [(round, [ns, ...]), ...].  A row: the pooled summary, every
    sample and its round, the CPU account, and its ratio to the row ``ref`` for each
    percentile q of ``qs``: ``x_<name>_p<q>`` (all samples pooled) and
    ``x_<name>_p<q>_paired`` (the median over rounds of the ratio within each round)."""
    rows: dict = {}
    per_round: dict = {}
    for key, bs in batches.items():
        per_round[key] = {r: sorted(max(0.0, x - overhead_ns) for x in xs) for r, xs in bs}
        xs = [max(0.0, x - overhead_ns) for _, batch in bs for x in batch]
        row = summarize(xs, 1000.0)
        row.update(unit="us", samples_us=[round(x / 1000.0, 3) for x in xs],
                   round_of_sample=[r for r, batch in bs for _ in batch])
        if cpu is not None:
            row.update(cpu.fields(key, served(key)))
        rows[key] = row
    base = rows.get(ref) or {}
    base_rounds = per_round.get(ref, {})
    for key, row in rows.items():
        for q in qs:
            row[f"x_{name}_p{q}"] = ratio(row.get(f"p{q}"), base.get(f"p{q}"))
            row[f"x_{name}_p{q}_paired"] = paired_ratio(
                {r: percentile(xs, q) for r, xs in per_round[key].items()},
                {r: percentile(xs, q) for r, xs in base_rounds.items()})
    return rows


# ---------------------------------------------------------------- progress


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


# ---------------------------------------------------------------- process hygiene


def stop_resource_tracker_if_new() -> Callable[[], None]:
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
