"""A CPU-bound main thread and a short-lived named thread, each measuring its own CPU time.

``planted_main.py SECONDS TRUTH``: the main thread spins for SECONDS of its
own CPU time; first a thread named ``short-lived`` spins for half a second
of its own and ends. At exit TRUTH gets ``{"main": s, "short-lived": s}``,
the CPU seconds each thread's clock measured.
"""

from __future__ import annotations

import json
import sys
import threading
import time


def spin(cpu_s: float) -> float:
    start = time.thread_time()
    n = 0
    while time.thread_time() - start < cpu_s:
        for i in range(2000):
            n += i * i
    return time.thread_time() - start


def main() -> None:
    seconds, truth = float(sys.argv[1]), sys.argv[2]
    used: dict[str, float] = {}
    short = threading.Thread(target=lambda: used.__setitem__("short-lived", spin(0.5)), name="short-lived")
    short.start()
    short.join()
    used["main"] = spin(seconds)
    with open(truth, "w") as f:
        json.dump(used, f)


if __name__ == "__main__":
    main()
