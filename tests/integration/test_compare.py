"""The truth programs run as real processes (moved from tests/unit/test_compare.py: they start subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.compare import (
    MULTI_PROGRAMS,
    TRUTH,
    shares,
    top,
)


@pytest.mark.parametrize("program", ["flat", "deep", "spread", "recursion", "threads", "native"])
def test_truth_programs_record_their_own_split(program: str, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    subprocess.run([sys.executable, str(TRUTH), program, "--rounds", "20", str(out)], check=True, timeout=60)
    t = json.loads(out.read_text())
    assert t["program"] == program
    assert t["rounds"] == 20  # per thread in the threaded programs
    assert t["wall_s"] > 0 and t["cpu_s"] > 0
    assert len(t["truth_s"]) >= 5
    assert set(t["calls"]) == set(t["truth_s"])
    # the timed blocks hold most of the process's CPU time (glue and clock reads are small)
    busy = {k: v for k, v in t["truth_s"].items() if k not in ("nap", "wait_for_lock")}
    assert 0.5 * t["cpu_s"] < sum(busy.values()) <= 1.05 * t["cpu_s"]
    if program == "flat":
        assert top(shares(t["truth_s"], sorted(t["truth_s"])), 1) == ["parse_header"]
    if program == "threads":
        # a sleeping or blocked thread's functions have next to no CPU time
        assert t["truth_s"]["nap"] < 0.1 * t["truth_s"]["crunch"]


@pytest.mark.parametrize("program", MULTI_PROGRAMS)
def test_multi_threaded_truths_record_their_own_split(program: str, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    subprocess.run([sys.executable, str(TRUTH), program, "--rounds", "10", str(out)], check=True, timeout=60)
    t = json.loads(out.read_text())
    assert t["rounds"] == 10
    assert set(t["calls"]) == set(t["truth_s"])
    share = shares(t["truth_s"], sorted(t["truth_s"]))
    if program == "io-mix":
        # the writer runs until the spinners end: its share depends on how the machine schedules
        # them (on a busy machine it may write alone for a while), so only counts are checked
        assert t["calls"]["spin_a"] == t["calls"]["spin_b"] == 10
        assert t["calls"]["write_chunks"] >= 1 and t["calls"]["doze"] >= 1
        assert share["doze"] < 0.05  # a sleeping thread has next to no CPU time
    if program == "deep8":
        # leaf k does k units a round in every thread: k/36 (CPU clocks, so a busy machine does not move it)
        for k in range(1, 9):
            assert abs(share[f"leaf{k}"] - k / 36) < 0.05, share
    if program == "native-mix":
        assert min(share.values()) > 0.05, share
    if program == "gc-alloc":
        assert t["truth_s"]["on_gc"] == 0.0  # its body is pass
        assert t["calls"]["on_gc"] > 0 and t["calls"]["on_gc"] % 2 == 0  # start and stop of each collection
