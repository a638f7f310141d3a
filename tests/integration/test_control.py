"""Pause, resume and reset through the real CLI, a standing monitor and an attached target; a mark from inside it."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from tests.factories import TARGETS, dyper, start_target, stop, wait_for


def test_pause_resume_reset_from_the_cli_and_a_mark_from_inside(standing_monitor):
    target = start_target(str(TARGETS / "marks.py"))
    ep, pid = standing_monitor.endpoint, str(target.pid)

    def session() -> dict[str, Any]:
        found = standing_monitor.session(target.pid)
        assert found is not None
        return found

    def report() -> dict[str, Any]:
        out = dyper("report", pid, "--json", "--monitor", ep, check=True)
        return dict(json.loads(out.stdout)["process"])

    try:
        dyper("attach", pid, "--budget", "5%", "--monitor", ep, check=True)
        wait_for(lambda: standing_monitor.session(target.pid) and session()["samples"] >= 30, what="samples")

        assert "paused" in dyper("pause", pid, "--monitor", ep, check=True).stdout
        wait_for(lambda: session()["paused"], what="the session paused")
        time.sleep(1.5)  # what was sampled before the pause has arrived
        paused_at = session()["samples"]
        time.sleep(2.5)  # at 5% a running agent reports every second or so, with tens of samples each
        assert session()["samples"] == paused_at

        dyper("resume", pid, "--monitor", ep, check=True)
        wait_for(lambda: not session()["paused"] and session()["samples"] >= paused_at + 30, what="samples again")

        before_reset = session()["samples"]
        assert "reset" in dyper("reset", pid, "--monitor", ep, check=True).stdout
        after = wait_for(lambda: (p := report())["reset_t"] is not None and p, what="the reset in the report")
        assert after["samples"] < before_reset
        kinds = [(m["name"], m["kind"]) for m in after["marks"]]
        for mark in (("phase two", "mark"), ("pause", "pause"), ("resume", "resume"), ("reset", "reset")):
            assert mark in kinds
        human = dyper("report", pid, "--monitor", ep, check=True).stdout
        assert "statistics since the reset" in human and "phase two" in human
    finally:
        dyper("detach", pid, "--monitor", ep)
        stop(target)


def test_pause_without_an_agent_is_one_line_saying_what_to_do(standing_monitor):
    target = start_target(str(TARGETS / "marks.py"))
    try:
        out = dyper("pause", str(target.pid), "--monitor", standing_monitor.endpoint)
        assert out.returncode != 0
        assert out.stderr.count("\n") == 1 and f"dyper attach {target.pid}" in out.stderr
    finally:
        stop(target)


def test_tagged_functions_split_the_profile_in_report_and_export(tmp_path):
    prof = tmp_path / "prof.json"
    target = [sys.executable, str(TARGETS / "tagged.py"), "3"]
    dyper("run", "--budget", "5%", "-q", "-o", str(prof), "--", *target, check=True)

    def functions(tag: str) -> set[str]:
        out = dyper("report", str(prof), "--tag", tag, "--json", check=True)
        report = json.loads(out.stdout)
        assert report["process"]["tag"] == tag
        return {f["name"] for f in report["proflets"]["cpu"]["functions"] if f["total_pct"] >= 5}

    assert "pay" in functions("checkout") and "find" not in functions("checkout")
    assert "find" in functions("search") and "pay" not in functions("search")
    collapsed = tmp_path / "search.collapsed"
    dyper("export", str(prof), "--tag", "search", "-o", str(collapsed), check=True)
    lines = collapsed.read_text().splitlines()
    assert lines and all("tag:search" in line for line in lines)
    missing = dyper("report", str(prof), "--tag", "nope")
    assert missing.returncode != 0 and "checkout" in missing.stderr and "search" in missing.stderr
