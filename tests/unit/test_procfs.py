"""agent.procfs: /proc reads for collector hooks, with the GIL kept where the C extension is built."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from dyper.agent import procfs
from dyper.proflets.threads.collector import SchedCounters, _schedstat


def _os_read(path: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


@pytest.fixture
def long_switch_interval() -> Iterator[None]:
    # With a switch interval this long, another thread gets the GIL only when
    # this one lets it go of its own accord (a system call that releases it).
    before = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _other_thread_runs(read: Callable[[str, int], bytes], seconds: float = 0.05) -> int:
    """How often a thread waiting for the GIL got it while this one read /proc for ``seconds``."""
    stop = threading.Event()
    woke = [0]

    def waiter() -> None:
        while not stop.is_set():
            time.sleep(0.0002)  # sleeps without the GIL, then wants it back
            woke[0] += 1

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    time.sleep(0.01)  # it is sleeping or waiting for the GIL from here on
    before = woke[0]
    end = time.perf_counter() + seconds  # perf_counter keeps the GIL
    reads = 0
    while time.perf_counter() < end:
        read(f"/proc/self/task/{threading.get_native_id()}/schedstat", 4096)
        reads += 1
    ran = woke[0] - before
    stop.set()
    t.join()
    assert reads > 10
    return ran


@pytest.mark.skipif(not procfs.HOLDS_GIL, reason="the C extension is not built for this interpreter")
def test_reads_keep_the_gil(long_switch_interval: None) -> None:
    # The same measure sees the os fallback let the other thread in: it can fail.
    assert _other_thread_runs(_os_read) > 0
    assert _other_thread_runs(procfs.read) == 0


def test_read_gives_the_file_and_its_errors() -> None:
    statm = procfs.read("/proc/self/statm")
    assert len(statm.split()) == 7 and int(statm.split()[1]) > 0
    assert len(procfs.read("/proc/self/status", 16)) == 16
    # Files that do not change while the process runs: status's counters do (CI saw
    # a context switch land between the two reads).
    for path in ("/proc/self/limits", "/proc/self/cmdline"):
        assert procfs.read(path, 65536) == _os_read(path, 65536)
    assert len(procfs.read("/proc/self/limits", 65536)) > 1000
    with pytest.raises(FileNotFoundError):
        procfs.read("/proc/self/task/0/schedstat")


@pytest.mark.skipif(not procfs.HOLDS_GIL, reason="the C extension is not built for this interpreter")
def test_only_proc_files_are_read_with_the_gil() -> None:
    with pytest.raises(ValueError, match="only /proc"):
        procfs.read("/etc/hostname")
    with pytest.raises(ValueError, match="limit"):
        procfs.read("/proc/self/statm", 0)


def test_sched_counters_of_a_busy_thread_grow() -> None:
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(range(1000))

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    try:
        assert _schedstat(t.native_id or 0) is not None
        counters = SchedCounters()
        counters.start()
        time.sleep(0.2)
        length, grown = counters.stop()
    finally:
        stop.set()
        t.join()
    assert length >= 0.2
    on_cpu_ns, _, voluntary, involuntary = grown[t.ident or 0]
    assert on_cpu_ns > 10_000_000  # it ran for most of the 0.2 s (at least 10 ms of it)
    assert voluntary + involuntary > 0  # switched out at least once in 0.2 s


def test_the_main_thread_is_the_one_whose_kernel_id_is_the_process_s() -> None:
    assert procfs.main_ident() == threading.main_thread().ident
    assert procfs.app_threads(0)[threading.main_thread().ident] == os.getpid()


@pytest.mark.skipif(procfs._thread_ids is None, reason="the C extension is not built for this interpreter")
def test_the_thread_states_give_every_python_thread_with_its_kernel_id() -> None:
    ready, stop = threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def run() -> None:
        seen["ident"], seen["native"] = threading.get_ident(), threading.get_native_id()
        ready.set()
        stop.wait()

    t = threading.Thread(target=run)
    t.start()
    try:
        ready.wait(5)
        ids = dict(procfs._thread_ids())  # type: ignore[misc]
        assert ids[threading.get_ident()] == threading.get_native_id()
        assert ids[seen["ident"]] == seen["native"]
    finally:
        stop.set()
        t.join()
