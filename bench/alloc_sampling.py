"""What memory's bursts cost the application: the allocation sampler against tracemalloc.

    python bench/alloc_sampling.py [--repeats 9]

Three workloads, each a few tens of milliseconds: ``small`` (the cheapest
allocating statement, a one-element list, in a loop: the worst case for any
allocator hook), ``mixed`` (strings, tuples, dicts and a growing list, as a
request handler builds), ``numeric`` (arithmetic on floats: an allocation per
operation). Each runs plain, under memory's sampler (``_fastsample.alloc_*``,
the hook counting every allocation and sampling a stack every 256 kB on
average), and under tracemalloc with one frame (memory's bursts where the C
extension is missing) and eight (memory_stacks). The configurations are
shuffled and interleaved, ``--repeats`` times; the table gives the median time
and the slowdown against plain (medians), and the sampler's figures: its
allocations counted, samples taken, and the charge it makes per allocation
as calibrated (what the agent charges the budget).
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

from dyper.agent.proflet import DetailContext
from dyper.proflets.memory import collector as memory


def small(n: int = 200_000) -> None:
    for i in range(n):
        _ = [i]


def mixed(n: int = 20_000) -> None:
    rows = []
    for i in range(n):
        name = f"user-{i}"
        rows.append({"id": i, "name": name, "tags": (name, str(i * 7))})


def numeric(n: int = 300_000) -> None:
    x = 0.5
    for _ in range(n):
        x = (x * 1.000001 + 0.25) % 7.0


WORKLOADS: dict[str, Callable[[], None]] = {"small": small, "mixed": mixed, "numeric": numeric}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    fast = memory._sampler()
    if fast is None:
        sys.exit("the C extension did not build for this Python: nothing to compare")
    mean = float(memory.SAMPLE_MEAN_BYTES)

    def sampled(work: Callable[[], None]) -> tuple[float, int, int]:
        fast.alloc_start(mean, memory.MAX_SAMPLES)
        t0 = time.perf_counter()
        work()
        took = time.perf_counter() - t0
        count, _, _, samples = fast.alloc_stop()
        return took, count, len(samples)

    def traced(frames: int) -> Callable[[Callable[[], None]], tuple[float, int, int]]:
        def run(work: Callable[[], None]) -> tuple[float, int, int]:
            tracemalloc.start(frames)
            t0 = time.perf_counter()
            work()
            took = time.perf_counter() - t0
            tracemalloc.stop()
            return took, 0, 0

        return run

    def plain(work: Callable[[], None]) -> tuple[float, int, int]:
        t0 = time.perf_counter()
        work()
        return time.perf_counter() - t0, 0, 0

    configs = {
        "plain": plain,
        "sampler": sampled,
        "tracemalloc, 1 frame": traced(1),
        "tracemalloc, 8 frames": traced(8),
    }
    times: dict[tuple[str, str], list[float]] = {}
    counts: dict[str, list[tuple[int, int]]] = {}
    runs = [(w, c) for w in WORKLOADS for c in configs] * args.repeats
    random.shuffle(runs)
    for w, c in runs:
        WORKLOADS[w]()  # warm, in the same state as the timed run follows
        took, n, s = configs[c](WORKLOADS[w])
        times.setdefault((w, c), []).append(took)
        if c == "sampler":
            counts.setdefault(w, []).append((n, s))
    collector = memory.MemoryCollector()
    collector.start_detail(DetailContext([], 0.5))
    collector.stop_detail()
    per_alloc_ns = collector._per_alloc_s * 1e9
    collector.close()

    print(f"Python {platform.python_version()}, {platform.machine()}, {args.repeats} repeats, medians")
    print(f"the agent's calibration here: {per_alloc_ns:.1f} ns charged per allocation counted")
    print("| workload | plain | " + " | ".join(c for c in configs if c != "plain") + " | allocations, samples |")
    print("|---" * (len(configs) + 2) + "|")
    for w in WORKLOADS:
        base = statistics.median(times[(w, "plain")])
        cells = [f"{base * 1e3:.1f} ms"]
        for c in configs:
            if c != "plain":
                cells.append(f"{statistics.median(times[(w, c)]) / base:.2f}x")
        n = statistics.median(x[0] for x in counts[w])
        s = statistics.median(x[1] for x in counts[w])
        print(f"| {w} | " + " | ".join(cells) + f" | {n:,.0f}, {s:,.0f} |")


if __name__ == "__main__":
    main()
