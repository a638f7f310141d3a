"""The memory collectors in this process: real collections, real tracemalloc, no agent.

The GC table charges each collection to the line that triggered it; a burst
traces allocations and leaves tracemalloc as it found it, whatever happens.
"""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from dyper.agent.proflet import DetailContext
from dyper.proflets.memory import collector as memory
from dyper.proflets.memory.collector import GcWatch, MemoryCollector
from dyper.proflets.memory.common import UNWATCHED
from dyper.proflets.memory_stacks.collector import StacksCollector

CTX = DetailContext(candidates=[], length_s=0.5)


@pytest.fixture
def watch() -> Iterator[GcWatch]:
    w = GcWatch()
    try:
        yield w
    finally:
        w.close()
    assert w._callback not in gc.callbacks


def _rows(data: dict[str, Any]) -> dict[tuple[str, int, str], list[float]]:
    return {(r[0], r[1], r[2]): r[3:] for r in data["sites"]}


def forcing(n: int) -> int:
    for _ in range(n):
        gc.collect()  # the forced line
    return forcing.__code__.co_firstlineno + 2


def churning(n: int) -> list[list[int]]:
    kept = []
    for i in range(n):
        kept.append([i])
    return kept


def test_forced_collections_are_charged_to_the_calling_line(watch):
    line = forcing(3)
    data = watch.read()
    row = _rows(data)[(__file__, line, "forcing")]
    assert row[:3] == [0, 0, 3]
    assert row[3] > 0
    assert data["gc"][2][0] >= 3  # gc.get_stats agrees
    assert data["pause_s"] >= row[3]
    assert data["callbacks"] >= 3 and data["callback_s"] == pytest.approx(data["callbacks"] * watch.callback_cost_s)
    # Sent once: the next report carries only what changed.
    assert (__file__, line, "forcing") not in _rows(watch.read())


def test_young_collections_are_charged_to_the_allocating_function(watch):
    gc.collect()
    churning(20_000)  # past the young threshold (700 on 3.11 and 3.12, 2000 on 3.13) several times
    young = {site: row[0] for site, row in _rows(watch.read()).items() if site[0] == __file__}
    assert young, "no young collection charged to this file"
    assert max(young, key=lambda s: young[s])[2] == "churning", young


def test_collections_in_dyper_code_are_dyper_s(watch):
    memory._young_collections(3)  # gc.collect(0) from proflets/
    rows = _rows(watch.read())
    assert rows[("", 0, memory.DYPER)][0] >= 3
    assert not any(site[0].startswith(memory.OWN_DIRS) for site in rows)


def test_the_gc_table_is_bounded(watch, monkeypatch):
    monkeypatch.setattr(memory, "MAX_GC_SITES", 2)
    for i in range(3):
        exec(compile("import gc\n" * (i + 1) + "gc.collect(0)\n", f"<site {i}>", "exec"))
    forcing(1)
    rows = _rows(watch.read())
    assert len(watch._sites) <= 3  # two sites and the row they all share past the bound
    assert rows[("", 0, memory.OTHER)][0] >= 1


def _run_watched(watch: GcWatch, budget: float, seconds: float, rest_s: float = 0.0) -> list[int]:
    """Collect young generations for ``seconds`` while the agent's passes pace the watch; collections made."""
    before = memory._collections()
    clock = time.perf_counter
    next_pass = clock()
    end = next_pass + seconds
    while clock() < end:
        if clock() >= next_pass:
            next_pass = clock() + watch.pace(budget)
        memory_churn()
        if rest_s:
            time.sleep(rest_s)
    return [a - b for a, b in zip(memory._collections(), before, strict=True)]


def memory_churn() -> None:
    for _ in range(20):
        gc.collect(0)  # the churning line


