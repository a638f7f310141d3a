"""The memory analyzers: cumulative figures into windows, burst sites into rates, priority, report tables."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from dyper.monitor.commands.report import render
from dyper.proflets.base import ReportView
from dyper.proflets.memory.analyzer import MemoryAnalyzer, SiteTotals
from dyper.proflets.memory.common import DYPER
from dyper.proflets.memory_stacks.analyzer import StacksAnalyzer

APP = "/srv/app.py"


def data(
    gens: tuple[int, int, int], pause: float, sites: list[list[Any]], rss: int = 100 << 20, callbacks: int = 0
) -> dict[str, Any]:
    return {
        "gc": [[g, 0, 0] for g in gens],
        "pause_s": pause,
        "callbacks": callbacks,
        "callback_s": callbacks * 2e-6,
        "callback_cost_s": 2e-6,
        "sites": sites,
        "rss": rss,
    }


def feed(a: MemoryAnalyzer, t: float, d: dict[str, Any] | None, window_s: float = 1.0) -> None:
    a.merge(ReportView(t=t, window_s=window_s, samples=100, data=d))


def test_cumulative_figures_become_windows():
    a = MemoryAnalyzer()
    feed(a, 1.0, data((10, 1, 0), 0.01, [[APP, 5, "grow", 10, 1, 0, 0.01]], callbacks=11))
    # site unchanged since the last report: not sent again
    feed(a, 2.0, data((30, 2, 2), 0.5, [[APP, 9, "force", 0, 0, 2, 0.48], [APP, 5, "grow", 30, 2, 0, 0.02]]))
    feed(a, 3.0, None)  # a report without the collector's data changes nothing
    whole = a.results()
    assert whole["gc"]["collections"] == [30, 2, 2]
    assert whole["gc"]["pause_total_s"] == pytest.approx(0.5)
    assert whole["gc"]["pause_pct"] == pytest.approx(25.0)
    assert whole["gc"]["collections_per_s"] == pytest.approx([15.0, 1.0, 1.0])
    assert whole["gc"]["callback_cost_s"] == pytest.approx(22e-6)
    by = {(r["function"], r["line"]): r for r in whole["gc"]["pauses_by_site"]}
    assert by[("force", 9)]["generations"] == [0, 0, 2] and by[("force", 9)]["pause_s"] == pytest.approx(0.48)
    assert by[("grow", 5)]["generations"] == [30, 2, 0]
    assert whole["gc"]["pauses_by_site"][0]["function"] == "force"  # by pause
    late = a.results(1.5, 2.0)
    assert late["gc"]["collections"] == [20, 1, 2]
    assert {r["function"]: r["generations"] for r in late["gc"]["pauses_by_site"]} == {
        "force": [0, 0, 2],
        "grow": [20, 1, 0],
    }
    assert late["seconds"] == 1.0 and late["rss_bytes"] == 100 << 20


def test_a_new_collector_counts_from_zero():
    a = MemoryAnalyzer()
    feed(a, 1.0, data((50, 5, 1), 0.2, [[APP, 5, "grow", 50, 5, 1, 0.2]]))
    feed(a, 2.0, data((4, 0, 0), 0.01, [[APP, 5, "grow", 4, 0, 0, 0.01]]))  # re-attached
    r = a.results()
    assert r["gc"]["collections"] == [54, 5, 1]
    assert r["gc"]["pauses_by_site"][0]["generations"] == [54, 5, 1]


def test_dyper_s_own_collections_are_not_sites():
    a = MemoryAnalyzer()
    feed(a, 1.0, data((3, 0, 0), 0.1, [["", 0, DYPER, 1, 0, 0, 0.04], [APP, 5, "grow", 2, 0, 0, 0.06]]))
    gc = a.results()["gc"]
    assert [r["function"] for r in gc["pauses_by_site"]] == ["grow"]
    assert gc["pauses_by_site"][0]["pause_pct"] == pytest.approx(100.0)
    assert gc["dyper_pause_s"] == pytest.approx(0.04)


def test_priority_follows_gc_counts_and_memory_over_the_last_50_reports():
    quiet = MemoryAnalyzer()
    for t in range(60):
        feed(quiet, float(t), data((t, 0, 0), 0.0, []))
    assert quiet.priority() == pytest.approx(0.1 + 0.9 * 0.01)

    busy = MemoryAnalyzer()
    for t in range(60):
        feed(busy, float(t), data((t * 100, t * 10, t), 0.0, []))
    assert busy.priority() == 1.0

    growing = MemoryAnalyzer()
    for t in range(60):
        feed(growing, float(t), data((0, 0, 0), 0.0, [], rss=(100 + t) << 20))
    assert growing.priority() > 0.9

    # Only the last 50 reports count: busy long ago, quiet now.
    settled = MemoryAnalyzer()
    for t in range(100):
        n = min(t, 40) * 1000
        feed(settled, float(t), data((n, 0, 0), 0.0, []))
    assert settled.priority() == pytest.approx(0.1)


def test_status_and_findings():
    a = MemoryAnalyzer()
    for t in range(1, 11):
        feed(a, float(t), data((t, 0, t), 0.1 * t, [[APP, 9, "force", 0, 0, t, 0.1 * t]], rss=(100 + 10 * t) << 20))
    assert a.status().problem == 1.0  # 10% of the time in GC pauses
    assert 0 < a.status().confidence < 1
    texts = a.findings()
    assert any("10.0% of the time" in f and "force (app.py:9)" in f for f in texts), texts
    assert any("resident memory grew from 110 MB to 200 MB" in f for f in texts), texts


def test_the_gc_finding_rests_on_seconds_and_collections_not_on_reports():
    # Issue 30: at 1% reports come seconds apart; a 15-s run had 4 and the GC
    # finding (it wanted 5 reports) was left out with 70% of the time in GC.
    a = MemoryAnalyzer()
    for t in range(1, 5):
        cum = (5000 * t, 800 * t, 0)
        feed(a, 4.0 * t, data(cum, 2.8 * t, [[APP, 33, "churn", 5000 * t, 800 * t, 0, 2.8 * t]]), window_s=4.0)
    texts = a.findings()
    assert any("70.0% of the time" in f and "churn (app.py:33)" in f for f in texts), texts
    assert a.status().confidence > 0.4  # 16 s observed
    # too little to say: two seconds, a handful of collections
    b = MemoryAnalyzer()
    feed(b, 1.0, data((3, 0, 0), 0.5, [[APP, 33, "churn", 3, 0, 0, 0.5]]))
    feed(b, 2.0, data((6, 0, 0), 1.0, [[APP, 33, "churn", 6, 0, 0, 1.0]]))
    assert not any("garbage collection" in f for f in b.findings())


def burst(sites: list[list[Any]], length: float = 0.5, **extra: Any) -> dict[str, Any]:
    return {"proflet": "memory", "length_s": length, "slowdown_s": 0.1, "sites": sites, "nframe": 1, **extra}


def test_burst_sites_become_rates_extrapolated_to_the_window():
    a = MemoryAnalyzer()
    for t in range(1, 11):
        feed(a, float(t), data((0, 0, 0), 0.0, []))
    a.merge_detail(burst([[APP, 5, "grow", 1000, 64000], [APP, 7, "other", 10, 500]], dyper=[3, 300]))
    a.merge_detail(burst([[APP, 5, "grow", 3000, 192000]]))
    a.merge_detail(burst([], skipped="the application traces allocations itself (tracemalloc): left alone"))
    r = a.results()
    top = r["sites"][0]
    assert (top["function"], top["line"]) == ("grow", 5)
    assert top["count_per_s"] == pytest.approx(4000.0) and top["bytes_per_s"] == pytest.approx(256000.0)
    assert top["count"] == 40000 and top["bytes"] == 2560000  # over the 10 s of reports
    assert top["bytes_pct"] == pytest.approx(100 * 256000 / 256500)
    assert r["bursts"] == 2 and r["burst_s"] == pytest.approx(1.0) and r["dyper_bytes_per_s"] == pytest.approx(300.0)
    assert r["skipped"] == 1 and "itself" in r["skip_reason"]


def test_the_sites_table_is_bounded():
    totals = SiteTotals()
    totals.add(burst([[APP, i, "f", 1, i] for i in range(SiteTotals.MAX_SITES + 1)]))
    assert len(totals.sites) == SiteTotals.MAX_SITES // 2
    assert min(v[1] for v in totals.sites.values()) > SiteTotals.MAX_SITES // 2  # the largest kept


def test_state_survives_the_history():
    a = MemoryAnalyzer()
    feed(a, 1.0, data((5, 1, 1), 0.2, [[APP, 9, "force", 0, 0, 1, 0.2]]))
    a.merge_detail(burst([[APP, 5, "grow", 10, 640]]))
    b = MemoryAnalyzer()
    b.restore(a.state())
    assert b.results() == a.results() | {"priority": b.priority()}
    s = StacksAnalyzer()
    s.merge_detail(burst([[APP, 5, "grow", 10, 640, [[APP, 20, "caller"]]]], nframe=8))
    t = StacksAnalyzer()
    t.restore(s.state())
    assert t.results() == s.results()


class _Session:
    def __init__(self, memory: MemoryAnalyzer) -> None:
        self.analyzers = {"memory": memory}


def test_stacks_rates_priority_and_status_lean_on_the_memory_proflet():
    memory = MemoryAnalyzer()
    for t in range(1, 5):
        feed(memory, float(t), data((t * 1000, t * 100, t * 10), 0.0, []))
    stacks = StacksAnalyzer(_Session(memory))
    stacks.merge_detail(burst([[APP, 5, "grow", 100, 6400, [[APP, 20, "caller"], [APP, 30, "main"]]]], nframe=8))
    r = stacks.results()
    assert r["sites"][0]["stack"] == [
        {"file": APP, "line": 20, "function": "caller"},
        {"file": APP, "line": 30, "function": "main"},
    ]
    assert r["sites"][0]["count"] == 200 * 4  # 200 a second over the memory proflet's 4 s
    assert stacks.priority() == pytest.approx(0.5 * (memory.priority() or 0))
    assert StacksAnalyzer().priority() == pytest.approx(0.1)


def test_the_report_tables():
    memory = MemoryAnalyzer()
    feed(memory, 1.0, data((30, 2, 2), 0.5, [[APP, 9, "force", 0, 0, 2, 0.48], [APP, 5, "grow", 30, 2, 0, 0.02]]))
    memory.merge_detail(burst([[APP, 5, "grow", 1000, 64000]]))
    stacks = StacksAnalyzer(_Session(memory))
    stacks.merge_detail(burst([[APP, 5, "grow", 100, 6400, [[APP, 20, "caller"]]]], nframe=8))
    report = {
        "process": {"pid": 1, "argv": ["app"], "python": "3.12", "duration_s": 1.0, "samples": 10},
        "status": {},
        "findings": [],
        "off": {},
        "proflets": {"memory": memory.results(), "memory_stacks": stacks.results()},
    }
    out = io.StringIO()
    render(report, Console(file=out, width=160), 20)
    text = out.getvalue()
    assert "GC pauses by the line that triggered them" in text
    assert "force" in text and "app.py:9" in text and "0/0/2" in text
    assert "memory: allocation sites" in text and "128.0 kB" in text
    assert "memory_stacks: allocation sites" in text and "caller (app.py:20)" in text


@pytest.mark.parametrize(
    ("sampled", "bytes_per_s", "found"),
    [
        (False, 256_000, True),  # alive at the ends of the bursts: memory growing at 256 kB/s is news
        (True, 256_000, False),  # allocated, temporaries included: 256 kB/s costs next to nothing
        (True, 40_000_000, True),  # 40 MB/s allocated does cost: some 1% of a core in the allocator
    ],
)
def test_an_allocation_site_is_a_finding_at_a_rate_that_matters_for_what_was_measured(sampled, bytes_per_s, found):
    a = MemoryAnalyzer()
    for t in range(1, 11):
        feed(a, float(t), data((0, 0, 0), 0.0, []))
    size = bytes_per_s * 0.5  # one half-second burst
    extra = {"sampled": {"allocations": 1000, "bytes": size}} if sampled else {}
    a.merge_detail(burst([[APP, 5, "grow", 1000, size]], **extra))
    assert a.results()["sampled"] is sampled
    texts = [f for f in a.findings() if "allocation site grow" in f]
    assert bool(texts) is found, a.findings()
