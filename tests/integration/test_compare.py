"""The truth programs run as real processes (moved from tests/unit/test_compare.py: they start subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.compare import (
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
