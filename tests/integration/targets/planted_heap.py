"""A heap with planted behaviour, for the heap proflet.

- ``Session``: instances accumulate, ``--rate`` a second, never freed: the leak;
- ``Row``: ``--rows`` instances made at start and kept: large, but stable;
- ``Request``: a pool rebuilt every 0.2 s at 100, 400, 200 and 300 instances
  in turn: its count goes up and down, never up five censuses running.

Sessions are made on a deadline from the start, so the rate holds however
late a wake-up is. Runs for ``--seconds`` (default: until killed).
"""

from __future__ import annotations

import argparse
import itertools
import threading
import time

stop = threading.Event()


class Session:
    def __init__(self, i: int) -> None:
        self.id = i
        self.user = f"user-{i}"  # a string: not tracked by the GC, so no other type grows


class Row:
    def __init__(self, i: int) -> None:
        self.i = i


class Request:
    pass


sessions: list[Session] = []
rows: list[Row] = []
pool: list[Request] = []


def leak(rate: float) -> None:
    start = time.monotonic()
    for n in itertools.count(1):
        sessions.append(Session(n))
        delay = start + n / rate - time.monotonic()
        if delay > 0 and stop.wait(delay):
            return


def churn() -> None:
    for size in itertools.cycle((100, 400, 200, 300)):
        pool[:] = [Request() for _ in range(size)]
        if stop.wait(0.2):
            return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--rate", type=float, default=50.0, help="sessions leaked per second")
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    rows.extend(Row(i) for i in range(args.rows))
    threads = [
        threading.Thread(target=leak, args=(args.rate,), name="leaker", daemon=True),
        threading.Thread(target=churn, name="churn", daemon=True),
    ]
    for t in threads:
        t.start()
    print("ready", flush=True)
    try:
        if args.seconds is None:
            stop.wait()
        else:
            stop.wait(args.seconds)
    except KeyboardInterrupt:
        pass
    stop.set()


if __name__ == "__main__":
    main()
