"""bench/compare.py: reading each tool's output, the scores, and the ground-truth programs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yappi

from bench.compare import (
    Answer,
    parse_dyper_report,
    parse_pstats,
    parse_pyinstrument_session,
    parse_pyspy_raw,
    score,
    score_shares,
    shares,
    spearman,
    stable_from,
    top,
)


def test_pyspy_raw_charges_each_line_to_its_leaf() -> None:
    text = (
        "<module> (truth.py:480);flat (truth.py:70);parse_header (truth.py:66) 120\n"
        "<module> (truth.py:480);flat (truth.py:71);validate (truth.py:75) 30\n"
        "<module> (truth.py:480);spread (truth.py:90);route_a (truth.py:82);lookup (truth.py:60) 7\n"
        "<module> (truth.py:480);flat (truth.py:70);parse_header (truth.py:67) 5\n"
    )
    a = parse_pyspy_raw(text)
    assert a.self_by_name == {"parse_header": 125, "validate": 30, "lookup": 7}
    assert a.samples == 162


def test_pstats_from_a_real_yappi_run(tmp_path: Path) -> None:
    def busy() -> int:
        return sum(i * i for i in range(20000))

    def caller() -> int:
        return busy() + busy()

    def countdown(n: int) -> int:
        return 0 if n == 0 else countdown(n - 1)

    yappi.set_clock_type("cpu")
    yappi.start(builtins=False)
    try:
        for _ in range(3):
            caller()
            countdown(10)
    finally:
        yappi.stop()
    out = tmp_path / "y.pstat"
    yappi.get_func_stats().save(str(out), type="pstat")
    yappi.clear_stats()
    a = parse_pstats(out)
    assert a.calls["busy"] == 6
    assert a.calls["caller"] == 3
    assert a.calls["countdown"] == 3 * 11  # every recursive call, not only the outermost
    # busy's generator does the work; caller only calls: its own time is a small part of busy's
    assert a.self_by_name["caller"] < a.self_by_name["busy"] + a.self_by_name.get("<genexpr>", 0.0)
    assert a.samples is not None and a.samples >= 9


def test_pyinstrument_session_takes_leaf_time() -> None:
    sep, attr = "\x00", "\x01"
    session = {
        "frame_records": [
            [[f"<module>{sep}t.py{sep}1", f"main{sep}t.py{sep}5{attr}l7", f"lookup{sep}t.py{sep}9{attr}l10"], 0.002],
            [[f"<module>{sep}t.py{sep}1", f"main{sep}t.py{sep}5{attr}l8"], 0.001],
            [[f"<module>{sep}t.py{sep}1", f"main{sep}t.py{sep}5", f"lookup{sep}t.py{sep}9"], 0.003],
            [[], 0.001],
        ]
    }
    a = parse_pyinstrument_session(session)
    assert a.samples == 4
    assert a.self_by_name == pytest.approx({"lookup": 0.005, "main": 0.001})


def test_dyper_report_self_samples_and_counted_calls() -> None:
    report = {
        "process": {"samples": 312},
        "proflets": {
            "cpu": {
                "functions": [
                    {"name": "a", "self": 216, "calls": 1340},
                    {"name": "b", "self": 96, "calls": None},
                    {"name": "<module>", "self": 0, "calls": None},
                ]
            }
        },
    }
    a = parse_dyper_report(report)
    assert a.samples == 312
    assert a.self_by_name == {"a": 216.0, "b": 96.0, "<module>": 0.0}
    assert a.calls == {"a": 1340}


def test_shares_are_over_the_judged_functions_only() -> None:
    got = shares({"a": 30.0, "b": 10.0, "glue": 60.0}, ["a", "b", "c"])
    assert got == {"a": 0.75, "b": 0.25, "c": 0.0}
    assert shares({}, ["a"]) == {"a": 0.0}


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share a rank: [1, 2.5, 2.5, 4] against [1, 2, 3, 4]
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, rel=1e-6)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_score_of_a_perfect_and_of_a_wrong_answer() -> None:
    truth = {
        "truth_s": {"a": 4.0, "b": 3.0, "c": 2.0, "d": 0.5, "e": 0.3, "f": 0.2},
        "calls": {"a": 100, "b": 50, "c": 10, "d": 1, "e": 1, "f": 1},
    }
    right = score(truth, Answer(self_by_name={"a": 40, "b": 30, "c": 20, "d": 5, "e": 3, "f": 2, "glue": 99}))
    assert right["max_err"] == pytest.approx(0.0)
    assert right["top5"] == 1.0
    assert right["rank_corr"] == pytest.approx(1.0)
    assert right["calls_err_pct"] is None
    # f and a swapped; a's calls counted 10% high, b's exactly
    wrong = score(
        truth,
        Answer(self_by_name={"a": 0.2, "b": 3.0, "c": 2.0, "d": 0.5, "e": 0.3, "f": 4.0}, calls={"a": 110, "b": 50}),
    )
    assert wrong["max_err"] == pytest.approx(100 * 3.8 / 10.0)
    assert wrong["top5"] == 0.8
    assert wrong["rank_corr"] < 0.5
    assert wrong["calls_err_pct"] == pytest.approx(5.0)


def test_top_breaks_ties_by_name() -> None:
    assert top({"b": 0.5, "a": 0.5, "c": 0.1}, 2) == ["a", "b"]


def test_stable_from() -> None:
    lengths = [0.5, 1.0, 2.0, 4.0, 8.0]
    final = ["a", "b", "c", "d", "e"]
    tops = [["a", "b", "x", "d", "e"], final, ["a", "b", "c", "y", "e"], list(reversed(final)), final]
    assert stable_from(lengths, tops) == 4.0  # order inside the five does not matter
    assert stable_from(lengths, [final] * 5) == 0.5
    assert stable_from([], []) is None


def test_a_tool_that_saw_nothing_names_no_top_five() -> None:
    assert top({"a": 0.0, "b": 0.0}) == []
    truth = {"truth_s": {n: float(i + 1) for i, n in enumerate("abcdef")}, "calls": {}}
    blind = score(truth, Answer(self_by_name={"glue": 10.0}))
    assert blind["top5"] == 0.0
    assert blind["seen"] == 0


def test_top_five_leaves_out_what_takes_next_to_nothing() -> None:
    # a sleeping thread's functions (under 1% of the truth) are in no top five
    want = {"crunch": 0.5, "digest": 0.3, "guarded": 0.195, "nap": 0.004, "wait": 0.001}
    assert score_shares(want, {"crunch": 0.5, "digest": 0.3, "guarded": 0.2})["top5"] == 1.0
    assert score_shares(want, {"crunch": 0.5, "digest": 0.3, "nap": 0.2})["top5"] == pytest.approx(2 / 3)
