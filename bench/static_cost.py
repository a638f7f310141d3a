"""What the agent costs by being there at all: instructions counted by valgrind, not seconds.

    python bench/static_cost.py [--workloads cpu-1,alloc] [--units 400] [--budget 0.01%]

bench/overhead_windows.py measures what each budget's work costs, against the
agent idling at its least budget in the same process; what the idle agent
costs is the same in every one of its windows, so it is not in those figures.
That standing cost is mostly the objects the agent imports (pyzmq, msgpack,
the agent's modules), which every full garbage collection of the application
walks. This script measures it in instructions, which do not depend on what
else the machine runs:

each workload script (bench/workloads/_timed.py SCRIPT UNITS) runs under
``valgrind --tool=cachegrind --cache-sim=no`` at N and 2N units, with no agent
and under ``dyper run --budget B`` (default 0.01%, where the agent idles), and
the instructions per unit of work are (I(2N) - I(N)) / N: start-up, the
agent's included, cancels out. The standing cost is the agent's per-unit
figure over the no-agent one, minus one. Valgrind runs the process about ten
times slower and one thread at a time; counts repeat within 0.01% from run to
run (the two no-agent runs of each size show it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.overhead import SCRIPT_WORKLOADS, TIMED, WORKLOADS_DIR, log, machine_info

REPO = Path(__file__).resolve().parent.parent
IREFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def instructions(args: argparse.Namespace, workload: str, units: int, budget: str | None, tmp: Path) -> int:
    target = [
        "valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={tmp / 'cg.out'}",
        args.python, str(TIMED), str(WORKLOADS_DIR / SCRIPT_WORKLOADS[workload]), str(units),
    ]  # fmt: skip
    cmd = target if budget is None else [args.python, "-m", "dyper", "run", "-q", "--budget", budget, "--", *target]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict and set orders in every run
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=args.timeout)
    found = IREFS.findall(out.stderr)
    if out.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-1500:]}")
    return int(found[-1].replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="cpu-1,alloc")
    ap.add_argument("--units", type=int, default=400, help="N (default 400: about 1 s of work, 10 s under valgrind)")
    ap.add_argument("--budget", default="0.01%")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        ap.error("valgrind is not installed (apt-get install -y valgrind)")
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in SCRIPT_WORKLOADS:
            ap.error(f"unknown workload {w!r}: give some of {', '.join(SCRIPT_WORKLOADS)}")
    machine = machine_info(args.python)
    log(f"machine: {machine['cpu_model']}, {machine['cores']} cores, Python {machine['python']}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="dyper-static-") as tmpname:
        tmp = Path(tmpname)
        for w in workloads:
            n = args.units
            counts: dict[str, dict[int, list[int]]] = {"none": {n: [], 2 * n: []}, "agent": {n: [], 2 * n: []}}
            # none twice (its repeatability), agent once, interleaved
            for side, budget in (("none", None), ("agent", args.budget), ("none", None)):
                for units in (n, 2 * n):
                    counts[side][units].append(instructions(args, w, units, budget, tmp))
                    log(f"  {w} {side} {units} units: {counts[side][units][-1]:,} instructions")
            none = [(b - a) / n for a, b in zip(counts["none"][n], counts["none"][2 * n], strict=True)]
            agent = (counts["agent"][2 * n][0] - counts["agent"][n][0]) / n
            base = sum(none) / len(none)
            rows.append((w, base, agent, 100 * (agent / base - 1), 100 * abs(none[0] - none[1]) / base))
    print(f"\nstanding cost of the agent at {args.budget} (instructions per unit of work, N = {args.units})\n")
    print("| workload | no agent | agent | cost | repeatability |")
    print("|---|---|---|---|---|")
    for w, base, agent, cost, rep in rows:
        print(f"| {w} | {base:,.0f} | {agent:,.0f} | {cost:+.2f}% | {rep:.3f}% |")
    print(f"\nmachine: {machine}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
