"""A service with planted transients, for dyper's triggers (agent.triggers).

Light steady work (``steady``, about a fifth of a core) all along and, timed
from the moment an agent runs in it:

- at 6.5 s, ``hot_function`` takes a whole core for 3 s;
- at 10.5 s, the thread ``stuck`` waits 3.5 s for a lock the thread ``holder`` keeps;
- at 15.5 s, ``spike_alloc`` grows the heap by 200 MB in 1.5 s, keeps it 1 s, frees it.

Then steady work until killed.
"""

from __future__ import annotations

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
    pause = seconds / megabytes
    for _ in range(megabytes):
        kept.append(bytearray(b"x" * (1 << 20)))  # touched, so resident
        time.sleep(pause)
    return kept


def main() -> None:
    print("ready", flush=True)
    while not agent.is_running():
        time.sleep(0.05)
    steady(6.5)
    hot_function(3)
    steady(1)
    threading.Thread(target=holder, args=(3.5,), name="holder", daemon=True).start()
    time.sleep(0.1)
    threading.Thread(target=stuck_waiter, name="stuck", daemon=True).start()
    steady(4.9)
    kept = spike_alloc(200, 1.5)
    steady(1)
    del kept
    while True:
        steady(10)


if __name__ == "__main__":
    main()
