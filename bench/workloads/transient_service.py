"""A service with periodic planted transients, for bench/transients.py.

Light steady work (``steady``: 2 ms of CPU every 10 ms, a fifth of a core)
all along. Once an agent runs in it, every ``--period`` seconds (a cycle):

- at 10 s, ``hot_function`` takes a whole core for ``--hot`` seconds;
- at 17 s, the thread ``stuck`` waits 6 s for a lock the thread ``holder`` keeps;
- at 25 s, ``spike_alloc`` grows the heap by 200 MB in 2 s, keeps it 1 s, frees it.

Each onset is appended to ``--truth`` as a JSON line {"kind", "t"} (wall
time): the ground truth the bench matches events against.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import agent

lock = threading.Lock()


def steady(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        busy = time.monotonic() + 0.002
        while time.monotonic() < busy:
            sum(i * i for i in range(200))
        time.sleep(0.008)


def hot_function(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(i * i for i in range(1000))


def holder(seconds: float) -> None:
    with lock:
        time.sleep(seconds)


def stuck_waiter() -> None:
    lock.acquire()
    lock.release()


def spike_alloc(megabytes: int, seconds: float) -> list[bytearray]:
    kept = []
    for _ in range(megabytes):
        kept.append(bytearray(b"x" * (1 << 20)))
        time.sleep(seconds / megabytes)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--period", type=float, default=30.0)
    parser.add_argument("--hot", type=float, default=5.0)
    parser.add_argument("--truth", required=True)
    args = parser.parse_args()

    def onset(kind: str) -> None:
        with open(args.truth, "a") as f:
            f.write(json.dumps({"kind": kind, "t": time.time()}) + "\n")

    print("ready", flush=True)
    while not agent.is_running():
        time.sleep(0.05)
    while True:
        start = time.monotonic()
        steady(10)
        onset("cpu")
        hot_function(args.hot)
        steady(17 - (time.monotonic() - start))
        threading.Thread(target=holder, args=(6.0,), name="holder", daemon=True).start()
        time.sleep(0.05)
        onset("blocked")
        threading.Thread(target=stuck_waiter, name="stuck", daemon=True).start()
        steady(25 - (time.monotonic() - start))
        onset("rss_growth")
        kept = spike_alloc(200, 2.0)
        steady(1)
        del kept
        steady(max(0.0, args.period - (time.monotonic() - start)))


if __name__ == "__main__":
    main()
