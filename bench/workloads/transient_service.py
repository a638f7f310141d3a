"""A service with planted transients, for triggers: bench/transients.py and tests/integration/test_triggers.py.

Light steady work (``steady``: 2 ms of CPU every 10 ms, a fifth of a core)
all along. Once an agent runs in it, every ``--period`` seconds (a cycle;
0: one cycle, then steady work until killed), at the times given (seconds
into the cycle; the defaults are the bench's):

- ``--hot-at`` 10: ``hot_function`` takes a whole core for ``--hot`` (5) s;
- ``--stuck-at`` 17: the thread ``stuck`` waits ``--stuck`` (6) s for a lock the thread ``holder`` keeps;
- ``--spike-at`` 25: ``spike_alloc`` grows the heap by 200 MB in ``--spike`` (2) s, keeps it 1 s, frees it.

With ``--truth FILE``, each onset is appended to it as a JSON line {"kind",
"t"} (wall time): the ground truth the bench matches events against.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

from dyper import agent

lock = threading.Lock()


def steady(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        busy = time.monotonic() + 0.002
        while time.monotonic() < busy:
            sum(i * i for i in range(200))
        time.sleep(0.008)


def until(start: float, at: float) -> None:
    """Steady work until ``at`` seconds after ``start`` (monotonic)."""
    steady(max(0.0, at - (time.monotonic() - start)))


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
    parser.add_argument("--period", type=float, default=30.0, help="0: one cycle")
    parser.add_argument("--hot-at", type=float, default=10.0)
    parser.add_argument("--hot", type=float, default=5.0)
    parser.add_argument("--stuck-at", type=float, default=17.0)
    parser.add_argument("--stuck", type=float, default=6.0)
    parser.add_argument("--spike-at", type=float, default=25.0)
    parser.add_argument("--spike", type=float, default=2.0)
    parser.add_argument("--truth")
    args = parser.parse_args()

    def onset(kind: str) -> None:
        if args.truth:
            with open(args.truth, "a") as f:
                f.write(json.dumps({"kind": kind, "t": time.time()}) + "\n")

    print("ready", flush=True)
    while not agent.is_running():
        time.sleep(0.05)
    while True:
        start = time.monotonic()
        until(start, args.hot_at)
        onset("cpu")
        hot_function(args.hot)
        until(start, args.stuck_at)
        threading.Thread(target=holder, args=(args.stuck,), name="holder", daemon=True).start()
        time.sleep(0.05)
        onset("blocked")
        threading.Thread(target=stuck_waiter, name="stuck", daemon=True).start()
        until(start, args.spike_at)
        onset("rss_growth")
        kept = spike_alloc(200, args.spike)
        steady(1)
        del kept
        if args.period <= 0:
            while True:
                steady(10)
        until(start, args.period)


if __name__ == "__main__":
    main()
