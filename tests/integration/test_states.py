"""Planted thread states, classed by each sampler (issue 29, "States").

tests/integration/targets/planted_states.py runs one thread per state
(sleep, sleep with a call in its argument, lock, Event, Queue, select, recv,
a child process, a spinner), three spinners sharing the GIL, or one spinner
pinned beside a busy process on its CPU (the run queue, not the GIL), under
``dyper run --budget 5% --proflets cpu,threads``; ``dyper report --json``
must give each thread its planted state. The bounds are what a
misclassification breaks, not what an idle machine shows: the planted state
at least 60% of the thread's samples, every other state at most 25% (a busy
2-core VM moves the shares by a few points; a wrong class moves them by 50 or
more). A case one sampler gets wrong today is xfail(strict=True): its fix
shows up as an XPASS.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from dyper.agent import native
from tests.factories import TARGETS, dyper

TARGET = TARGETS / "planted_states.py"
DURATION_S = "6"
#: the program outlives the profiling: dyper run stops it, so every thread is there (and named) at the end
PROGRAM_S = "60"

pytestmark = pytest.mark.timeout(120)

#: the threads section's columns, and which of them each planted thread must land in
COLUMNS = ("run_pct", "gil_pct", "block_pct", "wait_pct", "io_pct", "sleep_pct")
PLANTED = {
    "sleep": ("sleep_pct",),
    "sleep_arg": ("sleep_pct",),
    "lock": ("block_pct",),
    "event": ("wait_pct",),
    "queue": ("wait_pct",),
    "select": ("io_pct",),
    "recv": ("io_pct",),
    "child": ("wait_pct",),
    # running or ready to run (the GIL sampler cannot tell the GIL from the run queue: gil_pct is both)
    "spin": ("run_pct", "gil_pct"),
}
#: (sampler, thread) -> why that sampler classes it wrong today
KNOWN_WRONG: dict[tuple[str, str], str] = {}

SAMPLERS = ["gil", "native"]
STATE_FILE = "<dyper state>"


def _run(tmp: Path, mode: str, sampler: str) -> dict[str, Any]:
    if sampler == "native" and not native.available():
        pytest.skip(f"no native sampler here: {native.IMPORT_ERROR}")
    out = tmp / f"{mode}-{sampler}.json"
    run = dyper(
        "run", "-q", "--budget", "5%", "--duration", DURATION_S, "--proflets", "cpu,threads", "-o", str(out),
        "--", sys.executable, str(TARGET), mode, PROGRAM_S,
        env={"DYPER_SAMPLER": sampler}, timeout=90,
    )  # fmt: skip
    assert out.exists(), f"dyper run wrote no profile ({run.returncode}):\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
    report = json.loads(dyper("report", "--json", str(out), check=True).stdout)
    assert report["process"]["sampler"]["name"] == sampler, report["process"]["sampler"]
    return {"report": report, "profile": json.loads(out.read_text())}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    """One profiled run per program and sampler, shared by the tests of that pair."""
    return {}


def _profiled(runs: dict[tuple[str, str], dict[str, Any]], tmp: Path, mode: str, sampler: str) -> dict[str, Any]:
    key = (mode, sampler)
    if key not in runs:
        runs[key] = _run(tmp, mode, sampler)
    return runs[key]


def _threads(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(r["name"]): r for r in run["report"]["proflets"]["threads"]["threads"]}


def _state_leaves(run: dict[str, Any], name: str) -> dict[str, float]:
    """Shares of a thread's samples whose leaf is a state the native sampler added
    (``<waiting for the GIL>``, ``<run queue>``), from the profile's own stacks."""
    profile = run["profile"]
    tids = {tid for tid, n in profile["threads"].items() if n == name}
    frames = profile["frames"]
    total = 0
    by: dict[str, int] = {}
    for tid, wall, _cpu, stack in profile["stacks"]:
        if str(tid) not in tids:
            continue
        total += wall
        leaf = frames[stack[-1]] if stack else None
        if leaf is not None and leaf[0] == STATE_FILE:
            by[leaf[1]] = by.get(leaf[1], 0) + wall
    return {k: v / total for k, v in by.items()} if total else {}


def _split(row: dict[str, Any], planted: tuple[str, ...]) -> tuple[float, dict[str, float]]:
    got = {c: float(row.get(c) or 0.0) for c in COLUMNS}
    return sum(got[c] for c in planted), {c: v for c, v in got.items() if c not in planted}


def _enough(sampler: str) -> int:
    """Samples a thread needs to tell 60% from 25%. 3.11's GIL sampler starves a busy thread that
    is not the main one (pending calls run on the main thread only, issue 29): as few as 4 samples in
    6 s were seen; its shares still have to be right, on what it got."""
    return 1 if sampler == "gil" and sys.version_info < (3, 12) else 50


