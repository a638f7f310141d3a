"""Overhead of dyper on a CPU-bound program, budget by budget, interleaved.

    python bench/overhead.py [--repeats 5] [--budgets 1%,5%] [--units 1500] [--json out.json]

Each repeat runs the workload once with no agent and once per budget, in a
shuffled order, so drift in the machine's speed hits every column alike.
Figures are medians over the repeats: the workload's own timing of its work,
the slowdown against no agent (the actual overhead), what the agent reports it
spent, and samples per second. On a shared VM, wall time also carries noise
from other tenants that adds to a run and never subtracts from it, so the
slowdown of the fastest runs (min against min) is shown beside the median.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "workloads" / "cpu1.py"


def run_once(budget: str | None, units: int) -> dict[str, float]:
    if budget is None:
        out = subprocess.run([sys.executable, str(WORKLOAD), str(units)], capture_output=True, text=True, check=True)
        return {"work_s": float(out.stdout.split()[-1])}
    with tempfile.TemporaryDirectory() as tmp:
        prof = Path(tmp) / "p.json"
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "monitor",
                "run",
                "-q",
                "--budget",
                budget,
                "-o",
                str(prof),
                "--",
                sys.executable,
                str(WORKLOAD),
                str(units),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=HERE.parent,
        )
        work = float(next(line for line in out.stdout.splitlines() if line.strip()[:1].isdigit()).split()[0])
        process = json.loads(prof.read_text())["process"]
    return {
        "work_s": work,
        "reported": process["overhead"],
        "samples": process["samples"],
        "duration_s": process["duration_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budgets", default="1%,5%")
    parser.add_argument("--units", type=int, default=1500, help="size of the work (1500 is a few seconds)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    budgets: list[str | None] = [None, *args.budgets.split(",")]
    runs: dict[str, list[dict[str, float]]] = {str(b): [] for b in budgets}
    rng = random.Random(0)
    for r in range(args.repeats):
        order = budgets[:]
        rng.shuffle(order)
        for b in order:
            runs[str(b)].append(run_once(b, args.units))
        print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr)
    base = statistics.median(x["work_s"] for x in runs["None"])
    base_min = min(x["work_s"] for x in runs["None"])
    spread = (max(x["work_s"] for x in runs["None"]) - min(x["work_s"] for x in runs["None"])) / base
    rows = []
    for b in budgets:
        xs = runs[str(b)]
        work = statistics.median(x["work_s"] for x in xs)
        fastest = min(x["work_s"] for x in xs)
        row = {
            "budget": b or "none",
            "work_s": work,
            "actual_overhead_pct": 100 * (work / base - 1),
            "min_overhead_pct": 100 * (fastest / base_min - 1),
        }
        if b is not None:
            row["reported_overhead_pct"] = 100 * statistics.median(x["reported"] for x in xs)
            row["samples_per_s"] = statistics.median(x["samples"] / x["duration_s"] for x in xs)
        rows.append(row)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(
        f"\ncpu-1 overhead, medians of {args.repeats} interleaved runs ({machine}); no-agent spread {100 * spread:.1f}%"
    )
    print(f"{'budget':>8} {'work s':>8} {'actual %':>9} {'min-min %':>10} {'reported %':>11} {'samples/s':>10}")
    for row in rows:
        print(
            f"{row['budget']:>8} {row['work_s']:8.3f} {row['actual_overhead_pct']:9.2f} "
            f"{row['min_overhead_pct']:10.2f} {row.get('reported_overhead_pct', 0.0):11.2f} "
            f"{row.get('samples_per_s', 0.0):10.0f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "noise_pct": 100 * spread, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
