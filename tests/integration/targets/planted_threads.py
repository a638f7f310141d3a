"""Threads with planted behaviour, for the threads, timing and cpu proflets.

- ``sleeper``: sleeps, over and over;
- ``holder``: takes an RLock and sleeps while holding it;
- ``blocked``: wants that RLock (``with`` it), so it is blocked by ``holder``;
- ``spin-0``, ``spin-1``, ``spin-2``: CPU-bound pure Python, so they share the GIL;
- ``paced``: calls ``paced_call`` at a steady known rate (``--rate``, per second);
- ``leaker`` (with ``--leak-fds``): opens a file every 0.1 s and keeps it open.

Runs for ``--seconds`` (default: until killed). With ``--truth FILE`` it
writes, every half second, ``calls seconds`` of ``paced_call`` so far: the
ground truth of its call rate.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

stop = threading.Event()
lock = threading.RLock()
held = threading.Event()


def sleeper() -> None:
    while not stop.is_set():
        time.sleep(0.05)


def holder() -> None:
    with lock:
        held.set()
        stop.wait()


def blocked() -> None:
    held.wait()
    with lock:
        pass


def spin() -> None:
    n = 0
    while not stop.is_set():
        for i in range(1000):
            n += i * i


def paced_call(x: int) -> int:
    # Some work, so the samples see it and cpu detailing picks it as a candidate:
    # about 6% of the samples here, well above the table's 0.5% floor (with a
    # third of it, a loaded 3.11 CI run once left it out).
    for i in range(30000):
        x += i & 7
    return x


def paced(rate: float, truth: str | None) -> None:
    calls = 0
    start = time.monotonic()
    next_write = start + 0.5
    period = 1.0 / rate
    while not stop.is_set():
        paced_call(calls)
        calls += 1
        # Deadlines from the start, so the rate holds however late a wake-up is.
        delay = start + calls * period - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        now = time.monotonic()
        if truth is not None and now >= next_write:
            # Replaced whole, so a reader never sees it half written.
            with open(truth + ".tmp", "w") as f:
                f.write(f"{calls} {now - start}\n")
            os.replace(truth + ".tmp", truth)
            next_write = now + 0.5


def leak_fds() -> None:
    kept = []
    while not stop.wait(0.1):
        kept.append(open(__file__, "rb"))  # noqa: SIM115 - kept open on purpose


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--truth")
    parser.add_argument("--leak-fds", action="store_true")
    args = parser.parse_args()
    threads = [
        threading.Thread(target=sleeper, name="sleeper", daemon=True),
        threading.Thread(target=holder, name="holder", daemon=True),
        threading.Thread(target=blocked, name="blocked", daemon=True),
        *(threading.Thread(target=spin, name=f"spin-{i}", daemon=True) for i in range(3)),
        threading.Thread(target=paced, args=(args.rate, args.truth), name="paced", daemon=True),
    ]
    if args.leak_fds:
        threads.append(threading.Thread(target=leak_fds, name="leaker", daemon=True))
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
