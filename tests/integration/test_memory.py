"""The memory proflets on planted behaviour, through `dyper run`, `dyper attach` and `dyper report`.

The target (targets/planted_memory.py) builds batches of tuples on one line
and keeps them a few seconds: that line is the top allocation site, and its
growth triggers the young collections. Another function forces full
collections at a known rate and times them itself: they must be counted,
and their pauses charged to its ``gc.collect()`` line. The budgets are high
so that both detailing modes get bursts within a short test; the budget
itself is tested elsewhere.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.factories import TARGETS, dyper, start_target, stop, wait_for

PLANTED = TARGETS / "planted_memory.py"
PROFLETS = {"DYPER_PROFLETS": "memory,memory_stacks"}

pytestmark = pytest.mark.timeout(120)


def _line(marker: str) -> int:
    lines = PLANTED.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if f"# planted: {marker}" in text)


ALLOCATION_LINE = _line("allocation site")
FORCED_LINE = _line("forced collection")


def _truth(path: Path) -> dict[str, float]:
    names = ("forced", "forced_pause_s", "batches", "items", "seconds", "rss", "tracing", "callbacks", "untraced")
    return dict(zip(names, (float(x) for x in path.read_text().split()), strict=True))


def _is_planted(row: dict[str, Any]) -> bool:
    return os.path.basename(str(row["file"])) == PLANTED.name


def _check_gc(memory: dict[str, Any], truth: dict[str, float]) -> None:
    gc = memory["gc"]
    seconds = memory["seconds"]
    assert seconds > 4, memory
    sites = {(r["function"], r["line"]): r for r in gc["pauses_by_site"] if _is_planted(r)}
    forced = sites[("force_collection", FORCED_LINE)]
    # Counted: each forced collection is a full one, at the planted rate
    # (the forcer may fall behind on a loaded machine, never ahead).
    expected = truth["forced"] / truth["seconds"] * seconds
    assert 0.6 * expected - 2 <= forced["generations"][2] <= 1.1 * expected + 2, (forced, truth, seconds)
    assert gc["collections"][2] >= forced["generations"][2]
    # Charged: the time spent in them is on the gc.collect() line, as long
    # as the target measured it per collection.
    truth_pause = truth["forced_pause_s"] / truth["forced"]
    assert 0.5 * truth_pause <= forced["pause_s"] / forced["generations"][2] <= 1.5 * truth_pause, (forced, truth)
    assert forced["pause_pct"] > 70, gc["pauses_by_site"]
    assert gc["pause_total_s"] >= forced["pause_s"]
    # The young collections come from the growth of the batches: most are charged to build_batch.
    young = {r["function"]: r["generations"][0] for r in gc["pauses_by_site"]}
    assert young.get("build_batch", 0) > 0 and young["build_batch"] == max(young.values()), gc["pauses_by_site"]
    # The callback's own cost is counted, and small next to the pauses.
    assert 0 < gc["callback_cost_s"] < 0.1 * gc["pause_total_s"], gc


def _check_sites(section: dict[str, Any], truth: dict[str, float], seconds: float, stacks: bool) -> None:
    assert section["bursts"] >= 1 and section["burst_s"] > 0, section
    top = section["sites"][0]
    assert _is_planted(top) and top["line"] == ALLOCATION_LINE and top["function"] == "build_batch", section["sites"]
    items_per_s = truth["items"] / truth["seconds"]
    if section.get("sampled"):
        # memory samples allocations: every one made on that line, a string and a
        # tuple an item and the list's growth, measured exactly with the hook alone at
        # 2.8 (3.8 with the loop's int, on the line above), estimated from samples.
        assert 1.5 * items_per_s <= top["count_per_s"] <= 5.0 * items_per_s, (top, items_per_s)
    else:
        # tracemalloc: each item is a tuple and a string built on that line; tuples
        # come back from the interpreter's free list (not malloc'd, so not traced) as
        # old batches go: between one and two blocks an item alive at the end.
        assert 0.5 * items_per_s <= top["count_per_s"] <= 2.5 * items_per_s, (top, items_per_s)
    assert 30 <= top["bytes_per_s"] / top["count_per_s"] <= 150, top
    # extrapolated to the time the reports cover
    assert top["count"] == pytest.approx(top["count_per_s"] * seconds, rel=0.01, abs=1)
    if stacks:
        assert section["nframe"] > 1
        assert top["stack"][0]["function"] == "allocator_loop", top
    else:
        assert "stack" not in top


def test_run_and_report_planted_memory(tmp_path):
    out, truth_file = tmp_path / "prof.json", tmp_path / "truth"
    dyper(
        "run", "-q", "--budget", "50%", "--duration", "12", "-o", str(out), "--",
        sys.executable, str(PLANTED), "--truth", str(truth_file),
        check=True, timeout=90, env=PROFLETS,
    )  # fmt: skip
    report = json.loads(dyper("report", str(out), "--json", check=True).stdout)
    truth = _truth(truth_file)
    memory = report["proflets"]["memory"]
    assert "memory" not in report["off"] and "memory_stacks" not in report["off"], report["off"]
    _check_gc(memory, truth)
    _check_sites(memory, truth, memory["seconds"], stacks=False)
    assert memory["rss_bytes"] == pytest.approx(truth["rss"], rel=0.3)
    # Priority from the GC counts: a forced full collection five times a second is a lot.
    assert memory["priority"] > 0.5
    assert report["status"]["memory"]["problem"] > 0.1
    assert any("force_collection" in f and "garbage collection" in f for f in report["findings"]), report["findings"]
    assert report["process"]["overhead"] <= 50.0

    human = dyper("report", str(out), check=True).stdout
    assert "GC pauses by the line" in human and "force_collection" in human and "build_batch" in human


def test_attach_details_with_stacks_and_detach_leaves_nothing(standing_monitor, tmp_path):
    truth_file = tmp_path / "truth"
    target = start_target(str(PLANTED), "--truth", str(truth_file))
    endpoint = standing_monitor.endpoint
    try:
        dyper("attach", str(target.pid), "--budget", "50%", "--monitor", endpoint, check=True, env=PROFLETS)

        def settled() -> dict[str, Any] | None:
            proc = dyper("report", str(target.pid), "--json", "--monitor", endpoint, check=True)
            report: dict[str, Any] = json.loads(proc.stdout)
            p = report["proflets"]
            if "memory" not in p or "memory_stacks" not in p:
                return None  # "no data yet" (in report["off"]) until each has something
            ok = p["memory"]["seconds"] > 5 and p["memory"]["bursts"] and p["memory_stacks"]["bursts"]
            return report if ok else None

        report = wait_for(settled, timeout=60, interval=2.0, what="bursts of both memory proflets")
        truth = _truth(truth_file)
        memory, stacks = report["proflets"]["memory"], report["proflets"]["memory_stacks"]
        _check_gc(memory, truth)
        _check_sites(memory, truth, memory["seconds"], stacks=False)
        _check_sites(stacks, truth, memory["seconds"], stacks=True)
        assert report["status"]["memory_stacks"]["confidence"] > 0

        dyper("detach", str(target.pid), "--monitor", endpoint, check=True)

        # detach returns once the agent is told; it stops at its next wake-up, later on a busy
        # machine. Left behind (the regression), the GC callback and tracemalloc stay for good.
        def clean() -> dict[str, float] | None:
            t = _truth(truth_file)
            return t if t["callbacks"] == 0 and t["tracing"] == 0 else None

        wait_for(clean, timeout=30, interval=0.5, what="the GC callback gone and tracemalloc off after the detach")
    finally:
        stop(target)


def test_an_application_tracing_itself_is_left_alone(standing_monitor, tmp_path):
    """The application runs tracemalloc itself: bursts leave it on and say why they traced nothing."""
    truth_file = tmp_path / "truth"
    target = start_target(str(PLANTED), "--tracemalloc", "--truth", str(truth_file))
    endpoint = standing_monitor.endpoint
    try:
        dyper(
            "attach", str(target.pid), "--budget", "50%", "--monitor", endpoint,
            check=True, env={"DYPER_PROFLETS": "memory"},
        )  # fmt: skip

        def skipped_and_forced() -> dict[str, Any] | None:
            # Waited for, not given a fixed time: on a loaded machine the first burst can come late.
            proc = dyper("report", str(target.pid), "--json", "--monitor", endpoint, check=True)
            memory: dict[str, Any] | None = json.loads(proc.stdout)["proflets"].get("memory")
            if memory is None:
                return None  # "no data yet" until its first report
            forced = [r for r in memory["gc"]["pauses_by_site"] if r["function"] == "force_collection"]
            return memory if memory.get("skipped") and forced else None

        memory = wait_for(skipped_and_forced, timeout=60, interval=1.0, what="a skipped burst and forced collections")
        truth = _truth(truth_file)
        assert truth["untraced"] == 0 and truth["tracing"] == 1, truth  # never off, not even for a moment
        assert "traces allocations itself" in memory["skip_reason"], memory
        assert memory["bursts"] == 0 and memory["sites"] == []
        # The basic analysis goes on.
        forced = [r for r in memory["gc"]["pauses_by_site"] if r["function"] == "force_collection"]
        assert forced[0]["line"] == FORCED_LINE and forced[0]["generations"][2] > 0
    finally:
        dyper("detach", str(target.pid), "--monitor", endpoint)
        stop(target)


def test_gc_pauses_at_the_default_budget_against_the_program_s_own_timer(tmp_path):
    """Issue 30: at 1% the GC pause share came out well under the truth and the GC finding was
    missing in 2 runs of 3. The planted program times its own collections (gc.callbacks)."""
    out, truth_file = tmp_path / "prof.json", tmp_path / "truth.json"
    dyper(
        "run", "-q", "-o", str(out), "--",
        sys.executable, str(TARGETS / "planted_gc.py"), "10", str(truth_file),
        check=True, timeout=120, env={"DYPER_PROFLETS": "cpu,memory"},
    )  # fmt: skip
    truth = json.loads(truth_file.read_text())
    report = json.loads(out.read_text())["proflets"]
    gc = report["results"]["memory"]["gc"]
    # The collections the program timed were all triggered in churn(); the
    # watch saw part of them (30 to 45% of the time at 1%) and extrapolated:
    # within 0.85 to 1.08 of the truth in 8 runs on 3.11 and 3.12 (0.9 to 1.5
    # when a stretch's few watched collections set its mean pause).
    sites = ("churn", "(not watched)")
    churn = sum(r["pause_s"] for r in gc["pauses_by_site"] if r["function"] in sites)
    # On a machine loaded far past its cores a preempted watched collection sets a
    # high mean pause: 1.47 of the truth was seen at a load average of 15.
    assert 0.6 * truth["pause_s"] <= churn <= 1.6 * truth["pause_s"], (churn, truth, gc["watched_pct"])
    assert any("garbage collection pauses take" in f and "churn" in f for f in report["findings"]), report
