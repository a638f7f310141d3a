"""Planted synchronisation bottleneck: consumer() waits on a lock the main thread holds while it sleeps.

Usage: planted_lock.py [SECONDS]

Per cycle the main thread holds the lock for 0.3 s (asleep: not a bottleneck),
then computes for about 60 ms without it. The consumer thread spends nearly
all its time blocked in lock.acquire(): about 85% of the busy samples are that
wait, and about 15% are compute(). (At 30 ms, compute() came out at 8%, and at
4.6% on a machine so loaded that the main thread was often preempted holding
the GIL, under the diagnosis's 5% threshold.)
"""

import sys
import threading
import time

lock = threading.Lock()
done = threading.Event()


def consumer():
    while not done.is_set():
        lock.acquire()
        lock.release()
        time.sleep(0.001)


def compute(seconds):
    end = time.perf_counter() + seconds
    total = 0
    while time.perf_counter() < end:
        for i in range(1000):
            total += i * i
    return total


def main(seconds):
    threading.Thread(target=consumer, name="consumer", daemon=True).start()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        lock.acquire()
        time.sleep(0.3)
        lock.release()
        compute(0.06)
    done.set()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 3600.0)
