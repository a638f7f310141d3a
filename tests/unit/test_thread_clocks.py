"""Thread CPU clocks and names as the threads and timing collectors read them (issue 30's planted defects).

Real threads in this process, no subprocess: the collectors read this
process's own clocks. Bounds are in CPU seconds the threads measured
themselves, so a busy machine (which slows them, not their clocks) does not
move them.
"""

from __future__ import annotations

import threading
import time

from dyper.proflets.base import ReportView
from dyper.proflets.threads.analyzer import ThreadsAnalyzer
from dyper.proflets.threads.collector import ThreadClocks, ThreadNames


def _burn(cpu_s: float) -> float:
    """Spin until this thread has used ``cpu_s`` more CPU seconds; returns its CPU clock then."""
    end = time.thread_time() + cpu_s
    n = 0
    while time.thread_time() < end:
        n += 1
    return time.thread_time()


def test_the_thread_that_built_the_clocks_is_measured_too() -> None:
    # The collectors are built on the thread that starts the agent, often the
    # application's main thread: it was once left out as "the agent's own".
    clocks = ThreadClocks()
    start = time.thread_time()
    _burn(0.2)
    mine = clocks.read().get(threading.get_ident())
    assert mine is not None, "the caller's thread is not measured"
    assert mine[1] >= 0.15, mine  # it used 0.2 s; never read, it was 0.0
    assert mine[1] <= time.thread_time() - start + 0.05


def test_a_thread_that_ends_between_reads_keeps_the_cpu_it_used_after_the_last_one() -> None:
    go, truth = threading.Event(), {}

    def worker() -> None:
        truth["before"] = _burn(0.05)
        go.wait(10)
        truth["end"] = _burn(0.3)  # after the first read, then it ends

    clocks = ThreadClocks()
    t = threading.Thread(target=worker, name="short-lived")
    t.start()
    while "before" not in truth:
        time.sleep(0.01)
    first = clocks.read()[t.ident or 0][1]
    go.set()
    t.join(10)
    last = clocks.read()
    assert t.ident in last, "an ended thread's last figure is not given"
    used = last[t.ident or 0][1]
    # Its own clock says how much it used in all (from 0: it started after the clocks)
    assert abs(used - truth["end"]) <= 0.1, (first, used, truth)
    assert t.ident not in clocks.read()  # said once


def test_names_of_threads_that_ended_are_said_once() -> None:
    names, done = ThreadNames(), threading.Event()
    t = threading.Thread(target=lambda: done.wait(10), name="brief")
    t.start()
    names.look()  # as after a batch of samples
    done.set()
    t.join()
    ident = t.ident
    assert [ident, "brief"] in names.ended()
    assert all(i != ident for i, _ in names.ended())


def test_a_stand_in_name_never_replaces_a_known_one() -> None:
    analyzer = ThreadsAnalyzer()
    kinds = {7: {"run": 10}}
    analyzer.merge(ReportView(t=1.0, window_s=1.0, samples=10, data=None, kinds=kinds, threads={7: "worker"}))
    analyzer.merge(ReportView(t=2.0, window_s=1.0, samples=10, data=None, kinds=kinds, threads={7: "thread-7"}))
    assert [r["name"] for r in analyzer.results()["threads"]] == ["worker"]
    # one the agent never named, named by the collector after it ended
    fresh = ThreadsAnalyzer()
    data = {"threads": [[8, 0, 0.5]], "names": [[8, "brief"]]}
    fresh.merge(ReportView(t=1.0, window_s=1.0, samples=10, data=data, kinds={8: {"run": 10}}, threads={8: "thread-8"}))
    assert [r["name"] for r in fresh.results()["threads"]] == ["brief"]


def test_time_in_the_run_queue_is_not_called_the_gil() -> None:
    # One thread, always runnable, on the CPU 30% of the second; the bursts
    # measured it in the kernel's run queue 70% of theirs: the machine is
    # short of processors, and no other thread holds the GIL.
    analyzer = ThreadsAnalyzer()
    data = {"threads": [[1, 0, 0.3]]}
    analyzer.merge(ReportView(t=1.0, window_s=1.0, samples=100, data=data, kinds={1: {"run": 100}}, threads={1: "m"}))
    analyzer.merge_detail({"length_s": 1.0, "threads": [[1, 300_000_000, 700_000_000, 0, 50]]})
    [row] = analyzer.results()["threads"]
    assert row["gil_pct"] is not None and row["gil_pct"] < 5.0, row
    assert not any("GIL" in f for f in analyzer.findings())


def test_a_thread_that_lived_only_between_two_reads_gets_the_cpu_it_used() -> None:
    used = {}

    def worker() -> None:
        used["end"] = _burn(0.3)

    clocks, names = ThreadClocks(), ThreadNames()
    clocks.read()
    t = threading.Thread(target=worker, name="brief")
    t.start()
    while t.ident is None:
        time.sleep(0.001)
    names.look()  # a batch of samples saw it
    t.join(10)
    ended = names.ended()
    assert [t.ident, "brief"] in ended
    got = clocks.read(int(i) for i, _ in ended)
    assert abs(got[t.ident or 0][1] - used["end"]) <= 0.1, (got, used)


def test_threads_that_end_together_share_what_is_left_by_what_they_ran() -> None:
    # As at a program's end: a spinner and a sleeper end between the same two
    # reads. Split evenly, the sleeper got half of the spinner's last CPU
    # (io-mix's sleeper and writer: 0.4 s each for 0.03 s).
    go, used = threading.Event(), {}

    def spinner() -> None:
        while not go.is_set():
            _burn(0.01)
        used["spinner"] = _burn(0.3)

    def sleeper() -> None:
        while not go.is_set():
            time.sleep(0.005)
        used["sleeper"] = time.thread_time()

    clocks = ThreadClocks()
    threads = [threading.Thread(target=spinner), threading.Thread(target=sleeper)]
    for t in threads:
        t.start()
    for _ in range(2):  # the second read sees what each ran since the first
        time.sleep(0.2)
        clocks.read()
    go.set()
    for t in threads:
        t.join(10)
    last = clocks.read()
    spin, doze = (last[t.ident or 0][1] for t in threads)
    assert abs(spin - used["spinner"]) <= 0.1, (spin, doze, used)
    assert doze <= used["sleeper"] + 0.05, (spin, doze, used)
