"""What an attached but paused agent costs: its threads' CPU time and wake-ups, paused against running.

    python bench/paused_cost.py [--seconds 20] [--budget 1%] [--repeats 3]

A fresh process per repeat runs cpu-1's unit in a loop on its main thread,
starts dyper's agent (no monitor: it plans and schedules by itself, as it
does before a monitor answers), lets it run for 3 s, then measures for
``--seconds`` with the agent running at the budget and for as long paused
(``agent.pause()``), in that order. Measured from /proc/self/task: CPU time
and context switches (each a wake-up: a switch away from the CPU and back)
of the agent's threads (dyper-sampler, dyper-ticker, dyper-watchdog, and its
ZeroMQ context's I/O and reaper threads), and
the samples taken. Counts that do not depend on the machine's load, unlike
a slowdown: a paused agent that wakes a few times a minute for a few
microseconds costs nothing any slowdown measurement could see.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "workloads"))

#: The agent's threads: its own, and its ZeroMQ context's (this workload uses no ZeroMQ of its own).
AGENT_THREADS = ("dyper-sampler", "dyper-ticker", "dyper-watchdog", "ZMQbg/IO/0", "ZMQbg/Reaper")


def _agent_tasks() -> dict[int, tuple[float, int]]:
    """Per agent thread (by tid): CPU seconds and context switches so far."""
    out: dict[int, tuple[float, int]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        base = f"/proc/self/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                name = f.read().strip()
            if name not in AGENT_THREADS:
                continue
            with open(f"{base}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"{base}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue  # the thread ended
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        switches = int(status["voluntary_ctxt_switches"]) + int(status["nonvoluntary_ctxt_switches"])
        out[int(tid)] = (cpu, switches)
    return out


def _agent_cpu_schedstat() -> float:
    """CPU seconds of the agent's threads from schedstat (nanoseconds, finer than the ticks of /stat)."""
    total = 0.0
    for tid in _agent_tasks():
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0]) / 1e9
        except OSError:
            pass
    return total


def _measure(seconds: float, a: Any) -> dict[str, float]:
    before, cpu0, samples0 = _agent_tasks(), _agent_cpu_schedstat(), a.samples_taken
    time.sleep(seconds)
    after, cpu1, samples1 = _agent_tasks(), _agent_cpu_schedstat(), a.samples_taken
    switches = sum(after[t][1] - before[t][1] for t in after if t in before)
    return {
        "agent_cpu_ms_per_s": 1e3 * (cpu1 - cpu0) / seconds,
        "wakeups_per_s": switches / 2 / seconds,  # a wake-up is two switches: in and out
        "samples_per_s": (samples1 - samples0) / seconds,
    }


def child(seconds: float, budget: str) -> dict[str, Any]:
    import cpu1

    from dyper import agent

    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            cpu1.middle(2000)

    worker = threading.Thread(target=work, name="work")
    worker.start()
    try:
        agent.start(monitor="tcp://127.0.0.1:9", budget=budget)  # nobody listens there: the agent plans alone
        a = agent._agent
        assert a is not None
        time.sleep(3.0)
        running = _measure(seconds, a)
        agent.pause()
        time.sleep(0.5)  # the pause is applied at the agent thread's next wake-up
        paused = _measure(seconds, a)
        agent.stop()
    finally:
        stop.set()
        worker.join()
    return {"running": running, "paused": paused}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds measured in each state (default 20)")
    ap.add_argument("--budget", default="1%")
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes (default 3)")
    ap.add_argument("--json", metavar="FILE", help="write the results here too")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.seconds, args.budget)))
        return 0
    rows = []
    for i in range(args.repeats):
        cmd = [sys.executable, __file__, "--child", "--seconds", str(args.seconds), "--budget", args.budget]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"  process {i + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    head = f"CPython {sys.version.split()[0]}, budget {args.budget}, {args.seconds:g} s per state"
    print(f"\n{head}, median of {len(rows)}\n")
    print("| state | agent threads' CPU, ms/s | wake-ups/s | samples/s |")
    print("|---|---|---|---|")
    for state in ("running", "paused"):
        med = {k: statistics.median(r[state][k] for r in rows) for k in rows[0][state]}
        print(
            f"| {state} | {med['agent_cpu_ms_per_s']:.3f} | {med['wakeups_per_s']:.2f} | {med['samples_per_s']:.1f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
