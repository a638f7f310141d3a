"""dyper with no options finds everything planted in one service within a minute (issue 30).

One real `dyper run --duration 60` (1%, the default set: every built-in
proflet) of tests/integration/targets/planted_all.py, which plants a leak, a
heavy allocation site, GC pressure, a socket reader, a sleeper, a lock
waiter, three GIL-bound spinners, a short-lived named thread and a CPU-bound
main thread, each measuring its own truth. Then `dyper report --json` on the
saved profile: every one of those findings, with the thread names, and the
overhead within the budget.

The bounds are what a regression breaks: a finding missing, a thread named
`thread-<ident>`, a leak rate off by half, a CPU figure off by a third, the
overhead past the budget by more than the guard's error. A busy machine
gives fewer samples and slower threads, not other findings: each planted
behaviour is large (the spinners are most of the CPU, the leak is 200
objects a second, the reader waits all the time).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.factories import REPO, TARGETS

SECONDS = 60


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    out = tmp_path_factory.mktemp("planted_all")
    profile, truth = out / "all.json", out / "truth.json"
    target = [sys.executable, str(TARGETS / "planted_all.py"), "--truth", str(truth)]
    proc = subprocess.run(
        [sys.executable, "-m", "dyper", "run", "-q", "--duration", str(SECONDS), "-o", str(profile), "--", *target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SECONDS + 90,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    report = subprocess.run(
        [sys.executable, "-m", "dyper", "report", str(profile), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    return json.loads(report.stdout), json.loads(Path(truth).read_text())


def _finding(report: dict[str, Any], *words: str) -> str:
    found = [f for f in report["findings"] if all(w in f for w in words)]
    assert found, f"no finding with {words} among:\n" + "\n".join(report["findings"])
    return found[0]


def test_every_proflet_runs_by_default_and_the_overhead_keeps_to_the_budget(run: tuple[dict[str, Any], Any]) -> None:
    report, _ = run
    process = report["process"]
    assert process["budget"] == pytest.approx(1.0)
    # The guard pays before it spends; what it cannot foresee is the last operation in flight.
    assert process["overhead"] <= 1.15 * process["budget"], process
    ran = set(report["proflets"])
    assert {"cpu", "threads", "timing", "heap", "io", "memory"} <= ran, (ran, report["off"])
    # What has not detailed yet says so, never a zero.
    for name, why in report["off"].items():
        assert why.startswith(("no data yet", "not running")), (name, why)


def test_the_leak_is_named_with_its_rate(run: tuple[dict[str, Any], Any]) -> None:
    report, truth = run
    text = _finding(report, "Session", "a leak?")
    rate = float(text.split("grew by ")[1].split("/min")[0].replace(",", ""))
    true_rate = truth["sessions"] / truth["wall_s"] * 60.0
    assert 0.5 * true_rate < rate < 1.5 * true_rate, (text, true_rate)


def test_the_heavy_allocation_site_is_found_with_its_rate(run: tuple[dict[str, Any], Any]) -> None:
    report, truth = run
    _finding(report, "allocation site build_rows", "planted_all.py")
    # The rate against what the program built: its batches' bytes (sys.getsizeof) times
    # batches a second. The sampler counts each allocation as requested, and a list's
    # growth as the sizes it grew to, about a third more than the list holds at the end;
    # and it extrapolates from a few seconds of bursts.
    rows = [r for r in report["proflets"]["memory"]["sites"] if r["function"].startswith("build_rows")]
    rate = sum(r["bytes_per_s"] for r in rows)
    true_rate = truth["rows"] / 2000 * truth["batch_bytes"] / truth["wall_s"]
    assert 0.5 * true_rate < rate < 3.0 * true_rate, (rows, true_rate)


def test_the_gc_pressure_is_found(run: tuple[dict[str, Any], Any]) -> None:
    report, truth = run
    gc_text = _finding(report, "garbage collection pauses take")
    share = float(gc_text.split("take ")[1].split("%")[0])
    true_share = 100.0 * truth["gc_pause_s"] / truth["wall_s"]
    assert 0.5 * true_share < share < 2.0 * true_share, (gc_text, true_share)


def test_the_waiting_threads_are_named_with_what_they_wait_for(run: tuple[dict[str, Any], Any]) -> None:
    report, _ = run
    _finding(report, "thread reader", "I/O", "recv", "slow_reader")
    _finding(report, "thread waiter is blocked on a lock")
    _finding(report, "sleeping most of the time", "sleeper")


def test_the_spinners_and_the_main_thread_share_the_gil_and_their_cpu_matches_their_clocks(
    run: tuple[dict[str, Any], Any],
) -> None:
    report, truth = run
    for name in ("spin-0", "spin-1", "spin-2", "MainThread"):
        _finding(report, f"thread {name} is ready to run but not running", "(GIL)")
    _finding(report, "waiting for the GIL")
    _finding(report, "CPU-bound", "spin")
    cpu = {t["name"]: t["cpu_s"] for t in report["proflets"]["timing"]["threads"]}
    for name in ("spin-0", "spin-1", "spin-2", "MainThread"):
        assert cpu[name] == pytest.approx(truth["cpu_s"][name], rel=0.3), (name, cpu, truth["cpu_s"])


def test_the_short_lived_thread_keeps_its_name_and_its_cpu(run: tuple[dict[str, Any], Any]) -> None:
    report, truth = run
    names = {t["name"] for t in report["proflets"]["threads"]["threads"]}
    assert "short-lived" in names, names
    assert not any(n.startswith("thread-") for n in names), names
    cpu = {t["name"]: t["cpu_s"] for t in report["proflets"]["timing"]["threads"]}
    assert cpu["short-lived"] == pytest.approx(truth["cpu_s"]["short-lived"], rel=0.3), cpu
