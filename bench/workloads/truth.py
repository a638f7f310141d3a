"""Ground-truth programs for bench/compare.py: each one records where its own CPU time went.

    python bench/workloads/truth.py PROGRAM (--rounds N | --seconds S) OUT

PROGRAM is one of flat, deep, spread, recursion, threads, native, and issue
29's multi-threaded io-mix, deep8, native-mix and gc-alloc (see PROGRAMS).
Every function whose share is judged does its own work in one timed block:
the thread's CPU clock read before and after, the difference added to that
function's truth, and its call counted (gc-alloc's callback, whose body is
pass, has a truth of zero). The blocks are 0.1 to
a few milliseconds long, so the two clock reads (under a microsecond each)
are under 1% of what they time; the glue between blocks (loops, calls) is
not in the truth. A C call that releases the GIL (zlib, hashlib) is timed
the same way and belongs to the function that makes it, as a sampler that
shows Python frames only would charge it.

The work is a fixed number of rounds (``--rounds``, in each working thread
of the threaded programs: for timing a tool's slowdown) or as many as fit in
``--seconds`` (for calibrating rounds, and for runs of growing length that
show how soon a tool's answer settles). OUT gets:

    {"program", "rounds", "wall_s", "cpu_s", "truth_s": {name: s}, "calls": {name: n}}

wall_s and cpu_s cover the work only (not start-up, not a tool's own
start-up). Truth is CPU time: a sleeping or blocked thread's functions have
almost none, and a tool that counts idle time as time is wrong about them.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import tempfile
import threading
import time
import zlib
from collections.abc import Callable

clock = time.thread_time
#: Each thread's own truth (seconds) and call counts, by thread id, added up at the end.
#: No lock between threads: one shared lock made the threaded programs take turns
#: through it (io-mix's spinners waited on it half of the time, and a tool's pauses
#: moved the split between them from run to run), which is not the program described.
_TABLES: dict[int, tuple[dict[str, float], dict[str, int]]] = {}


def _tables() -> tuple[dict[str, float], dict[str, int]]:
    """This thread's tables (a thread id reused after its thread ended adds to the same)."""
    mine = _TABLES.get(threading.get_ident())
    if mine is None:
        mine = _TABLES.setdefault(threading.get_ident(), ({}, {}))  # one call: atomic under the GIL
    return mine


def record(name: str, t0: float) -> None:
    """Add the CPU time since t0 to name's truth and count a call, in this thread's tables."""
    spent = clock() - t0
    truth, calls = _tables()
    truth[name] = truth.get(name, 0.0) + spent
    calls[name] = calls.get(name, 0) + 1


def totals() -> tuple[dict[str, float], dict[str, int]]:
    """Every thread's truth and calls added up (after the work: no thread records meanwhile)."""
    truth: dict[str, float] = {}
    calls: dict[str, int] = {}
    for t, c in list(_TABLES.values()):
        for name, v in t.items():
            truth[name] = truth.get(name, 0.0) + v
        for name, n in c.items():
            calls[name] = calls.get(name, 0) + n
    return truth, calls


class Pace:
    """Whether another round may start: a count of rounds, a deadline (perf_counter), or both."""

    def __init__(self, rounds: int | None, deadline: float | None) -> None:
        self.rounds, self.deadline, self.done = rounds, deadline, 0
        self._lock = threading.Lock()

    def _open(self) -> bool:
        if self.rounds is not None and self.done >= self.rounds:
            return False
        return self.deadline is None or time.perf_counter() < self.deadline

    def next(self) -> bool:
        """Start a round if one may start."""
        with self._lock:
            if not self._open():
                return False
            self.done += 1
            return True

    def running(self) -> bool:
        """Whether rounds may still be started."""
        with self._lock:
            return self._open()

    def fork(self) -> Pace:
        """A pace of its own for one thread: the same count of rounds, the same deadline."""
        return Pace(self.rounds, self.deadline)


