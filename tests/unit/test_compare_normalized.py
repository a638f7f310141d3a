"""Comparative profiles normalised by total samples (pprof's -normalize), raw counts on request."""

import json
from pathlib import Path
from typing import Any

import pytest

from dyper.monitor.cli import main
from dyper.monitor.search.calltree import CallTreeProfile
from dyper.monitor.search.comparative import ComparativeProfile
from dyper.monitor.search.repl import SearchSession

# One program, two runs: the second ran longer (3,499 samples against 2,409), in the same proportions.
RUN_A = "main;hot;leaf 1445\nmain;cold;leaf 723\nmain;hot 241\n"
RUN_B = "main;hot;leaf 2099\nmain;cold;leaf 1050\nmain;hot 350\n"


def _bottlenecks(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["bottlenecks", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _files(tmp_path: Path) -> tuple[str, str]:
    a, b = tmp_path / "ca.collapsed", tmp_path / "cb.collapsed"
    a.write_text(RUN_A)
    b.write_text(RUN_B)
    return str(a), str(b)


def test_same_program_compares_to_near_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _files(tmp_path)
    _, result = _bottlenecks(capsys, b, "--compare", a, "-c", "suggester highbase; suggest 5")
    assert result["normalization"] == "total samples"
    assert result["summaries"], result
    for s in result["summaries"]:
        # a few samples of rounding at most, well under 0.5% of the run
        assert abs(s["cum"]) <= 3 and abs(s["cum_pct"]) < 0.5, s
        assert abs(s["base"]) <= 3 and abs(s["base_pct"]) < 0.5, s


def test_raw_keeps_the_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _files(tmp_path)
    _, result = _bottlenecks(capsys, b, "--compare", a, "--raw", "-c", "suggester highbase; suggest 5")
    assert result["normalization"] == "raw"
    by_path = {tuple(s["path"]): s for s in result["summaries"]}
    assert by_path[("leaf",)]["base"] == (2099 + 1050) - (1445 + 723)
    assert by_path[("hot",)]["base"] == 350 - 241
    assert result["total"] == 3499 - 2409


def test_normalised_difference_is_a_difference_of_shares() -> None:
    a = CallTreeProfile.from_collapsed("main;f 600\nmain;g 400\n")  # f: 60%
    b = CallTreeProfile.from_collapsed("main;f 1000\nmain;g 1000\n")  # f: 50%
    cp = ComparativeProfile(a, b, normalize=True)
    assert cp.normalization == "total samples" and cp.total() == 0
    s = SearchSession(cp)
    main_f = cp.summary(["main", "f"])
    assert main_f is not None
    r = s.describe(main_f)
    assert r["cum"] == 600 - 500 and r["cum_pct"] == pytest.approx(10.0)
    raw = ComparativeProfile(a, b)
    assert raw.normalization == "raw" and raw.cum_of(raw.summary(["main", "f"])) == -400  # type: ignore[arg-type]


def test_interactive_header_and_text_say_normalised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _files(tmp_path)
    capsys.readouterr()
    assert main(["bottlenecks", b, "--compare", a, "-c", "suggest 2"]) == 0
    assert "normalised by total samples" in capsys.readouterr().out.replace("\n", " ")
