"""Cost of one sample: the pure-Python stack walker against agent._fastsample.

Reference process: THREADS threads, each about DEPTH Python frames deep
(threading's own frames included), running CPU-bound Python code, so that the
sampler catches them mid-computation and their innermost frames move between
samples, as in a busy service. The sampler alternates the two walkers in
random order, each into its own tables, and times only the call itself, which
runs with the GIL held: every microsecond of it stalls the application.

CPU-bound threads hand the GIL over only when forced to, every switch
interval; the benchmark lowers it to --switch-ms (1 ms) so that the sampler
gets the GIL often enough. The timed calls are far shorter than that, so they
are not preempted themselves (or rarely: that is what p99 shows).

The implied yield is samples/s per 1% of overhead budget, with 90% of the
budget going to sampling: 0.01 * 0.9 / median cost. The last line prints it for
the walker the agent uses (the C one when built) against the spec's target of
150 (SPEC section 9); with --json it is under "yield".

    python bench/sample_cost.py [--threads 8] [--depth 30] [--samples 1000] [--json]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from dyper.agent.sampling import sample_python
from dyper.agent.tables import Tables

try:  # the C extension, when it was built
    _fastsample: Any = importlib.import_module("dyper.agent._fastsample")
except ImportError as exc:  # not built for this interpreter
    _fastsample = None
    _WHY = str(exc) or "not built"
else:
    _WHY = ""

BUDGET_SHARE = 0.9  # of the overhead budget, spent on sampling
YIELD_TARGET = 150  # samples/s per 1% of budget (SPEC section 9)


def busy(iterations: int) -> int:
    acc = 0
    for i in range(iterations):
        acc += i * i % 7
    return acc


def descend(depth: int, leaf: Callable[[], None]) -> None:
    if depth <= 1:
        leaf()
    else:
        descend(depth - 1, leaf)


def worker(depth: int, stop: threading.Event, burst: int, pause_s: float) -> None:
    def leaf() -> None:
        while not stop.is_set():
            busy(burst)
            if pause_s > 0:
                time.sleep(pause_s)

    descend(depth, leaf)


def python_walker(tables: Tables, counts: dict[Any, int], me: int) -> Callable[[], None]:
    def run() -> None:
        sample_python(tables, counts, me, None, [])  # no activity histogram, as the C walker is timed here

    return run


def c_walker(tables: Tables, counts: dict[Any, int], me: int) -> Callable[[], None]:
    assert _fastsample is not None
    sample = _fastsample.sample

    def run() -> None:
        sample(counts, tables.locs, tables.new_loc, me)

    return run


def stats_us(ns: list[int]) -> dict[str, float]:
    xs = sorted(ns)
    n = len(xs)
    return {
        "median_us": statistics.median(xs) / 1e3,
        "p90_us": xs[min(n - 1, int(0.9 * n))] / 1e3,
        "p99_us": xs[min(n - 1, int(0.99 * n))] / 1e3,
        "mean_us": statistics.fmean(xs) / 1e3,
        "min_us": xs[0] / 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--depth", type=int, default=30, help="Python frames per worker thread")
    ap.add_argument("--samples", type=int, default=1000, help="timed samples per walker (at least)")
    ap.add_argument("--warmup", type=int, default=100, help="untimed samples per walker first")
    ap.add_argument("--interval-ms", type=float, default=1.0, help="pause between samples")
    ap.add_argument("--burst", type=int, default=2000, help="loop iterations per call of busy()")
    ap.add_argument("--pause-ms", type=float, default=0.0, help="worker sleep between bursts (0: none)")
    ap.add_argument("--switch-ms", type=float, default=1.0, help="sys.setswitchinterval during the run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print JSON only")
    args = ap.parse_args(argv)

    walkers = ["python"] + (["c"] if _fastsample is not None else [])
    stop = threading.Event()
    # _bootstrap, _bootstrap_inner, run, worker, descend x k, leaf, busy: k + 6
    frames_below = max(1, args.depth - 6)
    threads = [
        threading.Thread(
            target=worker,
            args=(frames_below, stop, args.burst, args.pause_ms / 1e3),
            name=f"bench-worker-{i}",
            daemon=True,
        )
        for i in range(args.threads)
    ]
    for t in threads:
        t.start()
    time.sleep(0.2)

    me = threading.get_ident()
    state: dict[str, tuple[Tables, dict[Any, int]]] = {w: (Tables(), {}) for w in walkers}
    run = {
        "python": python_walker(*state["python"], me),
        **({"c": c_walker(*state["c"], me)} if "c" in walkers else {}),
    }
    timings: dict[str, list[int]] = {w: [] for w in walkers}
    rng = random.Random(args.seed)
    clock = time.perf_counter_ns
    pause = args.interval_ms / 1e3
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside a timed call is not the walker's cost
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(args.switch_ms / 1e3)
    try:
        for i in range(args.warmup + args.samples):
            order = walkers[:]
            rng.shuffle(order)  # interleaved, in random order per round
            for w in order:
                t0 = clock()
                run[w]()
                dt = clock() - t0
                if i >= args.warmup:
                    timings[w].append(dt)
                time.sleep(pause)
            if i % 200 == 199:
                gc.collect()
    finally:
        sys.setswitchinterval(old_switch)
        if gc_was_enabled:
            gc.enable()
        stop.set()
        for t in threads:
            t.join(5)

    worker_ids = {t.ident for t in threads}
    results: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "threads": args.threads,
        "depth": args.depth,
        "samples": args.samples,
        "switch_interval_ms": args.switch_ms,
        "fastsample": _fastsample is not None,
        "fastsample_cache": bool(getattr(_fastsample, "CACHE_ENABLED", False)),
        "walkers": {},
    }
    if _fastsample is None:
        results["fastsample_missing"] = _WHY
    for w in walkers:
        tables, counts = state[w]
        depths = [len(stack) for (tid, stack) in counts if tid in worker_ids]
        s = stats_us(timings[w])
        s["yield_per_1pct"] = 0.01 * BUDGET_SHARE / (s["median_us"] / 1e6)
        s["locations"] = len(tables.loc_rows)
        s["distinct_stacks"] = len(counts)
        s["mean_worker_stack_depth"] = statistics.fmean(depths) if depths else 0.0
        results["walkers"][w] = s
    if "c" in walkers:
        results["speedup"] = results["walkers"]["python"]["median_us"] / results["walkers"]["c"]["median_us"]
    # the yield: the walker the agent uses (the C one when it was built), against the spec's target
    used = "c" if "c" in walkers else "python"
    results["yield"] = {
        "walker": used,
        "samples_per_s_per_1pct": results["walkers"][used]["yield_per_1pct"],
        "target": YIELD_TARGET,
        "met": results["walkers"][used]["yield_per_1pct"] >= YIELD_TARGET,
    }

    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(
        f"CPython {results['python']}: {args.threads} threads x ~{args.depth} frames, "
        f"{args.samples} samples per walker, interleaved"
    )
    header = ["median µs", "p90 µs", "p99 µs", "mean µs", "samples/s per 1%", "depth"]
    widths = [11, 10, 10, 10, 19, 7]
    print(f"{'walker':<8}" + "".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    for w in walkers:
        s = results["walkers"][w]
        print(
            f"{w:<8}{s['median_us']:>11.1f}{s['p90_us']:>10.1f}{s['p99_us']:>10.1f}{s['mean_us']:>10.1f}"
            f"{s['yield_per_1pct']:>19.0f}{s['mean_worker_stack_depth']:>7.1f}"
        )
    if "speedup" in results:
        print(f"speedup (median): {results['speedup']:.1f}x")
    else:
        print(f"dyper.agent._fastsample unavailable: {_WHY}")
    y = results["yield"]
    print(
        f"yield: {y['samples_per_s_per_1pct']:.0f} stack samples/s per 1% of budget "
        f"({y['walker']} walker, median cost, {args.threads} threads x {args.depth} frames; "
        f"target >= {YIELD_TARGET}: {'met' if y['met'] else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
