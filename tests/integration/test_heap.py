"""The heap proflet on planted behaviour, through `dyper run`, `dyper attach` and `dyper report`.

The target (targets/planted_heap.py) leaks ``Session`` objects at a known
rate, keeps 20,000 ``Row`` objects, and has a ``Request`` pool that goes up
and down. The leak must be flagged by name with about its growth per
minute; the others not. A census costs a few ms here; under a maximum pause
below that, every census is skipped and the report says why.

A census needs a request from the monitor and the report of the last one
(about one every two seconds), and a suspect six censuses: the runs last
about 16 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from dyper.proflets.heap.analyzer import LEAK_CENSUSES
from tests.factories import REPO, TARGETS, dyper, start_target, stop, wait_for

PLANTED = TARGETS / "planted_heap.py"
PROFLETS = {"DYPER_PROFLETS": "heap"}
#: sessions leaked per second (the target's default) and rows kept
RATE = 50.0
ROWS = 20_000

pytestmark = pytest.mark.timeout(120)


def _suspects(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    heap = report["proflets"].get("heap")  # none until the first census: "no data yet" in report["off"]
    return {r["type"]: r for r in heap["types"] if r["suspect_leak"]} if heap is not None else {}


def _check_leak(report: dict[str, Any]) -> None:
    heap = report["proflets"]["heap"]
    rows = {r["type"]: r for r in heap["types"]}
    session = rows.get("__main__.Session")
    assert session is not None and session["suspect_leak"], (session, heap)
    # 3,000 a minute; the censuses' own times say when each was taken, so within half of it
    assert 0.5 * RATE * 60 <= session["growth_per_min"] <= 1.5 * RATE * 60, session
    assert session["censuses_growing"] >= LEAK_CENSUSES + 1
    # large and stable, or up and down: not leaks
    assert rows["__main__.Row"]["count"] == ROWS and not rows["__main__.Row"]["suspect_leak"], rows["__main__.Row"]
    assert "__main__.Request" not in _suspects(report)
    assert [name for name in _suspects(report) if name.startswith("__main__.")] == ["__main__.Session"]
    assert any(f.startswith("instances of __main__.Session grew by ") for f in report["findings"]), report["findings"]
    assert heap["censuses"] >= LEAK_CENSUSES + 1 and heap["skipped"] == 0
    assert 0 < heap["worst_scan_ms"] < heap["max_pause_ms"] == 200.0
    assert report["status"]["heap"]["problem"] >= 0.6


def test_run_and_report_a_planted_leak(tmp_path):
    out, skipped_out = tmp_path / "prof.json", tmp_path / "skipped.json"
    # Alongside: the same target under a maximum pause no census can keep to.
    skipping = subprocess.Popen(
        [
            sys.executable, "-m", "dyper", "run", "-q", "--budget", "5%", "--duration", "6",
            "-o", str(skipped_out), "--", sys.executable, str(PLANTED),
        ],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **PROFLETS, "DYPER_HEAP_MAX_PAUSE_MS": "0.05"},
    )  # fmt: skip
    try:
        dyper(
            "run", "-q", "--budget", "5%", "--duration", "16", "-o", str(out), "--", sys.executable, str(PLANTED),
            check=True, timeout=90, env=PROFLETS,
        )  # fmt: skip
        report = json.loads(dyper("report", str(out), "--json", check=True).stdout)
        process = report["process"]
        assert process["samples"] > 100 and 0 < process["overhead"] <= 5.0, process
        assert "heap" not in report["off"], report["off"]
        _check_leak(report)
        human = dyper("report", str(out), "--proflet", "heap", check=True).stdout
        assert "__main__.Session" in human and "leak?" in human and "__main__.Row" in human

        _, err = skipping.communicate(timeout=60)
        assert skipping.returncode == 0, err
    finally:
        if skipping.poll() is None:
            skipping.kill()
            skipping.communicate()
    skipped = json.loads(dyper("report", str(skipped_out), "--json", check=True).stdout)
    heap = skipped["proflets"]["heap"]
    assert heap["censuses"] == 0 and heap["skipped"] >= 1 and heap["types"] == [], heap
    assert "maximum pause of 0.05 ms (DYPER_HEAP_MAX_PAUSE_MS)" in heap["skip_reason"], heap
    assert any("heap census skipped" in f for f in skipped["findings"]), skipped["findings"]
    assert "heap census skipped" in dyper("report", str(skipped_out), "--proflet", "heap", check=True).stdout


def test_attach_flags_the_leak_by_name(standing_monitor):
    target = start_target(str(PLANTED))  # returns once the target says it is ready
    try:
        dyper(
            "attach", str(target.pid), "--budget", "5%", "--monitor", standing_monitor.endpoint, "--proflets", "heap",
            check=True,
        )  # fmt: skip

        def flagged() -> dict[str, Any] | None:
            proc = dyper("report", str(target.pid), "--json", "--monitor", standing_monitor.endpoint, check=True)
            report: dict[str, Any] = json.loads(proc.stdout)
            return report if "__main__.Session" in _suspects(report) else None

        report = wait_for(flagged, timeout=60, interval=2.0, what="the planted leak flagged")
        _check_leak(report)
        assert report["process"]["pid"] == target.pid
    finally:
        dyper("detach", str(target.pid), "--monitor", standing_monitor.endpoint)
        stop(target)