def _cases() -> list[Any]:
    cases = []
    for sampler in SAMPLERS:
        for name in PLANTED:
            why = KNOWN_WRONG.get((sampler, name))
            marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
            cases.append(pytest.param(sampler, name, marks=marks, id=f"{sampler}-{name}"))
    return cases


@pytest.mark.parametrize(("sampler", "name"), _cases())
def test_each_planted_thread_is_classed_in_its_state(
    runs: dict[tuple[str, str], dict[str, Any]], tmp_path_factory: pytest.TempPathFactory, sampler: str, name: str
) -> None:
    run = _profiled(runs, tmp_path_factory.getbasetemp(), "waits", sampler)
    threads = _threads(run)
    assert name in threads, sorted(threads)
    row = threads[name]
    assert row["samples"] >= _enough(sampler), row
    planted, wrong = _split(row, PLANTED[name])
    if name == "spin" and sampler == "native":
        # the native sampler files the GIL under gil_pct and the run queue under its own kind, each
        # with a leaf that says which; a monitor that took them for plain waits would show wait_pct
        states = _state_leaves(run, name)
        assert wrong["wait_pct"] <= 5.0, (row, states)
        planted += 100.0 * states.get(native.RUN_QUEUE, 0.0)
    assert planted >= 60.0, (name, row)
    assert max(wrong.values()) <= 25.0, (name, row)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_three_spinners_share_the_gil_and_never_wait_on_anything_else(
    runs: dict[tuple[str, str], dict[str, Any]], tmp_path_factory: pytest.TempPathFactory, sampler: str
) -> None:
    run = _profiled(runs, tmp_path_factory.getbasetemp(), "spinners", sampler)
    threads = _threads(run)
    enough = _enough(sampler)
    for name in ("spin0", "spin1", "spin2"):
        row = threads[name]
        assert row["samples"] >= enough, row
        assert max(float(row[c] or 0.0) for c in ("block_pct", "io_pct", "sleep_pct")) <= 5.0, row
        if sampler == "gil":
            # every sample "runs"; the CPU clock splits it into running and ready (the GIL, or the
            # kernel's run queue where the threads proflet read it: much of it on a busy machine)
            ready = float(row["gil_pct"] or 0.0) + float(row.get("runqueue_pct") or 0.0)
            assert float(row["run_pct"]) + ready >= 90.0, row
        else:
            # three threads, one GIL: two of them wait for it at any moment, asleep in the kernel
            # with a running leaf (on a busy machine many are runnable but off a CPU instead: the
            # run queue); the waits are all GIL or run queue, never a plain wait
            states = _state_leaves(run, name)
            assert states.get(native.GIL_WAIT, 0.0) >= 0.1, (row, states)
            assert float(row["wait_pct"]) <= 5.0, (row, states)
            ready = float(row["gil_pct"] or 0.0) + 100.0 * states.get(native.RUN_QUEUE, 0.0)
            assert float(row["run_pct"]) + ready >= 90.0, (row, states)


@pytest.mark.parametrize(
    "sampler",
    [
        pytest.param(
            "gil",
            marks=pytest.mark.xfail(
                # not strict: when the machine leaves the pinned CPU's other process idle for a
                # while, there is little run queue to misfile and the GIL sampler passes
                strict=False,
                reason="the GIL sampler sees a runnable thread that is off its CPU as ready to run and files it "
                "under the GIL (gil_pct = samples running less CPU clock): it cannot tell the run queue apart",
            ),
        ),
        "native",
    ],
)
def test_a_spinner_beside_a_busy_process_on_its_cpu_waits_in_the_run_queue_not_for_the_gil(
    runs: dict[tuple[str, str], dict[str, Any]], tmp_path_factory: pytest.TempPathFactory, sampler: str
) -> None:
    run = _profiled(runs, tmp_path_factory.getbasetemp(), "runq", sampler)
    row = _threads(run)["pinned"]
    # the plant worked: the kernel (schedstat, over the bursts) had it off the CPU half the time or more
    kernel = float(row.get("runqueue_kernel_pct", row.get("runqueue_pct")) or 0.0)
    assert kernel >= 30.0, row
    assert row["samples"] >= _enough(sampler), row
    if sampler == "gil":
        assert float(row["gil_pct"] or 0.0) <= 25.0, row
    else:
        # the leaves say it; gil_pct is the analyzer's estimate (samples with a running leaf less the
        # CPU clock), which also holds the run queue the sampler missed: 2-16% seen
        assert float(row["gil_pct"] or 0.0) <= 35.0, row
        states = _state_leaves(run, "pinned")
        # against the kernel's own count: the sampler has missed up to half of it (see
        # docs/measurements.md); one that cannot tell the run queue (the regression) finds none
        assert states.get(native.RUN_QUEUE, 0.0) >= 0.4 * kernel / 100.0, (row, states)
        assert float(row["runqueue_pct"]) == pytest.approx(100.0 * states.get(native.RUN_QUEUE, 0.0), abs=1.0)
        assert states.get(native.GIL_WAIT, 0.0) <= 0.1, (row, states)
