"""Yield end to end: stack samples per second per 1% of budget, everything charged.

``bench/sample_cost.py`` times the stack walk alone. The agent charges more
than the walk: every wake-up of its thread holds the GIL around the sample
(the loop, the guard, the clock), and that is charged too. This runs the real
agent (sampling only, no monitor, so the whole budget goes to sampling and
reporting) in a process with the reference load of sample_cost.py (8 threads
about 30 frames deep, CPU-bound), and reports what it achieved:

    samples/s per 1% = samples per second / (budget in %)

and the measured cost per sample, split into walk and wake-up, from the
agent's own ledger.

    python bench/yield_.py [--budget 1%] [--seconds 20] [--settle 5] [--threads 8] [--depth 30] [--json]

DYPER_SAMPLER=native (or gil) picks the sampler (see agent/native.py); the
result says which ran, its thread's CPU per sample and what sampling took
from the application's threads per sample.

    python bench/yield_.py --native-at 1,20 [--seconds 5]

runs the native sampler's thread alone (no agent, no planner) on the same
load at fixed mean delays (ms), and prints its CPU per sampling instant,
the share of thread samples that reused a still thread's last stack, the
code-object cache's hit rate and the drains' CPU per instant.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sample_cost import worker
from dyper import agent
from dyper.agent.protocol import parse_budget

YIELD_TARGET = 150


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="1%")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--depth", type=int, default=30)
    ap.add_argument(
        "--settle", type=float, default=5.0, help="seconds before the measurement: the plan starts from estimates"
    )
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--native-at", default="", help="ms,ms,...: the native sampler alone at these mean delays")
    args = ap.parse_args(argv)
    budget = parse_budget(args.budget)
    if args.native_at:
        return native_alone([float(ms) / 1e3 for ms in args.native_at.split(",")], args)

    stop = threading.Event()
    threads = [
        threading.Thread(target=worker, args=(args.depth, stop, 2000, 0.0), daemon=True) for _ in range(args.threads)
    ]
    for t in threads:
        t.start()
    time.sleep(0.5)
    # Nobody listens on port 1: the agent plans alone, with no proflets: FRACT = 1.
    agent.start("tcp://127.0.0.1:1", budget, proflets=())
    a = agent._agent
    assert a is not None
    time.sleep(args.settle)  # let the first plans settle on measured costs: a service runs for hours
    k0 = a._tk.ticker_stats() if a.ticker else None
    s0, spent0, t0 = a.samples_taken, a.guard.spent_s, time.monotonic()
    time.sleep(args.seconds)
    s1, spent1, t1 = a.samples_taken, a.guard.spent_s, time.monotonic()
    k1 = a._tk.ticker_stats() if a.ticker else None
    n = max(1, s1 - s0)
    # The sampler's own thread (the native sampler's, or the ticker's) and what
    # sampling took from the application's threads (the ticker's snapshots in
    # them and its GIL hand-offs; the native sampler runs nothing there).
    thread_us = 1e6 * (k1["ticker_cpu_s"] - k0["ticker_cpu_s"]) / n if k0 and k1 else None
    stall_us = 1e6 * sum(k1[k] - k0[k] for k in ("app_cpu_s", "handoff_s")) / n if k0 and k1 else None
    result = {
        "python": platform.python_version(),
        "machine": f"{platform.processor() or platform.machine()}, {threading.active_count()} threads",
        "budget_pct": 100 * budget,
        "samples_per_s": (s1 - s0) / (t1 - t0),
        "samples_per_s_per_1pct": (s1 - s0) / (t1 - t0) / (100 * budget),
        "spent_pct": 100 * (spent1 - spent0) / (t1 - t0),
        "walk_us": 1e6 * a.sample_cost_s,
        "wake_us": 1e6 * a.wake_cost_s,
        "lag_ms": 1e3 * a.sample_lag_s,
        "target": YIELD_TARGET,
        "sampler": a.sampler,
        "sampler_why": a.sampler_why,
        "sampler_thread_us": thread_us,
        "app_stall_us": stall_us,
    }
    agent.stop()
    stop.set()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"CPython {result['python']}, {args.threads} threads {args.depth} deep, budget {args.budget}: "
            f"{result['samples_per_s']:.0f} samples/s, spent {result['spent_pct']:.2f}%, "
            f"per sample {result['walk_us']:.0f} us walk + {result['wake_us']:.0f} us wake-up, "
            f"lag {result['lag_ms']:.1f} ms"
        )
        if thread_us is not None and stall_us is not None:
            print(
                f"sampler {result['sampler']}: its thread {thread_us:.0f} us CPU per sample, "
                f"the application's threads {stall_us:.1f} us per sample"
            )
        verdict = "met" if result["samples_per_s_per_1pct"] >= YIELD_TARGET else "not met"
        print(
            f"yield: {result['samples_per_s_per_1pct']:.0f} stack samples/s per 1% of budget, "
            f"everything charged (target >= {YIELD_TARGET}: {verdict})"
        )
    return 0


def native_alone(means_s: list[float], args: argparse.Namespace) -> int:
    from dyper.agent import native
    from dyper.agent.tables import Tables

    nat = native._native
    if nat is None:
        print(f"no native sampler: {native.IMPORT_ERROR}")
        return 1
    stop = threading.Event()
    threads = [
        threading.Thread(target=worker, args=(args.depth, stop, 2000, 0.0), daemon=True) for _ in range(args.threads)
    ]
    for t in threads:
        t.start()
    time.sleep(0.5)
    tables = Tables()
    ticker = native.NativeTicker(tables, 512)
    nat.start(threading.get_ident())
    try:
        for mean in means_s:
            nat.set(mean, 0.25)
            time.sleep(0.5)
            s0, drain_s = nat.stats(), 0.0
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                time.sleep(0.05)
                c0 = time.thread_time()
                ticker.ticker_drain({}, tables.locs, tables.new_loc)
                drain_s += time.thread_time() - c0
            s1 = nat.stats()
            d = {
                k: s1.get(k, 0) - s0.get(k, 0)
                for k in ("ticks", "thread_samples", "reused", "code_hits", "code_misses")
            }
            ticks = max(1, d["ticks"])
            cpu_us = 1e6 * (s1["sampler_cpu_s"] - s0["sampler_cpu_s"]) / ticks
            looked = max(1, d["code_hits"] + d["code_misses"])
            print(
                f"CPython {platform.python_version()}, {args.threads} threads {args.depth} deep, native sampler alone "
                f"at {1e3 * mean:g} ms: {ticks / args.seconds:.0f} instants/s, {cpu_us:.0f} us CPU per instant, "
                f"{d['reused'] / max(1, d['thread_samples']):.0%} of thread samples reused, "
                f"code cache {d['code_hits'] / looked:.1%} hits, drain {1e6 * drain_s / ticks:.0f} us per instant"
            )
    finally:
        nat.stop()
        stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
