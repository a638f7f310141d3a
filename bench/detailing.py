"""What cpu detailing costs: counting a handful of functions on call-heavy code.

    python bench/detailing.py [--repeats 9] [--calls 200000]

The workload makes many small calls through a dozen functions; detailing
counts five of them. Each configuration runs the same workload, shuffled
and interleaved with the others, ``--repeats`` times; the table gives the
median time and the slowdown against no detailing (medians):

- selective, calls: the cpu proflet's collector, ``sys.monitoring`` PY_START
  on the five candidates' code objects only (3.12+), counted by
  ``agent._fastsample.CallCounter`` (C);
- selective, Python callback: the same counted by a Python callback (what an
  agent without its C extension does);
- selective, calls+lines: the same with LINE events (every other burst);
- frame hook, calls (3.11): the cpu proflet's collector on 3.11, a PEP 523
  frame evaluation hook in C that every Python frame goes through while the
  burst runs, counting the candidates' starts;
- yappi (cpu clock) and yappi (wall clock): every call of every function,
  which is what 3.11 has without dyper's C extension.

SPEC target: at most 1.3x for the selective path.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

from dyper.agent.proflet import DetailContext
from dyper.proflets.cpu.collector import CpuCollector, frame_hook

# --- the workload: call-heavy, a dozen small functions -------------------------------


def leaf_a(x: int) -> int:
    return x + 1


def leaf_b(x: int) -> int:
    return x ^ 3


def leaf_c(x: int) -> int:
    return x * 2


def leaf_d(x: int) -> int:
    return x - 1


def mid_a(x: int) -> int:
    return leaf_a(x) + leaf_b(x)


def mid_b(x: int) -> int:
    return leaf_c(x) + leaf_d(x)


def mid_c(x: int) -> int:
    return mid_a(x) - mid_b(x)


def helper_1(x: int) -> int:
    return x & 255


def helper_2(x: int) -> int:
    return helper_1(x) | 1


def step(x: int) -> int:
    return mid_c(x) + helper_2(x)


def workload(n: int) -> int:
    total = 0
    for i in range(n):
        total += step(i)
    return total


#: the functions a burst counts (the collector would pick the hottest by samples)
CANDIDATES = [step, mid_c, mid_a, leaf_a, helper_2]


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_plain(n: int) -> float:
    return _time(lambda: workload(n))


def run_selective(n: int, lines: bool) -> float:
    c = CpuCollector()
    c._bursts = 1 if lines else 0  # odd bursts count lines too
    c.start_detail(DetailContext([f.__code__ for f in CANDIDATES], 1.0))
    try:
        return _time(lambda: workload(n))
    finally:
        result = c.stop_detail()
        counted = {row[1]: row[3] for row in result["functions"]}
        assert counted["step"] == n, counted  # exact counts, or the comparison means nothing
        c.close()


def run_python_counter(n: int) -> float:
    from dyper.proflets.cpu import collector as cpu

    real = cpu.call_counter
    cpu.call_counter = cpu.PyCallCounter
    try:
        return run_selective(n, lines=False)
    finally:
        cpu.call_counter = real


def run_yappi(n: int, clock: str) -> float:
    import yappi

    yappi.set_clock_type(clock)
    yappi.clear_stats()
    yappi.start(builtins=False, profile_threads=False)
    try:
        return _time(lambda: workload(n))
    finally:
        yappi.stop()
        yappi.clear_stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--calls", type=int, default=200_000, help="iterations of the workload (each makes 11 calls)")
    args = parser.parse_args()
    n = args.calls
    configs: dict[str, Callable[[], float]] = {"none": lambda: run_plain(n)}
    if sys.version_info >= (3, 12):
        configs["selective, calls"] = lambda: run_selective(n, lines=False)
        configs["selective, calls+lines"] = lambda: run_selective(n, lines=True)
        configs["selective, Python callback"] = lambda: run_python_counter(n)
    elif frame_hook() is not None:
        configs["frame hook, calls"] = lambda: run_selective(n, lines=False)
    try:
        import yappi  # noqa: F401

        configs["yappi (cpu clock)"] = lambda: run_yappi(n, "cpu")
        configs["yappi (wall clock)"] = lambda: run_yappi(n, "wall")
    except ImportError:
        print("yappi not installed: pip install yappi", file=sys.stderr)
    times: dict[str, list[float]] = {k: [] for k in configs}
    run_plain(n // 10)  # warm up
    for r in range(args.repeats):
        order = list(configs)
        random.shuffle(order)
        for name in order:
            times[name].append(configs[name]())
        print(f"round {r + 1}/{args.repeats} done", file=sys.stderr)
    base = statistics.median(times["none"])
    print(f"Python {platform.python_version()}, {platform.machine()}, {n:,} iterations x 11 calls, "
          f"median of {args.repeats}, interleaved")  # fmt: skip
    print(f"{'detailing':28} {'median s':>9} {'slowdown':>9}")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:28} {m:9.3f} {m / base:8.2f}x")


if __name__ == "__main__":
    main()
