"""cpu-4: four threads of pure-Python CPU work contending for the GIL.

The same work as cpu-1 (``units`` calls of middle()), shared out among four
threads, so that the total is the same and only the threading differs. Prints
the seconds the work took (perf_counter from starting the threads to joining
them, so interpreter and agent start-up are not part of the figure).

    python bench/workloads/cpu4.py [units] [threads]
"""

from __future__ import annotations

import sys
import threading
import time


def inner(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def middle(n: int) -> int:
    return sum(inner(n) for _ in range(10))


def worker(units: int) -> None:
    for _ in range(units):
        middle(2000)


def main(units: int, nthreads: int = 4) -> None:
    shares = [units // nthreads + (1 if i < units % nthreads else 0) for i in range(nthreads)]
    threads = [threading.Thread(target=worker, args=(share,), name=f"cpu4-{i}") for i, share in enumerate(shares)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"{time.perf_counter() - t0:.6f}")


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 1500,
        int(sys.argv[2]) if len(sys.argv) > 2 else 4,
    )
