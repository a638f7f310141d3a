"""What checking triggers costs the agent each second: the conditions, and the ring's cut.

    python bench/trigger_cost.py [--threads 50] [--stacks 2000] [--repeats 2000]

In this process: ``--threads`` threads (half waiting for a lock, half
sleeping), and a counts table of ``--stacks`` distinct stacks as a report
window holds them. Times, over ``--repeats`` rounds, the sampler's work per
check: ``Triggers.check`` with one trigger of each kind (cpu, rss, rss growth,
blocked, a mark pattern and a trivial predicate), and ``Ring.cut`` after a
tenth of the stacks changed. Medians and 90th percentiles in microseconds;
the check runs once a second, so a microsecond is a millionth of a core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dyper.agent.triggers import Ring, Triggers, TriggerSpec, parse_trigger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--stacks", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()

    lock, stop = threading.Lock(), threading.Event()
    lock.acquire()

    def blocked() -> None:
        with lock:
            pass

    threads = [threading.Thread(target=blocked if i % 2 else stop.wait, daemon=True) for i in range(args.threads)]
    for t in threads:
        t.start()
    time.sleep(0.2)

    specs = [parse_trigger(t) for t in ("cpu > 80% for 5s", "rss > 100GB", "rss + 1GB/s", "blocked > 3600s",
                                        "mark:deploy*")]  # fmt: skip
    triggers = Triggers(specs)
    triggers.add(TriggerSpec(kind="predicate", name="trivial"), lambda: False)
    check_us = []
    now = time.monotonic()
    for i in range(args.repeats):
        now += 1.0  # as if a second apart: every check does its full work
        t0 = time.perf_counter()
        triggers.check(now)
        check_us.append(1e6 * (time.perf_counter() - t0))
        if i % 10 == 0:
            triggers.marked("cache warm")

    counts = {(1, (i, i + 1, i + 2)): 1 for i in range(args.stacks)}
    ring = Ring()
    ring.clear(0.0)
    cut_us = []
    for i in range(args.repeats):
        for k in list(counts)[i % 10 :: 10]:
            counts[k] += 1
        t0 = time.perf_counter()
        ring.cut(float(i + 1), counts, i)
        cut_us.append(1e6 * (time.perf_counter() - t0))

    def q(values: list[float]) -> str:
        return f"median {statistics.median(values):.1f} us, p90 {statistics.quantiles(values, n=10)[-1]:.1f} us"

    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}; {args.threads} threads, {args.stacks} stacks")
    print(f"Triggers.check (6 triggers, one of each kind): {q(check_us)}")
    print(f"Ring.cut ({args.stacks} stacks, a tenth changed): {q(cut_us)}")
    stop.set()
    lock.release()


if __name__ == "__main__":
    main()
