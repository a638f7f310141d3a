"""Planted synchronisation bottleneck: consumer() waits on a lock the main thread holds while it sleeps.

Usage: planted_lock.py [SECONDS]

Per cycle the main thread holds the lock for 0.3 s (asleep: not a bottleneck),
then computes for 40 ms of its own CPU time without it. The consumer thread
spends nearly all its time blocked in lock.acquire(): on an idle machine about
88% of the busy samples are that wait and about 12% are compute().

compute() is bounded by the thread's CPU time, not by the clock. Bounded by
the clock, a loaded machine that preempts the main thread (holding the GIL)
gave compute() a few ms of CPU a cycle and fewer samples than its wall time:
its share fell under the diagnosis's 5% threshold (30 ms: 4.6% on CI at
547beae; 60 ms: 4.1% with two busy loops on two cores). Bounded by CPU time,
load only stretches compute() in wall time, which adds to its share (14% to
29% in the same conditions); the wait keeps at least half of the busy samples while
compute() takes less than 0.3 s of wall time, that is while the main thread
gets more than an eighth of a core.
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
    end = time.thread_time() + seconds
    total = 0
    while time.thread_time() < end:
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
        compute(0.04)
    done.set()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 3600.0)
