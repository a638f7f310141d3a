"""One service with every kind of finding planted, for dyper's defaults (no options, 1%).

Each thread measures its own truth:

- ``leaker``: keeps ``Session`` objects, ``--leak-rate`` a second, never freed (the leak);
- the main thread: ``build_rows`` makes tuples on one line, the last 50 batches kept (the heavy allocation site);
- ``gc-churn``: ``make_cycles`` makes cyclic garbage over a live heap (GC pressure); a
  ``gc.callbacks`` timer sums the pauses;
- ``reader``: ``slow_reader`` waits on a socket in ``recv`` for a chunk the
  ``feeder`` sends every 0.1 s (the socket wait);
- ``sleeper``: sleeps in ``time.sleep``;
- ``holder`` / ``waiter``: ``holder`` keeps a lock, ``lock_waiter`` waits for it;
- ``spin-0``..``spin-2``: pure Python spinners sharing the GIL;
- ``short-lived``: a named thread that works a second and ends;
- the main thread: CPU-bound pure Python in ``main_work``.

With ``--truth FILE`` it writes, at the end (and every second, replaced whole),
a JSON object: each thread's name and CPU seconds (its own clock), the sessions
kept, the rows built and the bytes a batch of 2000 holds, the GC pauses and
collections, the chunks read, the wall time.
Runs ``--seconds`` (default: until killed).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import socket
import sys
import threading
import time
from itertools import repeat

stop = threading.Event()
lock = threading.Lock()
truth: dict[str, object] = {"cpu_s": {}, "sessions": 0, "rows": 0, "gc_pause_s": 0.0, "collections": 0, "chunks": 0}
_gc_start = [0.0]


class Session:
    def __init__(self, i: int) -> None:
        self.id = i
        self.user = f"user-{i}"


def _clock(name: str) -> None:
    """Record this thread's CPU seconds under its name (called as it goes and when it ends)."""
    truth["cpu_s"][name] = time.thread_time()  # type: ignore[index]


def leaker(rate: float) -> None:
    kept = []
    start = time.monotonic()
    while not stop.is_set():
        kept.append(Session(len(kept)))  # planted: the leak
        truth["sessions"] = len(kept)
        delay = start + len(kept) / rate - time.monotonic()
        if delay > 0:
            stop.wait(delay)


def build_rows(n: int) -> list[tuple[int, str]]:
    return [(i, str(i)) for i in range(n)]  # planted: the allocation site


#: The last rows built are kept (a cache of recent requests, say), so what a
#: traced burst saw allocated is still alive at its end.
recent: collections.deque[list[tuple[int, str]]] = collections.deque(maxlen=50)


def make_cycles(n: int) -> None:
    for _ in range(n):
        a: list[object] = []
        b: list[object] = [a]
        a.append(b)  # planted: cyclic garbage


def _gc_timer(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_start[0] = time.perf_counter()
    else:
        truth["gc_pause_s"] += time.perf_counter() - _gc_start[0]  # type: ignore[operator]
        truth["collections"] += 1  # type: ignore[operator]


def gc_churn() -> None:
    heap = [{"i": i, "l": [i]} for i in range(100_000)]  # a live heap every full collection walks
    while not stop.is_set():
        make_cycles(1000)
        _clock("gc-churn")
        time.sleep(0.005)
    del heap


def feeder(sock: socket.socket) -> None:
    while not stop.wait(0.1):
        sock.sendall(b"x" * 1024)


def slow_reader(sock: socket.socket) -> None:
    while not stop.is_set():
        data = sock.recv(1024)  # planted: the socket wait
        if not data:
            return
        truth["chunks"] += 1  # type: ignore[operator]


def sleeper() -> None:
    while not stop.is_set():
        time.sleep(0.05)  # planted: the sleeper


def holder() -> None:
    with lock:
        stop.wait()


def lock_waiter() -> None:
    time.sleep(0.2)
    with lock:  # planted: the lock wait
        pass


# The CPU-bound loops allocate nothing (small ints are cached, repeat() makes
# no objects): the heavy allocation site is build_rows alone, as planted.
def spin(name: str) -> None:
    n = 0
    while not stop.is_set():
        for _ in repeat(None, 1000):
            n = (n + 7) & 127
        _clock(name)


def short_lived() -> None:
    end = time.thread_time() + 1.0
    n = 0
    while time.thread_time() < end:
        n = (n + 1) & 127
    _clock("short-lived")


def main_work() -> int:
    n = 0
    for _ in repeat(None, 20000):
        n = (n + 3) & 63
    return n


def batch_bytes(rows: list[tuple[int, str]]) -> int:
    """What one batch of build_rows holds: the list, its tuples, their strings and the ints past the cached ones."""
    return sys.getsizeof(rows) + sum(
        sys.getsizeof(t) + sys.getsizeof(t[1]) + (sys.getsizeof(t[0]) if t[0] > 256 else 0) for t in rows
    )


def write_truth(path: str, start: float) -> None:
    truth["wall_s"] = time.monotonic() - start
    with open(path + ".tmp", "w") as f:
        json.dump(truth, f)
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--leak-rate", type=float, default=200.0)
    parser.add_argument("--truth")
    args = parser.parse_args()
    gc.callbacks.append(_gc_timer)
    a, b = socket.socketpair()
    threads = [
        threading.Thread(target=leaker, args=(args.leak_rate,), name="leaker", daemon=True),
        threading.Thread(target=gc_churn, name="gc-churn", daemon=True),
        threading.Thread(target=feeder, args=(a,), name="feeder", daemon=True),
        threading.Thread(target=slow_reader, args=(b,), name="reader", daemon=True),
        threading.Thread(target=sleeper, name="sleeper", daemon=True),
        threading.Thread(target=holder, name="holder", daemon=True),
        threading.Thread(target=lock_waiter, name="waiter", daemon=True),
        *(threading.Thread(target=spin, args=(f"spin-{i}",), name=f"spin-{i}", daemon=True) for i in range(3)),
    ]
    for t in threads:
        t.start()
    print("ready", flush=True)
    start = time.monotonic()
    end = start + args.seconds if args.seconds is not None else float("inf")
    next_write = start + 1.0
    late = threading.Thread(target=short_lived, name="short-lived")
    try:
        while time.monotonic() < end:
            main_work()
            recent.append(build_rows(2000))  # on the thread that runs most: every traced burst sees it
            truth["rows"] += 2000  # type: ignore[operator]
            if "batch_bytes" not in truth:
                truth["batch_bytes"] = batch_bytes(recent[-1])
            _clock("MainThread")
            now = time.monotonic()
            if not late.ident and now - start > 5.0:
                late.start()
            if args.truth and now >= next_write:
                write_truth(args.truth, start)
                next_write = now + 1.0
    except KeyboardInterrupt:
        pass
    stop.set()
    a.close()
    if args.truth:
        write_truth(args.truth, start)


if __name__ == "__main__":
    main()