def test_a_watch_too_dear_for_the_budget_watches_part_of_the_time_and_extrapolates(watch):
    # About 15,000 young collections a second (20, then a rest of a millisecond):
    # watched all along, the callback would cost several percent, against the
    # quarter of 1% it may. After its first watch (a tenth of a second, to
    # measure), it watches a few percent of each second.
    made = _run_watched(watch, budget=0.01, seconds=1.0, rest_s=0.001)
    callbacks0, watched0 = watch.read()["callbacks"], watch.watched_s()
    more = _run_watched(watch, budget=0.01, seconds=3.0, rest_s=0.001)
    data = watch.read()
    # Idle, the duty is a few percent; a busy machine sleeps longer between the
    # bursts, so collections are fewer and the duty higher. Watching all along
    # (the regression) is a duty of 1; the cost bound below is the guarantee.
    assert 0 < watch.duty < 0.6, watch.duty
    assert 0.01 * 3.0 < data["watched_s"] - watched0 < 0.7 * 3.0, data["watched_s"]
    cost_rate = (data["callbacks"] - callbacks0) * watch.callback_cost_s / 3.0
    assert cost_rate < 2 * memory.BASIC_SHARE * 0.01, (cost_rate, data["callbacks"])
    # What it saw is scaled to every collection gc.get_stats counted: the line
    # that collects has about all of them, though few were watched.
    made = [a + b for a, b in zip(made, more, strict=True)]
    line = memory_churn.__code__.co_firstlineno + 2
    rows = _rows(data)
    churn = rows[(__file__, line, "memory_churn")]
    assert data["callbacks"] < 0.8 * made[0]  # watching every collection (the regression) sees them all
    # A cycle whose watched part saw none of them (a loaded machine sleeps
    # through a short watch) files its collections as not watched rather than
    # guess their site: together they are all of them, and the line holds what
    # the watched cycles scaled up, more than the callback saw (unscaled, the
    # regression, it would hold only what was seen).
    unwatched = rows.get(("", 0, UNWATCHED), [0, 0, 0, 0.0])
    assert churn[0] + unwatched[0] == pytest.approx(made[0], rel=0.1), (churn, unwatched, made)
    assert churn[0] > data["callbacks"], (churn, data["callbacks"], made)
    assert churn[3] > 0 and data["pause_s"] >= churn[3]


def test_a_watch_within_the_budget_watches_all_the_time_and_counts_exactly(watch):
    # About a thousand young collections a second, at 1%: a few tenths of a percent
    # (20 collections, then a rest of 20 ms), within a quarter of 10%.
    made = _run_watched(watch, budget=0.1, seconds=1.5, rest_s=0.02)
    data = watch.read()
    assert watch.duty == 1.0 and watch.watching
    assert data["watched_s"] >= 1.4
    line = memory_churn.__code__.co_firstlineno + 2
    churn = _rows(data)[(__file__, line, "memory_churn")]
    assert isinstance(churn[0], int) and made[0] - 2 <= churn[0] <= made[0], (churn, made)


def test_a_watch_cuts_its_duty_at_once_when_collections_grow(watch):
    # A quiet first watch (start-up) must not leave it watching all of the next
    # cycles while an average climbs: the next pass sees the dearer rate whole.
    _run_watched(watch, budget=0.01, seconds=0.3, rest_s=0.05)  # a few collections a second
    assert watch.duty == 1.0
    watch._on_since -= 1.0  # as if the cycle were over: the next pass measures now
    watch._callbacks_at = int(watch._state[2])
    # 6,000 young collections in well under a second on an idle machine; on a busy
    # one, churn on until the watch's cost rate is dear enough that its duty must drop.
    dear = 2 * memory.BASIC_SHARE * 0.01
    deadline = time.perf_counter() + 10.0
    rate = 0.0
    while rate <= dear and time.perf_counter() < deadline:
        for _ in range(300):
            memory_churn()
        seen = int(watch._state[2]) - watch._callbacks_at
        rate = seen * watch.callback_cost_s / (time.perf_counter() - watch._on_since)
    assert rate > dear
    watch.pace(0.01)
    assert watch.duty == pytest.approx(memory.BASIC_SHARE * 0.01 / rate, rel=0.05), (watch.duty, rate)


def test_a_suspended_watch_sees_nothing_and_counts_the_collections_it_missed_as_not_watched(watch):
    forcing(1)
    watch.suspend()
    assert not watch.watching and watch._callback not in gc.callbacks
    watched = watch.watched_s()
    before = watch.read()
    for _ in range(5):
        gc.collect(0)
    after = watch.read()
    assert after["callbacks"] == before["callbacks"] and watch.watched_s() == watched
    # Counted exactly all the same, on the row of what was not watched
    assert after["gc"][0][0] - before["gc"][0][0] >= 5
    assert _rows(after)[("", 0, memory.UNWATCHED)][0] >= 5
    watch.pace(0.01)  # the next pass after the resume watches again
    assert watch.watching and watch._callback in gc.callbacks


def test_a_start_seen_before_the_watch_went_off_is_not_timed_when_it_comes_back(watch):
    # Off while a collection ran (its stop never seen), then on again much later:
    # that old start must not make a pause as long as the gap.
    watch._state[0] = memory.NO_FRAME
    watch._state[1] = time.perf_counter() - 60.0
    watch.duty = 0.5
    watch._rate = 1.0  # far past any budget: the next pass stops watching
    watch.pace(0.01)
    assert not watch.watching and watch._callback not in gc.callbacks
    watch.pace(0.01)
    assert watch.watching and watch._callback in gc.callbacks
    forcing(1)
    assert watch.read()["pause_s"] < 1.0


def allocate(n: int) -> list[str]:
    kept = []
    for i in range(n):
        kept.append(str(i) * 3)  # the allocating line
    return kept


