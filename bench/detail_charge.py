"""Is cpu detailing charged what it costs? A burst's charge against the time it loses.

    python bench/detail_charge.py [--processes 4] [--repeats 5] [--workloads cpu-1,cpu-4,alloc]

The agent charges a cpu detailing burst (sys.monitoring, 3.12+) its event
count times a per-event cost that the cpu proflet calibrates once per process
on a small loop. This checks that charge on the overhead bench's own code:
cpu-1's unit, the same in four threads (cpu-4), and alloc's unit. Each
process (a fresh one per workload and round: the calibration differs between
processes) runs, ``--repeats`` times, the code plain, the same code under one
burst of each kind on the workload's hot functions (calls; lines and native
time), and plain again. The loss is the hooked time less the mean of the plain
times around it; the charge is the burst's ``slowdown_s``. A ratio
loss/charge above 1 is time the budget never saw.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "workloads"))

WORKLOADS = ("cpu-1", "cpu-4", "alloc")


def case(name: str) -> tuple[Callable[[], object], list[Any], int]:
    """The code to run, its hot functions (the burst's candidates), and how many runs make a measurement."""
    import alloc
    import cpu1

    if name == "cpu-1":
        return (lambda: cpu1.middle(2000)), [cpu1.inner, cpu1.middle], 150
    if name == "alloc":
        return alloc.unit, [alloc.build, alloc.walk, alloc.Node.__init__, alloc.records, alloc.unit], 150

    def four() -> None:
        threads = [threading.Thread(target=lambda: [cpu1.middle(2000) for _ in range(40)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    return four, [cpu1.inner, cpu1.middle], 1


def child(name: str, repeats: int) -> dict[str, Any]:
    from dyper.agent.proflet import DetailContext
    from dyper.proflets.cpu.collector import CpuCollector

    fn, candidates, n = case(name)

    def timed() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0

    c = CpuCollector()
    out: dict[str, Any] = {}
    try:
        timed()  # warm
        for kind, bursts in (("calls", 0), ("lines", 1)):
            lost, charged = [], []
            for _ in range(repeats):
                before = timed()
                c._bursts = bursts  # odd bursts count lines and native time (CpuCollector.burst_kind)
                c.start_detail(DetailContext([f.__code__ for f in candidates], 1.0))
                hooked = timed()
                result = c.stop_detail()
                after = timed()
                lost.append(hooked - (before + after) / 2)
                charged.append(float(result["slowdown_s"]))
            out[kind] = {"lost_s": statistics.median(lost), "charged_s": statistics.median(charged)}
        out["event_ns"] = [1e9 * (c._event_cost_s or 0.0), 1e9 * (c._native_cost_s or 0.0)]
    finally:
        c.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--processes", type=int, default=4, help="fresh processes per workload (default 4)")
    ap.add_argument("--repeats", type=int, default=5, help="bursts of each kind per process (default 5)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.repeats)))
        return 0
    if sys.version_info < (3, 12):
        ap.error("cpu detailing charges events only on 3.12+ (3.11 uses yappi)")
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}: give some of {', '.join(WORKLOADS)}")
    rows: list[tuple[str, int, dict[str, Any]]] = []
    for p in range(args.processes):
        for w in workloads:  # interleaved: drift in the machine's speed hits every workload alike
            cmd = [sys.executable, __file__, "--child", w, "--repeats", str(args.repeats)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows.append((w, p, json.loads(proc.stdout)))
            print(f"  {w} process {p + 1}/{args.processes} done", file=sys.stderr, flush=True)
    print(f"\nCPython {sys.version.split()[0]}: loss / charge of one burst (median of {args.repeats}), per process\n")
    print(
        "| workload | process | calibrated ns per event (plain, native) "
        "| calls: lost ms / charged ms | lines: lost ms / charged ms | lines: loss/charge |"
    )
    print("|---|---|---|---|---|---|")
    for w, p, r in sorted(rows):
        calls, lines = r["calls"], r["lines"]
        ratio = lines["lost_s"] / lines["charged_s"] if lines["charged_s"] > 0 else float("inf")
        print(
            f"| {w} | {p + 1} | {r['event_ns'][0]:.0f}, {r['event_ns'][1]:.0f} "
            f"| {1e3 * calls['lost_s']:.1f} / {1e3 * calls['charged_s']:.1f} "
            f"| {1e3 * lines['lost_s']:.1f} / {1e3 * lines['charged_s']:.1f} | {ratio:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
