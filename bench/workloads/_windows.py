"""Run one workload's unit of work over and over, and record when each unit ended.

    python bench/workloads/_windows.py WORKLOAD SECONDS OUT

WORKLOAD is cpu-1 (one thread), cpu-4 (four threads contending for the GIL) or
alloc, each the unit of the script of that name in this folder, or one of the
pyperformance benchmarks raytrace, richards, deltablue, nbody and json_dumps
(``pip install -r bench/requirements.txt``): its unit is one loop of the function
its script hands to pyperf, made smaller for raytrace and nbody (see
PYPERF_ARGS) so that a window of a few seconds holds many units. The process
prints ``ready`` after its first units, works for SECONDS (or until a SIGTERM), then writes OUT:

    {"threads": [[t, t, ...], ...], "gc_collections": [g0, g1, g2]}

one list per working thread of the ``time.perf_counter()`` at which each unit
ended (CLOCK_MONOTONIC on Linux, the clock ``time.monotonic()`` reads in another
process). bench/overhead_windows.py turns them into work rates over windows of
time, with the agent's budget switched between windows.

The times go into ``array('d')``: no object per unit for the gc to track, so
the record does not change the work it records.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import runpy
import signal
import sys
import threading
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import alloc
import cpu1

WORKLOADS: dict[str, tuple[Callable[[], object], int]] = {
    "cpu-1": (lambda: cpu1.middle(2000), 1),
    "cpu-4": (lambda: cpu1.middle(2000), 4),
    "alloc": (alloc.unit, 1),
}


#: Arguments for a pyperformance benchmark's own options: smaller units than its defaults
#: (raytrace at 100x100 takes about half a second per loop here, nbody's 20,000 steps 0.2 s).
PYPERF_ARGS: dict[str, list[str]] = {
    "raytrace": ["--width", "40", "--height", "40"],
    "nbody": ["--iterations", "2000"],
    "richards": [],
    "deltablue": [],
    "json_dumps": [],
}


def pyperformance_unit(name: str) -> Callable[[], object]:
    """One loop of the function a pyperformance benchmark's script hands to ``pyperf.Runner``.

    The script runs as ``__main__`` with a stand-in Runner that records the
    function and its arguments instead of timing them: the benchmark's own
    set-up, untouched, and no pyperf worker processes.
    """
    import pyperf
    import pyperformance

    script = Path(pyperformance.__file__).parent / "data-files" / "benchmarks" / f"bm_{name}" / "run_benchmark.py"
    found: list[Callable[[], object]] = []

    class Recorder:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.argparser = argparse.ArgumentParser(prog=name)
            self.metadata: dict[str, Any] = {}

        def parse_args(self, args: Any = None) -> argparse.Namespace:
            return self.argparser.parse_args(PYPERF_ARGS[name])

        def bench_func(self, _name: str, func: Callable[..., object], *args: Any, **kwargs: Any) -> None:
            found.append(lambda: func(*args))

        def bench_time_func(self, _name: str, func: Callable[..., object], *args: Any, **kwargs: Any) -> None:
            found.append(lambda: func(1, *args))  # loops=1: one unit per call

    real, pyperf.Runner = pyperf.Runner, Recorder
    argv, sys.argv = sys.argv, [str(script)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        pyperf.Runner, sys.argv = real, argv
    if not found:
        raise SystemExit(f"{script} handed pyperf no function")
    return found[0]


def work(unit: Callable[[], object], stamps: array, until: list[float]) -> None:
    clock = time.perf_counter
    now = clock()
    while now < until[0]:
        unit()
        now = clock()
        stamps.append(now)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in {*WORKLOADS, *PYPERF_ARGS}:
        print(__doc__, file=sys.stderr)
        return 2
    unit, nthreads = WORKLOADS[argv[0]] if argv[0] in WORKLOADS else (pyperformance_unit(argv[0]), 1)
    seconds, out = float(argv[1]), argv[2]
    for _ in range(3):  # warm: the first units fill caches and the specializer's counters
        unit()
    until = [time.perf_counter() + seconds]
    # SIGTERM ends the work early (the harness is done with it); the stamps are still written.
    signal.signal(signal.SIGTERM, lambda *_: until.__setitem__(0, 0.0))
    stamps = [array("d") for _ in range(nthreads)]
    threads = [
        threading.Thread(target=work, args=(unit, stamps[i], until), name=f"work-{i}", daemon=True)
        for i in range(1, nthreads)
    ]
    for t in threads:
        t.start()
    print("ready", flush=True)
    work(unit, stamps[0], until)
    for t in threads:
        t.join()
    with open(out + ".tmp", "w") as f:
        collections = [s["collections"] for s in gc.get_stats()]
        json.dump({"threads": [s.tolist() for s in stamps], "gc_collections": collections}, f)
    os.replace(out + ".tmp", out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
