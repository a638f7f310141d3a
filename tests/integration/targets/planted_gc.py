"""GC pressure that measures its own pause time: the truth for the memory proflet's GC figures.

A large live heap of small containers (every full collection walks it) and
a churn of cyclic garbage (it keeps the collector busy). Its own
``gc.callbacks`` timer measures every collection's pause. Runs ``SECONDS``
of wall time, then writes ``{"pause_s", "wall_s", "collections"}`` (the
pauses' sum, the time it measured over and collections per generation) to
``TRUTH`` as JSON.
"""

from __future__ import annotations

import gc
import json
import sys
import time

paused = [0.0]
started = [0.0]
collections = [0, 0, 0]


def timer(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        paused[0] += time.perf_counter() - started[0]
        collections[info["generation"]] += 1


def churn(n: int) -> None:
    for _ in range(n):
        a: list[object] = []
        b: list[object] = [a]
        a.append(b)


def main() -> None:
    seconds, truth = float(sys.argv[1]), sys.argv[2]
    heap = [{"i": i, "l": [i]} for i in range(int(sys.argv[3]) if len(sys.argv) > 3 else 200_000)]
    gc.set_threshold(700, 5, 5)  # full collections often: each walks the whole heap
    gc.callbacks.append(timer)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        churn(1000)
    wall = time.perf_counter() - t0
    gc.callbacks.remove(timer)
    with open(truth, "w") as f:
        json.dump({"pause_s": paused[0], "wall_s": wall, "collections": collections}, f)
    del heap


if __name__ == "__main__":
    main()
