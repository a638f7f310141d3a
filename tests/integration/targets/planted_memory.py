"""Planted memory behaviour, for the memory proflets.

- ``allocator``: ``allocator_loop`` calls ``build_batch`` ``--batches`` times
  a second (deadlines from the start); each batch is ``--batch`` tuples of an
  int and a string, built on one line (the top allocation site) and kept for
  five seconds (a bounded deque), so what a detailing burst sees allocated
  is still alive at its end. Its growth triggers the young collections.
- ``forcer``: calls ``gc.collect()`` in ``force_collection``, ``--collects``
  times a second, over the allocator's live tuples (a full collection of a
  hundred thousand of them: milliseconds each).

With ``--tracemalloc`` the program traces its own allocations (ten frames)
from the start, as an application may: dyper must leave that on.

With ``--truth FILE`` it writes, every half second, replaced whole:
``forced forced_pause_s batches items seconds rss tracing callbacks untraced``:
the forced collections and the time spent in them, the batches built and
the items in them, the seconds since the start, the resident set size,
whether tracemalloc traces and how many gc callbacks there are right now,
and how many of these writes found tracemalloc off.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import threading
import time
import tracemalloc

stop = threading.Event()
lock = threading.Lock()
counts = {"forced": 0, "forced_pause_s": 0.0, "batches": 0, "items": 0, "untraced": 0}


def build_batch(n: int) -> list[tuple[int, str]]:
    batch = []
    for i in range(n):
        batch.append((i, str(i)))  # planted: allocation site
    return batch


def allocator_loop(rate: float, size: int) -> None:
    kept: collections.deque[list[tuple[int, str]]] = collections.deque(maxlen=max(1, int(5 * rate)))
    start = time.monotonic()
    done = 0
    while not stop.is_set():
        kept.append(build_batch(size))
        done += 1
        with lock:
            counts["batches"] += 1
            counts["items"] += size
        delay = start + done / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def force_collection() -> None:
    t0 = time.perf_counter()
    gc.collect()  # planted: forced collection
    pause = time.perf_counter() - t0
    with lock:
        counts["forced"] += 1
        counts["forced_pause_s"] += pause


def forcer(rate: float) -> None:
    start = time.monotonic()
    done = 0
    while not stop.is_set():
        force_collection()
        done += 1
        delay = start + done / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def rss() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def write_truth(path: str, start: float) -> None:
    tracing = tracemalloc.is_tracing()
    with lock:
        counts["untraced"] += not tracing
        c = dict(counts)
    with open(path + ".tmp", "w") as f:
        f.write(
            f"{c['forced']} {c['forced_pause_s']} {c['batches']} {c['items']} {time.monotonic() - start} "
            f"{rss()} {int(tracing)} {len(gc.callbacks)} {c['untraced']}\n"
        )
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--batches", type=float, default=20.0, help="batches a second")
    parser.add_argument("--batch", type=int, default=1000, help="items a batch")
    parser.add_argument("--collects", type=float, default=5.0, help="forced collections a second")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--truth")
    args = parser.parse_args()
    if args.tracemalloc:
        tracemalloc.start(10)
    start = time.monotonic()
    threads = [
        threading.Thread(target=allocator_loop, args=(args.batches, args.batch), name="allocator", daemon=True),
        threading.Thread(target=forcer, args=(args.collects,), name="forcer", daemon=True),
    ]
    for t in threads:
        t.start()
    print("ready", flush=True)
    deadline = None if args.seconds is None else start + args.seconds
    try:
        while not stop.wait(0.5):
            if args.truth:
                write_truth(args.truth, start)
            if deadline is not None and time.monotonic() >= deadline:
                break
    except KeyboardInterrupt:
        pass
    stop.set()


if __name__ == "__main__":
    main()
