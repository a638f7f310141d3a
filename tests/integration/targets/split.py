"""Known split: work() is called with 3 units from heavy() for every 1 unit from light().

Usage: split.py [SECONDS] [--main-sleeps] [--heartbeat FILE]

The heartbeat file also carries the ground truth: "iterations heavy_s light_s",
the thread CPU time spent in each (what a sampler can see: not the time a loaded
machine keeps the thread off a core), around calls long beside the clock's cost.
With --main-sleeps the work runs on a worker thread while the main thread sleeps
in C, as in a service whose main thread waits in join/sleep for hours.
"""

import os
import sys
import threading
import time


def work(units):
    total = 0
    for _ in range(units):
        for i in range(2000):
            total += i * i
    return total


def heavy():
    return work(3)


def light():
    return work(1)


def loop(seconds, heartbeat):
    end = time.monotonic() + seconds
    n = 0
    heavy_s = light_s = 0.0
    clock = time.thread_time
    while time.monotonic() < end:
        t0 = clock()
        heavy()
        t1 = clock()
        light()
        t2 = clock()
        heavy_s += t1 - t0
        light_s += t2 - t1
        n += 1
        if heartbeat and n % 50 == 0:
            with open(heartbeat + ".tmp", "w") as f:
                f.write(f"{n} {heavy_s} {light_s}")
            os.replace(heartbeat + ".tmp", heartbeat)


def main():
    args = sys.argv[1:]
    seconds = float(args[0]) if args and not args[0].startswith("-") else 3600.0
    heartbeat = args[args.index("--heartbeat") + 1] if "--heartbeat" in args else None
    if "--main-sleeps" in args:
        t = threading.Thread(target=loop, args=(seconds, heartbeat), name="worker", daemon=True)
        t.start()
        # Ready once the worker exists: a probe taken right after must see the same threads as one taken later.
        print("ready", flush=True)
        time.sleep(seconds)
    else:
        print("ready", flush=True)
        loop(seconds, heartbeat)


if __name__ == "__main__":
    main()
