"""Native time through `dyper run` and `dyper report`: the C call that takes a hot function's time.

On 3.12+ the cpu proflet's native bursts time the candidates and the C
calls they make (sys.monitoring); on 3.11 there is no selective hook, so
the report has no native rows and says nothing about them.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.factories import TARGETS, dyper

pytestmark = pytest.mark.timeout(180)


def test_the_report_says_which_c_call_takes_handles_time(tmp_path):
    out = tmp_path / "prof.json"
    # Native time comes with every other cpu burst, the second one the earliest.
    # At 25% bursts come every second or two: 15 s gave native rows every time,
    # also with two CPU hogs beside it. 3.11 has none to wait for.
    seconds = "15" if sys.version_info >= (3, 12) else "4"
    dyper(
        "run", "-q", "--budget", "25%", "--duration", seconds, "-o", str(out), "--",
        sys.executable, str(TARGETS / "native_calls.py"),
        check=True, timeout=150, env={"DYPER_PROFLETS": "cpu"},
    )  # fmt: skip
    report = json.loads(dyper("report", str(out), "--json", check=True).stdout)
    native = report["proflets"]["cpu"]["native"]
    if sys.version_info < (3, 12):
        assert native == []
        return
    rows = {(r["function"], r["callee"]): r for r in native}
    sort = rows[("handle", "builtins.sorted")]
    # sorting 5,000 numbers is most of handle(); the rest is two small calls and indexing
    assert sort["pct_of_function"] > 50 and sort["calls"] > 0 and sort["seconds"] > 0, sort
    assert any("builtins.sorted inside handle()" in f for f in report["findings"]), report["findings"]
    human = dyper("report", str(out), "--proflet", "cpu", check=True).stdout
    assert "C calls inside the hottest functions" in human and "builtins.sorted" in human