def calls_allocate(n: int) -> list[str]:
    return allocate(n)


def _tracing(c: MemoryCollector) -> MemoryCollector:
    """The collector with tracemalloc, as where the C extension does not load."""
    c._sampler = None
    return c


def test_a_traced_burst_counts_sites_and_turns_tracemalloc_off_again():
    c = _tracing(MemoryCollector())
    try:
        c.start_detail(CTX)
        # one frame shown, two kept: an allocation a library makes for dyper is known by its caller
        assert tracemalloc.is_tracing() and tracemalloc.get_traceback_limit() == 2
        kept = allocate(20_000)
        result = c.stop_detail()
        assert not tracemalloc.is_tracing()
    finally:
        c.close()
    top = result["sites"][0]
    assert top[:3] == [__file__, allocate.__code__.co_firstlineno + 3, "allocate"]
    assert 20_000 <= top[3] <= 21_000 and top[4] >= 20_000 * 40
    assert result["length_s"] > 0 and result["nframe"] == 1 and result["factor"] > 1
    assert result["slowdown_s"] >= 0
    assert not any(row[0].startswith(memory.OWN_DIRS) for row in result["sites"])
    del kept


needs_sampler = pytest.mark.skipif(memory._sampler() is None, reason="the C extension did not build here")


@needs_sampler
def test_a_sampled_burst_counts_sites_and_takes_its_hook_out_again():
    fast = memory._sampler()
    c = MemoryCollector()
    try:
        c.start_detail(CTX)
        assert fast.alloc_state()[:3] == (1, 0, 1) and not tracemalloc.is_tracing()
        kept = allocate(100_000)
        assert c.slowdown_s() > 0  # charged while it runs: the allocations counted so far
        result = c.stop_detail()
        assert fast.alloc_state()[:3] == (0, 0, 0)  # the allocators are as they were
    finally:
        c.close()
    top = result["sites"][0]
    assert top[:3] == [__file__, allocate.__code__.co_firstlineno + 3, "allocate"]
    # Two or three allocations an iteration (str(i), times 3, the list's
    # growth), estimated from some 90 samples (a standard error of 11%).
    assert 120_000 <= top[3] <= 500_000, top
    assert top[4] >= 100_000 * 40 * 0.75, top
    sampled = result["sampled"]
    assert sampled["allocations"] >= 200_000 and sampled["samples"] > 10
    assert result["nframe"] == 1 and 1.0 <= result["factor"] < 3.0
    assert not any(row[0].startswith(memory.OWN_DIRS) for row in result["sites"])
    del kept


def three_quarters(n: int) -> list[bytearray]:
    out = []
    for _ in range(3 * n):  # not a comprehension: on 3.11 that is a function of its own
        out.append(bytearray(1000))
    return out


def one_quarter(n: int) -> list[bytearray]:
    out = []
    for _ in range(n):
        out.append(bytearray(1000))
    return out


@needs_sampler
def test_sampled_sites_share_the_bytes_as_they_were_allocated():
    c = MemoryCollector()
    try:
        c.start_detail(CTX)
        for _ in range(10):
            three_quarters(2_000)
            one_quarter(2_000)
        result = c.stop_detail()
    finally:
        c.close()
    by_function = dict.fromkeys(("three_quarters", "one_quarter"), 0.0)
    for row in result["sites"]:  # a site is a line: each function has two
        if row[2] in by_function:
            by_function[row[2]] += row[4]
    share = by_function["three_quarters"] / (by_function["three_quarters"] + by_function["one_quarter"])
    # 80 MB at a sample per 256 kB on average: some 300 samples, a standard error of 2.5 points.
    assert 0.65 <= share <= 0.85, share
    # Every byte was counted: the sites add up to what the hook saw (the bytearrays, 80 MB and more).
    assert sum(row[4] for row in result["sites"]) + result["dyper"][1] + result["other"][1] >= 80 * 1000 * 1000


def test_the_weights_stand_for_every_allocation():
    # A 1-byte allocation is sampled once in 2**18 times: it stands for that many.
    weighed = memory._weigh([(1, (("a.py", 1),)), (1 << 20, (("b.py", 2),))], float(1 << 18), 1000, 2_000_000)
    (_, n_small, b_small), (_, n_big, b_big) = weighed
    assert n_small + n_big == pytest.approx(1000) and b_small + b_big == pytest.approx(2_000_000)
    assert n_small / n_big > 1e4  # the small one stands for many more allocations
    assert memory._weigh([], 1.0, 10, 10) == []