# --- flat: six functions side by side, no callees -------------------------------------


def parse_header(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("parse_header", t0)
    return x


def validate(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i ^ 5
    record("validate", t0)
    return x


def transform(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * 3 % 11
    record("transform", t0)
    return x


def score(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i % 7
    record("score", t0)
    return x


def render(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i + 1
    record("render", t0)
    return x


def audit(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x -= i
    record("audit", t0)
    return x


def flat(pace: Pace) -> None:
    while pace.next():
        parse_header(9000)
        validate(6600)
        transform(4800)
        score(3600)
        render(3300)
        audit(2700)


# --- deep: a chain twelve calls deep, each level with some work of its own ----------


def level01(n: int) -> int:
    t0 = clock()
    x = sum(range(200 * n))
    record("level01", t0)
    return x + level02(n)


def level02(n: int) -> int:
    t0 = clock()
    x = sum(range(200 * n))
    record("level02", t0)
    return x + level03(n)


def level03(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(300 * n):
        x += i
    record("level03", t0)
    return x + level04(n)


def level04(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(300 * n):
        x += i
    record("level04", t0)
    return x + level05(n)


def level05(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(400 * n):
        x += i
    record("level05", t0)
    return x + level06(n)


def level06(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(500 * n):
        x += i
    record("level06", t0)
    return x + level07(n)


def level07(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(600 * n):
        x += i
    record("level07", t0)
    return x + level08(n)


def level08(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(800 * n):
        x += i
    record("level08", t0)
    return x + level09(n)


def level09(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(1000 * n):
        x += i
    record("level09", t0)
    return x + level10(n)


def level10(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(1300 * n):
        x += i
    record("level10", t0)
    return x + level11(n)


def level11(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(1700 * n):
        x += i
    record("level11", t0)
    return x + level12(n)


def level12(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(3000 * n):
        x += i * i
    record("level12", t0)
    return x


def deep(pace: Pace) -> None:
    while pace.next():
        level01(3)


# --- spread: one function called from eight places, each caller with its own work ---


def lookup(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("lookup", t0)
    return x


# Each caller's work is written out in it: a shared helper would take the samples.


def route_a() -> int:
    t0 = clock()
    x = 0
    for i in range(4000):
        x += i
    record("route_a", t0)
    for _ in range(3):
        x += lookup(600)
    return x


def route_b() -> int:
    t0 = clock()
    x = 0
    for i in range(3200):
        x += i
    record("route_b", t0)
    for _ in range(4):
        x += lookup(600)
    return x


def route_c() -> int:
    t0 = clock()
    x = 0
    for i in range(2600):
        x += i
    record("route_c", t0)
    for _ in range(2):
        x += lookup(600)
    return x


def route_d() -> int:
    t0 = clock()
    x = 0
    for i in range(2200):
        x += i
    record("route_d", t0)
    for _ in range(5):
        x += lookup(600)
    return x


def route_e() -> int:
    t0 = clock()
    x = 0
    for i in range(1800):
        x += i
    record("route_e", t0)
    for _ in range(2):
        x += lookup(600)
    return x


def route_f() -> int:
    t0 = clock()
    x = 0
    for i in range(1400):
        x += i
    record("route_f", t0)
    for _ in range(3):
        x += lookup(600)
    return x


def route_g() -> int:
    t0 = clock()
    x = 0
    for i in range(1100):
        x += i
    record("route_g", t0)
    for _ in range(4):
        x += lookup(600)
    return x


def route_h() -> int:
    t0 = clock()
    x = 0
    for i in range(800):
        x += i
    record("route_h", t0)
    for _ in range(2):
        x += lookup(600)
    return x


def spread(pace: Pace) -> None:
    while pace.next():
        for route in (route_a, route_b, route_c, route_d, route_e, route_f, route_g, route_h):
            route()


# --- recursion: a tree walk, mutual recursion, and two plain functions --------------


def walk(depth: int) -> int:
    t0 = clock()
    x = 0
    for i in range(900):
        x += i
    record("walk", t0)
    if depth == 0:
        return x + leaf_cost(700)
    return x + walk(depth - 1) + walk(depth - 1)


def leaf_cost(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("leaf_cost", t0)
    return x


def is_even(n: int) -> bool:
    t0 = clock()
    x = 0
    for i in range(700):
        x += i
    record("is_even", t0)
    return True if n == 0 else is_odd(n - 1)


def is_odd(n: int) -> bool:
    t0 = clock()
    x = 0
    for i in range(500):
        x += i
    record("is_odd", t0)
    return False if n == 0 else is_even(n - 1)


def tally(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i ^ 3
    record("tally", t0)
    return x


def recursion(pace: Pace) -> None:
    while pace.next():
        walk(5)
        is_even(24)
        tally(12000)


# --- threads: three threads on the CPU (one holding a lock), a sleeper, a waiter -----

_held = threading.Lock()


def crunch(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("crunch", t0)
    return x


def digest_rows(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i % 13
    record("digest_rows", t0)
    return x


def guarded_update(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i
    record("guarded_update", t0)
    return x


def nap() -> None:
    t0 = clock()
    time.sleep(0.005)
    record("nap", t0)


def wait_for_lock() -> None:
    t0 = clock()
    with _held:
        pass
    record("wait_for_lock", t0)


def threads(pace: Pace) -> None:
    """Three CPU threads with a round count (or the deadline) each, a sleeper and a waiter.

    The guarded thread holds the lock through its work and, once done, until
    the end: the waiter is blocked nearly all the time and never spins.
    """
    stop = threading.Event()
    paces = [pace.fork() for _ in range(3)]

    def cpu(fn: Callable[[int], int], n: int, mine: Pace) -> None:
        while mine.next():
            fn(n)

    def guarded(mine: Pace) -> None:
        with _held:
            cpu(guarded_update, 10000, mine)
            stop.wait()

    def idle(fn: Callable[[], None]) -> None:
        fn()  # at least once, however short the run: its function is in the truth
        while not stop.is_set():
            fn()

    workers = [
        threading.Thread(target=cpu, args=(crunch, 12000, paces[0]), name="crunch"),
        threading.Thread(target=cpu, args=(digest_rows, 8000, paces[1]), name="digest"),
    ]
    holder = threading.Thread(target=guarded, args=(paces[2],), name="guarded")
    holder.start()
    sidekicks = [
        threading.Thread(target=idle, args=(nap,), name="napper"),
        threading.Thread(target=idle, args=(wait_for_lock,), name="waiter"),
    ]
    for t in workers + sidekicks:
        t.start()
    for t in workers:
        t.join()
    while paces[2].running():
        time.sleep(0.001)
    stop.set()
    for t in [holder, *sidekicks]:
        t.join()
    pace.done = max(p.done for p in paces)  # rounds count per thread


# --- native: C calls that release the GIL, beside Python work -----------------------

_BLOCK = bytes(range(256)) * 1024  # 256 kB, compressible
_BIG = _BLOCK * 4  # 1 MB


def compress_block() -> int:
    t0 = clock()
    out = zlib.compress(_BLOCK, 6)  # releases the GIL while it compresses
    record("compress_block", t0)
    return len(out)


def checksum() -> int:
    t0 = clock()
    out = hashlib.sha256(_BIG).digest()  # releases the GIL for data this large
    record("checksum", t0)
    return len(out)


def tokenize(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * 7 % 5
    record("tokenize", t0)
    return x


def summarize(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i
    record("summarize", t0)
    return x


def encode_rows(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x ^= i * 31
    record("encode_rows", t0)
    return x


def native(pace: Pace) -> None:
    side_pace = pace.fork()

    def side() -> None:
        while side_pace.next():
            compress_block()
            checksum()
            encode_rows(6000)

    helper = threading.Thread(target=side, name="compressor")
    helper.start()
    while pace.next():
        tokenize(20000)
        summarize(12000)
    helper.join()


# --- io-mix: two CPU threads, a thread writing a file, a sleeper ----------------------
#
# The file writer's writes are unbuffered (one system call each, the GIL released
# around it): with two CPU threads beside it, it spends most of its time waiting to
# take the GIL back, which is no CPU time. So does the sleeper.


def spin_a(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("spin_a", t0)
    return x


def spin_b(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i % 7
    record("spin_b", t0)
    return x


_CHUNK = b"x" * 4096


def write_chunks(fd: int, n: int) -> None:
    t0 = clock()
    for _ in range(n):
        os.write(fd, _CHUNK)
    os.lseek(fd, 0, os.SEEK_SET)  # the file stays small: rewritten from the start every call
    record("write_chunks", t0)


def doze() -> None:
    t0 = clock()
    time.sleep(0.005)
    record("doze", t0)


def io_mix(pace: Pace) -> None:
    """Two CPU threads with a round count (or the deadline) each; the writer and the sleeper until they end."""
    stop = threading.Event()
    paces = [pace.fork() for _ in range(2)]

    def cpu(fn: Callable[[int], int], n: int, mine: Pace) -> None:
        while mine.next():
            fn(n)

    def writer() -> None:
        fd, path = tempfile.mkstemp(prefix="truth-io-")
        try:
            write_chunks(fd, 8)  # at least once, however short the run
            while not stop.is_set():
                write_chunks(fd, 8)
        finally:
            os.close(fd)
            os.unlink(path)

    def sleeper() -> None:
        doze()
        while not stop.is_set():
            doze()

    workers = [
        threading.Thread(target=cpu, args=(spin_a, 12000, paces[0]), name="spin-a"),
        threading.Thread(target=cpu, args=(spin_b, 9000, paces[1]), name="spin-b"),
    ]
    sidekicks = [threading.Thread(target=writer, name="writer"), threading.Thread(target=sleeper, name="sleeper")]
    for t in workers + sidekicks:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    for t in sidekicks:
        t.join()
    pace.done = max(p.done for p in paces)  # rounds count per thread


# --- deep8: eight threads, each 30 frames deep, each ending in a leaf of its own ------
#
# Leaf k does k units of work a round, so with every thread doing as many rounds the
# leaves' true shares are k/36: 2.8% to 22.2%. The frames above them only call.

DEEP8_DEPTH = 30
DEEP8_UNIT = 3000


def leaf1(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("leaf1", t0)
    return x


def leaf2(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("leaf2", t0)
    return x


def leaf3(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("leaf3", t0)
    return x


def leaf4(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("leaf4", t0)
    return x


def leaf5(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("leaf5", t0)
    return x


def leaf6(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("leaf6", t0)
    return x


def leaf7(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("leaf7", t0)
    return x


def leaf8(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * i
    record("leaf8", t0)
    return x


def descend(depth: int, leaf: Callable[[int], int], n: int) -> int:
    """depth frames of this function, then the leaf: the leaf runs depth + 1 frames below the thread's start."""
    if depth <= 1:
        return leaf(n)
    return descend(depth - 1, leaf, n)


def deep8(pace: Pace) -> None:
    leaves = (leaf1, leaf2, leaf3, leaf4, leaf5, leaf6, leaf7, leaf8)
    paces = [pace.fork() for _ in leaves]

    def worker(k: int, mine: Pace) -> None:
        while mine.next():
            # the thread's run and the worker are two frames: 28 of descend, the leaf the 31st
            descend(DEEP8_DEPTH - 2, leaves[k - 1], k * DEEP8_UNIT)

    threads = [threading.Thread(target=worker, args=(k, p), name=f"deep-{k}") for k, p in enumerate(paces, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # rounds of all eight: leaf k's thread does k units a round (on a deadline the short leaves do more rounds)
    pace.done = round(sum(k * p.done for k, p in enumerate(paces, 1)) / sum(range(1, len(leaves) + 1)))


# --- native-mix: one thread: Python work, sorted() (holds the GIL), zlib and hashlib --
# (release it)

_RNG = random.Random(29)
_FLOATS = [_RNG.random() for _ in range(20_000)]
_HALF_MB = _BLOCK * 2
_TWO_MB = _BIG * 2


def py_work(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i * 5 % 3
    record("py_work", t0)
    return x


def sort_floats() -> float:
    t0 = clock()
    out = sorted(_FLOATS)  # C code holding the GIL throughout
    record("sort_floats", t0)
    return out[0]


def deflate() -> int:
    t0 = clock()
    out = zlib.compress(_HALF_MB, 6)  # releases the GIL while it compresses
    record("deflate", t0)
    return len(out)


def digest() -> int:
    t0 = clock()
    out = hashlib.sha256(_TWO_MB).digest()  # releases the GIL for data this large
    record("digest", t0)
    return len(out)


def native_mix(pace: Pace) -> None:
    while pace.next():
        py_work(60000)
        sort_floats()
        deflate()
        digest()


# --- gc-alloc: an allocation-heavy loop; a gc.callbacks callback that does nothing ----
#
# The collections run inside the allocating function (C code holding the GIL) and
# are its time. The callback's body is pass: its truth is zero, and its calls are
# two per collection (start and stop), counted from gc.get_stats().

_KEEP: list[object] = []  # long-lived objects: the older generations' collections have them to walk


def build_records(n: int) -> int:
    t0 = clock()
    rows = []
    for i in range(n):  # a loop, not a comprehension: 3.11 gives a comprehension a frame of its own
        rows.append({"id": i, "tags": [i, i + 1], "pair": (i, str(i))})
    record("build_records", t0)
    return len(rows)


def sum_fields(n: int) -> int:
    t0 = clock()
    x = 0
    for i in range(n):
        x += i & 0xFF
    record("sum_fields", t0)
    return x


def on_gc(phase: str, info: dict[str, int]) -> None:
    pass


def gc_alloc(pace: Pace) -> None:
    for i in range(100_000):
        _KEEP.append([i, {"k": i}])
    collections0 = sum(g["collections"] for g in gc.get_stats())
    gc.callbacks.append(on_gc)
    try:
        while pace.next():
            build_records(3000)
            sum_fields(20000)
    finally:
        gc.callbacks.remove(on_gc)
    collections = sum(g["collections"] for g in gc.get_stats()) - collections0
    truth, calls = _tables()
    truth["on_gc"] = 0.0
    calls["on_gc"] = 2 * collections


PROGRAMS: dict[str, Callable[[Pace], None]] = {
    "flat": flat,
    "deep": deep,
    "spread": spread,
    "recursion": recursion,
    "threads": threads,
    "native": native,
    "io-mix": io_mix,
    "deep8": deep8,
    "native-mix": native_mix,
    "gc-alloc": gc_alloc,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("program", choices=sorted(PROGRAMS))
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--rounds", type=int)
    group.add_argument("--seconds", type=float)
    ap.add_argument("out")
    args = ap.parse_args()
    pace = Pace(args.rounds, None if args.seconds is None else time.perf_counter() + args.seconds)
    w0, c0 = time.perf_counter(), time.process_time()
    PROGRAMS[args.program](pace)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    truth, calls = totals()
    with open(args.out, "w") as f:
        json.dump(
            {
                "program": args.program,
                "rounds": pace.done,
                "wall_s": wall,
                "cpu_s": cpu,
                "truth_s": truth,
                "calls": calls,
            },
            f,
        )


if __name__ == "__main__":
    main()
