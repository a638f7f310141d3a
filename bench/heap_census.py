"""What a heap census costs: the heap proflet's census of a process with many live objects.

    python bench/heap_census.py [--repeats 7] [--objects 100000,1000000]

The process grows its heap to each size in turn (objects the garbage
collector tracks, counted by ``gc.get_objects()``: a quarter each instances
of a class, dicts, lists and tuples, on top of what the interpreter has
anyway) and, at each size, takes ``--repeats`` censuses through the heap
proflet's collector, interleaved and shuffled with the obvious walk it
replaces (``gc.get_objects()`` then ``type`` and ``sys.getsizeof`` of every
object in a Python loop). Every census has the GIL for its whole length, so
its time is the application's pause; the table gives medians:

- census CPU: the collector's census as it charges it (CPU time of the
  thread that runs it: listing, counting, sizing the sample);
- listing: ``gc.get_objects()`` alone, wall time: the part no thread can
  interrupt (the counting gives the GIL back between chunks);
- plain walk: the Python loop over every object, for comparison.

The maximum pause (DYPER_HEAP_MAX_PAUSE_MS, default 200 ms) is lifted
here, so every size is measured; the last column says whether a census
of that heap would run under the default.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

from dyper.proflets.heap.collector import MAX_PAUSE_MS, HeapCollector


class Item:
    def __init__(self, i: int) -> None:
        self.i = i
        self.name = None


def grow(heap: list[Any], objects: int) -> None:
    """Add objects until gc.get_objects() counts about ``objects``."""
    missing = objects - len(gc.get_objects())
    for i in range(max(0, missing) // 4):
        item = Item(i)
        heap.extend((item, {"item": item}, [item], (item, i)))


def plain_walk() -> float:
    """The obvious census, for comparison: seconds of CPU."""
    t0 = time.thread_time()
    objs = gc.get_objects()
    counts: dict[type, list[int]] = {}
    for o in objs:
        t = type(o)
        row = counts.get(t)
        if row is None:
            counts[t] = [1, sys.getsizeof(o)]
        else:
            row[0] += 1
            row[1] += sys.getsizeof(o)
    del objs
    return time.thread_time() - t0


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--objects", default="100000,1000000", help="heap sizes, comma-separated")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.objects.split(","))
    collector = HeapCollector()
    collector.max_pause_s = float("inf")  # measure every size, whatever the default would do
    heap: list[Any] = []
    rows = []
    for size in sizes:
        grow(heap, size)
        gc.collect()
        census: list[float] = []
        listing: list[float] = []
        plain: list[float] = []
        objects = 0
        for r in range(args.repeats):
            order = ["census", "plain"]
            random.shuffle(order)
            for what in order:
                if what == "census":
                    result = collector.take_census()
                    census.append(result["scan_ms"] / 1000.0)
                    listing.append(result["pause_ms"] / 1000.0)
                    objects = result["objects"]
                else:
                    plain.append(plain_walk())
            print(f"{size:,} objects: round {r + 1}/{args.repeats} done", file=sys.stderr)
        rows.append(
            {
                "objects": objects,
                "census_ms": 1000.0 * median(census),
                "census_max_ms": 1000.0 * max(census),
                "listing_ms": 1000.0 * median(listing),
                "plain_walk_ms": 1000.0 * median(plain),
                "ns_per_object": 1e9 * median(census) / max(objects, 1),
                "runs_under_default_pause": 1000.0 * max(census) <= MAX_PAUSE_MS,
            }
        )
    print(
        f"Python {platform.python_version()}, {platform.machine()}, median of {args.repeats}, "
        f"census and plain walk interleaved"
    )
    print(f"{'objects':>11} {'census CPU':>11} {'(worst)':>9} {'listing':>9} {'plain walk':>11} {'ns/object':>10}  "
          f"under {MAX_PAUSE_MS:.0f} ms")  # fmt: skip
    for row in rows:
        print(
            f"{row['objects']:>11,} {row['census_ms']:>8.1f} ms {row['census_max_ms']:>6.1f} ms "
            f"{row['listing_ms']:>6.1f} ms {row['plain_walk_ms']:>8.1f} ms {row['ns_per_object']:>10.0f}  "
            f"{'yes' if row['runs_under_default_pause'] else 'no (skipped)'}"
        )
    print(json.dumps({"python": platform.python_version(), "repeats": args.repeats, "sizes": rows}))


if __name__ == "__main__":
    main()