def test_what_a_library_allocates_for_dyper_is_dyper_s():
    # Issue 30: msgpack's packb, encoding the agent's reports, was among the
    # application's allocation sites. Planted: the agent's encoder runs during
    # a burst and its messages stay alive to its end, beside the application's.
    from dyper.agent import protocol

    c = _tracing(MemoryCollector())
    try:
        c.start_detail(CTX)
        messages = [protocol.encode("bye", {"agent": f"h:1:{i}"}) for i in range(5_000)]
        kept = allocate(5_000)
        result = c.stop_detail()
    finally:
        c.close()
    files = {row[0] for row in result["sites"]}
    assert not any("msgpack" in f for f in files), files
    assert result["sites"][0][2] == "allocate"  # the application's own still show
    assert result["dyper"][0] >= 5_000  # counted as dyper's instead
    # The application's code started from a dyper frame further down is not dyper's.
    assert memory._dyper_s([(memory.OWN_DIRS[0] + "agent/x.py", 1)])
    assert memory._dyper_s([(memory.LIB_DIRS[0] + "msgpack/__init__.py", 3), (memory.OWN_DIRS[0] + "protocol.py", 1)])
    assert not memory._dyper_s([("/srv/app/main.py", 10), (memory.OWN_DIRS[0] + "bootstrap.py", 1)])
    del messages, kept


def test_the_stacks_mode_names_the_callers():
    c = StacksCollector()
    try:
        c.start_detail(CTX)
        assert tracemalloc.get_traceback_limit() == StacksCollector.NFRAME
        kept = calls_allocate(5_000)
        result = c.stop_detail()
    finally:
        c.close()
    assert not tracemalloc.is_tracing()
    top = result["sites"][0]
    assert top[2] == "allocate"
    assert top[5][0] == [__file__, calls_allocate.__code__.co_firstlineno + 1, "calls_allocate"]
    assert result["nframe"] == StacksCollector.NFRAME
    del kept


def test_the_application_s_tracing_is_left_alone():
    tracemalloc.start(3)
    try:
        before = allocate(10)
        c = MemoryCollector()  # sampling or tracing: the application's tracing comes first
        try:
            c.start_detail(CTX)
            result = c.stop_detail()
        finally:
            c.close()
        assert tracemalloc.is_tracing() and tracemalloc.get_traceback_limit() == 3
        assert tracemalloc.get_object_traceback(before[0]) is not None  # its traces kept
        assert "traces allocations itself" in result["skipped"] and result["slowdown_s"] == 0
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("how", ["sampled", "traced"])
def test_closing_in_the_middle_of_a_burst_leaves_nothing(how):
    callbacks = list(gc.callbacks)
    c = MemoryCollector() if how == "sampled" else _tracing(MemoryCollector())
    c.start_detail(CTX)
    c.close()
    assert not tracemalloc.is_tracing()
    fast = memory._sampler()
    assert fast is None or fast.alloc_state()[:3] == (0, 0, 0)
    assert gc.callbacks == callbacks


def test_a_burst_ends_early_past_the_trace_bound(monkeypatch):
    monkeypatch.setattr(memory, "MAX_TRACE_MEMORY", 64 << 10)
    c = StacksCollector()
    done = threading.Event()
    kept: list[str] = []

    def app() -> None:  # the slowdown is what threads other than the agent's lose
        kept.extend(allocate(20_000))
        done.set()

    try:
        c.start_detail(CTX)
        t = threading.Thread(target=app)
        t.start()
        done.wait(10)
        t.join()
        lost = c.slowdown_s()  # the agent's tick: over the bound, so the tracing ends here
        assert not tracemalloc.is_tracing()
        assert lost > 0
        result = c.stop_detail()
    finally:
        c.close()
    assert result["sites"] and result["slowdown_s"] == lost


@needs_sampler
def test_the_sampler_started_and_stopped_under_allocating_threads_leaves_them_unharmed():
    # The hook goes in and out of the allocators while other threads allocate
    # (each switch under the GIL, as every call into the object and memory
    # domains): no crash, no allocation lost to a thread, the hook out at the end.
    fast = memory._sampler()
    stop = threading.Event()
    made = [0] * 4

    def allocating(k: int) -> None:
        kept: list[object] = []
        while not stop.is_set():
            kept.append({"k": k, "s": str(made[k]) * 5, "t": (k, made[k])})
            if len(kept) > 1000:
                kept.clear()
            made[k] += 1

    threads = [threading.Thread(target=allocating, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    seen = dropped = 0
    try:
        for _ in range(100):
            fast.alloc_start(4096.0, 64)  # a sample every 4 kB: the samples' buffer fills and drops
            time.sleep(0.001)
            count, _, lost, samples = fast.alloc_stop()
            seen += count
            dropped += lost
            for size, frames in samples:
                assert size > 0 and all(isinstance(f, str) and isinstance(ln, int) for f, ln in frames)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert fast.alloc_state()[:3] == (0, 0, 0)
    assert seen > 0 and all(n > 0 for n in made)
    assert dropped > 0  # the bounded buffer was exercised: past it samples are counted, not kept
