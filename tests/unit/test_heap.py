"""The heap proflet on its own: the census in this process, the maximum pause, and leak suspects.

The collector runs for real here (a census of the test process's heap);
the analyzer gets its bursts as the monitor would hand them over.
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

import pytest
from rich.console import Console

from dyper.agent.proflet import DetailContext
from dyper.proflets.base import ReportView
from dyper.proflets.heap.analyzer import FOLLOW_S, LEAK_CENSUSES, TABLE_ROWS, HeapAnalyzer, growth
from dyper.proflets.heap.collector import MAX_PAUSE_MS, HeapCollector, max_pause_ms, type_name
from dyper.proflets.heap.render import terminal as heap_terminal

HERE = __name__


class Leaky:
    def __init__(self, i: int) -> None:
        self.i = i


class OwnSizeof:
    """A class whose __sizeof__ is application code: the census must never call it."""

    calls = 0

    def __sizeof__(self) -> int:
        OwnSizeof.calls += 1
        raise RuntimeError("application code ran in the census")


def _burst(collector: HeapCollector) -> dict[str, Any]:
    collector.start_detail(DetailContext([], 0.01))
    return collector.stop_detail()


def _rows(result: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {name: (count, nbytes) for name, count, nbytes in result["types"]}


def test_a_census_counts_a_class_exactly_and_sizes_it() -> None:
    kept = [Leaky(i) for i in range(3000)]
    result = _burst(HeapCollector())
    assert result["slowdown_s"] == 0.0 and result["length_s"] >= 0
    count, nbytes = _rows(result)[f"{HERE}.Leaky"]
    assert count == 3000
    # one size for every instance: the sampled mean is exact
    assert nbytes == 3000 * sys.getsizeof(kept[0])
    assert result["objects"] >= len(gc.get_objects()) // 2  # every tracked object, not a sample
    assert result["pause_ms"] > 0 and 0 < result["scan_ms"] <= result["worst_scan_ms"]
    assert result["ovhd_ms"] == pytest.approx(1.25 * result["worst_scan_ms"])
    assert "skipped" not in result


def test_no_application_sizeof_runs_and_nothing_is_kept_alive() -> None:
    OwnSizeof.calls = 0
    odd = [OwnSizeof() for _ in range(500)]
    probe = weakref.ref(odd[0])
    result = _burst(HeapCollector())
    count, nbytes = _rows(result)[f"{HERE}.OwnSizeof"]
    assert count == 500 and OwnSizeof.calls == 0
    assert nbytes >= 500 * object.__sizeof__(odd[0])  # its basic size instead
    del odd
    assert probe() is None  # the census's list of every object is gone


def test_names_are_module_and_qualname_builtins_bare() -> None:
    class Inner:
        pass

    assert type_name(Leaky) == f"{HERE}.Leaky"
    assert type_name(Inner) == f"{HERE}.test_names_are_module_and_qualname_builtins_bare.<locals>.Inner"
    assert type_name(dict) == "dict"
    assert type_name(weakref.ref) == "weakref.ReferenceType"  # a C type: its module from its tp_name


def test_the_maximum_pause_comes_from_the_environment() -> None:
    assert max_pause_ms({}) == MAX_PAUSE_MS == 200.0
    assert max_pause_ms({"DYPER_HEAP_MAX_PAUSE_MS": "50"}) == 50.0
    for bad in ("", "soon", "-3", "0", "nan", "inf"):
        assert max_pause_ms({"DYPER_HEAP_MAX_PAUSE_MS": bad}) == MAX_PAUSE_MS, bad


def test_a_census_longer_than_the_maximum_pause_is_skipped_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYPER_HEAP_MAX_PAUSE_MS", "0.01")
    collector = HeapCollector()
    result = _burst(collector)
    assert "types" not in result and result["expected_ms"] > result["max_pause_ms"] == 0.01
    assert "memory blocks" in result["skipped"]  # caught before listing a single object
    assert "maximum pause of 0.01 ms (DYPER_HEAP_MAX_PAUSE_MS)" in result["skipped"]

    analyzer = HeapAnalyzer()
    analyzer.merge_detail(result)
    out = analyzer.results()
    assert out["types"] == [] and out["censuses"] == 0 and out["skipped"] == 1
    assert out["skip_reason"].startswith("heap census skipped: expected ")
    assert any("DYPER_HEAP_MAX_PAUSE_MS" in f for f in analyzer.findings())


def test_once_listed_the_objects_decide_and_teach_the_next_estimate() -> None:
    collector = HeapCollector()
    collector.model.objects_per_block = 0.0  # the blocks say nothing: the listing must catch it
    collector.max_pause_s = 1e-6
    result = _burst(collector)
    assert "objects, more than the maximum pause" in result["skipped"]
    assert collector.model.objects_per_block > 0
    assert "memory blocks" in _burst(collector)["skipped"]  # the next one stops before listing


def test_a_census_that_fails_is_skipped_not_raised() -> None:
    class Meta(type):
        def __eq__(cls, other: object) -> bool:  # and so no __hash__: its classes are unhashable
            return cls is other

    unhashable = Meta("Unhashable", (), {})
    kept = [unhashable() for _ in range(3)]
    result = _burst(HeapCollector())
    assert "the census failed (TypeError" in result["skipped"], result
    del kept


def test_costs_declare_the_census_expected_now() -> None:
    costs = HeapCollector().costs()
    assert costs.name == "heap" and costs.slow == 0.0
    assert 1.0 <= costs.ovhd_ms < MAX_PAUSE_MS  # this process's heap is small


# --- the analyzer ---------------------------------------------------------------------


def test_growth_new_highs_in_a_row() -> None:
    leak = [(60.0 * i, 1000 + 100 * i) for i in range(8)]
    run, per_min, suspect = growth(leak)
    assert (run, per_min, suspect) == (8, pytest.approx(100.0), True)
    # one census short of LEAK_CENSUSES new highs: not yet
    short = leak[:LEAK_CENSUSES]
    assert growth(short)[0] == LEAK_CENSUSES and growth(short)[2] is False
    # ups and downs: never several new highs running
    noise = [(float(i), c) for i, c in enumerate([100, 400, 200, 300] * 5)]
    assert growth(noise)[2] is False
    # new highs by one object a time on a big count: noise, not a leak
    creep = [(float(i), 100_000 + i) for i in range(10)]
    assert growth(creep)[0] == 10 and growth(creep)[2] is False
    # a dip breaks the run; growth is then over the last censuses
    dipped = [*leak, (480.0, 1000)]
    run, per_min, suspect = growth(dipped)
    assert run == 0 and not suspect and per_min is not None and per_min < 0
    assert growth([(0.0, 5)]) == (0, None, False)


def _census(t: float, counts: dict[str, int], size: int = 56) -> dict[str, Any]:
    return {
        "proflet": "heap",
        "t": t + 0.01,
        "at": t,
        "length_s": 0.01,
        "slowdown_s": 0.0,
        "objects": sum(counts.values()),
        "bytes": size * sum(counts.values()),
        "types_seen": len(counts),
        "types": [[name, n, n * size] for name, n in counts.items()],
        "sampled_every": 1,
        "scan_ms": 5.0,
        "pause_ms": 1.0,
        "worst_scan_ms": 5.0,
        "ovhd_ms": 6.25,
        "max_pause_ms": 200.0,
    }


def _fed(censuses: int = 9) -> HeapAnalyzer:
    analyzer = HeapAnalyzer()
    stable = {f"big.Type{i}": 10_000 + i for i in range(40)}  # more types than the table shows
    for i in range(censuses):
        # myapp.Session: small (so outside the top by bytes), growing 1,200 a minute; Pool goes up and down
        counts = {**stable, "myapp.Session": 50 + 200 * i, "myapp.Pool": [300, 100, 400, 200][i % 4]}
        analyzer.merge_detail(_census(1000.0 + 10.0 * i, counts))
    return analyzer


def test_the_leak_is_named_with_its_growth_and_the_table_is_bounded() -> None:
    analyzer = _fed()
    out = analyzer.results()
    rows = {r["type"]: r for r in out["types"]}
    assert len(out["types"]) == TABLE_ROWS + 1  # the largest, plus the suspect
    session = rows["myapp.Session"]
    assert session["suspect_leak"] and session["growth_per_min"] == pytest.approx(1200.0)
    assert session["count"] == 50 + 200 * 8 and session["censuses_growing"] == 9
    assert not any(r["suspect_leak"] for name, r in rows.items() if name != "myapp.Session")
    assert out["censuses"] == 9 and out["objects"] > 0 and out["census_at"] == 1080.0
    assert analyzer.findings() == ["instances of myapp.Session grew by 1,200/min over 9 censuses: a leak?"]
    assert analyzer.status().problem >= 0.6 and analyzer.status().confidence > 0.5
    assert (analyzer.priority() or 0) >= 0.6
    # a window of the last four censuses: too few to call it a leak
    recent = analyzer.results(start=1045.0, end=1080.0)
    assert recent["censuses"] == 4
    assert not any(r["suspect_leak"] for r in recent["types"])


def test_no_suspect_without_enough_censuses() -> None:
    analyzer = _fed(censuses=LEAK_CENSUSES)
    assert analyzer.findings() == [] and analyzer.status().problem == 0.0


def test_history_keeps_what_the_report_needs() -> None:
    analyzer = _fed()
    analyzer.merge_detail({"proflet": "heap", "skipped": "expected 900 ms", "max_pause_ms": 200.0})
    again = HeapAnalyzer()
    again.restore(analyzer.state())
    assert again.results() == analyzer.results()
    assert again.findings() == analyzer.findings()


def test_priority_follows_memory_growth() -> None:
    analyzer = HeapAnalyzer()

    def report(t: float, rss: int) -> ReportView:
        return ReportView(t=t, window_s=1.0, samples=100, data={"rss": rss})

    # before its first censuses a heap asks for them: nothing is known yet
    assert analyzer.priority() == 1.0 and analyzer.wants_detail(1000.0)
    for t in (1000.0, 1010.0):
        analyzer.merge_detail({"at": t, "types": [["myapp.Row", 500, 50_000]]})  # steady: no leak in the making
    assert not analyzer.wants_detail(1020.0)
    for i in range(10):
        analyzer.merge(report(float(i), 100_000_000))
    flat = analyzer.priority() or 0.0
    for i in range(10, 20):
        analyzer.merge(report(float(i), 100_000_000 + 2_000_000 * (i - 9)))
    assert flat == pytest.approx(0.2) and (analyzer.priority() or 0.0) > 0.9


def test_a_type_at_a_new_high_is_followed_by_a_census_every_few_seconds_until_the_verdict() -> None:
    analyzer = HeapAnalyzer()
    t = 1000.0
    for i in range(LEAK_CENSUSES + 1):
        analyzer.merge_detail({"at": t, "types": [["myapp.Session", 1000 + 200 * i, 64_000]]})
        if i == 0:
            t += FOLLOW_S
            continue
        # on a run of new highs: the most the analysis may want, and the next census soon
        assert analyzer.priority() == 1.0 or i == LEAK_CENSUSES
        assert analyzer.wants_detail(t + FOLLOW_S) != (i == LEAK_CENSUSES)
        assert not analyzer.wants_detail(t + FOLLOW_S / 2)  # not more often than that
        t += FOLLOW_S
    # the verdict is in: no more asking, the plan's pace again
    assert [r["type"] for r in analyzer.suspects()] == ["myapp.Session"]
    assert not analyzer.wants_detail(t + 60.0)


def test_the_real_collector_finds_a_leak_in_this_process() -> None:
    collector, analyzer = HeapCollector(), HeapAnalyzer()
    leaked: list[Leaky] = []
    for i in range(LEAK_CENSUSES + 2):
        leaked.extend(Leaky(j) for j in range(100))
        burst = _burst(collector)
        burst["at"] = 1000.0 + 60.0 * i  # a census a minute
        analyzer.merge_detail(burst)
    suspects = {r["type"]: r for r in analyzer.results()["types"] if r["suspect_leak"]}
    assert suspects[f"{HERE}.Leaky"]["growth_per_min"] == pytest.approx(100.0)
    assert f"instances of {HERE}.Leaky grew by 100/min over {LEAK_CENSUSES + 2} censuses: a leak?" in (
        analyzer.findings()
    )


def test_the_table_reads_well() -> None:
    console = Console(record=True, width=140)
    heap_terminal(console, _fed().results(), limit=5)
    text = console.export_text()
    assert "myapp.Session" in text and "leak? (9 censuses)" in text and "+1,200" in text
    assert "censuses" in text and "maximum pause 200 ms" in text
    console = Console(record=True, width=140)
    skipped = HeapAnalyzer()
    skipped.merge_detail({"skipped": "expected 900 ms, more than the maximum pause of 200 ms", "max_pause_ms": 200.0})
    heap_terminal(console, skipped.results(), limit=5)
    assert "heap census skipped: expected 900 ms" in console.export_text()


def test_with_no_census_yet_the_report_says_why() -> None:
    from types import SimpleNamespace

    from dyper.monitor.session import AgentState

    # At 1% the guard saves up 100 ms: a census planned at 150 ms cannot be paid for.
    agent = AgentState("a", budget=0.01, proflets={"heap": {"ovhd_ms": 150.0}})
    out = HeapAnalyzer(SimpleNamespace(agents={"a": agent})).results()
    assert out["censuses"] == 0 and out["types"] == []
    assert out["note"] == "no census yet: one is expected to take 150 ms, more than a 1% budget saves up (99 ms)"
    agent.proflets["heap"]["ovhd_ms"] = 20.0
    assert HeapAnalyzer(SimpleNamespace(agents={"a": agent})).results()["note"] == "no census yet"
    agent.proflets.clear()
    assert "not running in the target" in HeapAnalyzer(SimpleNamespace(agents={"a": agent})).results()["note"]
