"""bench/compare.py: reading each tool's output, the scores, and the ground-truth programs."""

from __future__ import annotations

import gzip
import math
import sys
from pathlib import Path

import pytest
import yappi

from bench.compare import (
    TRUTH,
    Answer,
    command,
    decompress_pprof,
    dyper_sampler,
    env,
    median_shares,
    merge_answers,
    parse_dyper_report,
    parse_pprof,
    parse_pstats,
    parse_pyinstrument_session,
    parse_pyspy_raw,
    per_tool_cpu,
    samplers_said,
    score,
    score_shares,
    shares,
    spearman,
    stable_from,
    tool_label,
    top,
)
from dyper.monitor.pprof import profile_pb2


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


# --- issue 29: ddtrace's pprof, the sampler dyper ran, the CPU stacks per tool CPU ---------------

DD_TYPES = ["cpu-time", "cpu-samples", "wall-time", "wall-samples", "alloc-space", "alloc-samples"]


def dd_profile(samples: list[tuple[list[str], list[int]]]) -> bytes:
    """A pprof profile laid out as ddtrace writes it: stacks leaf first, one function per location."""
    prof = profile_pb2.Profile()
    strings = [""]

    def sid(text: str) -> int:
        if text not in strings:
            strings.append(text)
        return strings.index(text)

    for kind in DD_TYPES:
        prof.sample_type.add(type=sid(kind), unit=sid("nanoseconds" if "time" in kind else "count"))
    ids: dict[str, int] = {}
    for stack, values in samples:
        for name in stack:
            if name not in ids:
                ids[name] = len(ids) + 1
                prof.function.add(id=ids[name], name=sid(name), filename=sid("truth.py"))
                prof.location.add(id=ids[name]).line.add(function_id=ids[name], line=10 + ids[name])
        prof.sample.add(location_id=[ids[n] for n in stack], value=values)
    prof.string_table.extend(strings)
    return prof.SerializeToString()


def test_pprof_cpu_time_goes_to_each_sample_leaf() -> None:
    data = dd_profile(
        [
            # cpu ns, cpu samples, wall ns, wall samples, alloc bytes, alloc samples
            (["spin_a", "cpu", "<module>"], [3_000_000, 1, 3_100_000, 1, 0, 0]),
            (["spin_a", "cpu", "<module>"], [2_000_000, 1, 2_000_000, 1, 0, 0]),
            (["Thread.wait", "<module>"], [0, 1, 5_000_000, 1, 0, 0]),  # a waiting thread: no CPU
            (["doze", "sleeper"], [10_000, 1, 5_000_000, 1, 0, 0]),
            (["build_records"], [0, 0, 0, 0, 4096, 1]),  # an allocation sample: no stack sample
            ([], [1_000_000, 1, 1_000_000, 1, 0, 0]),  # CPU without a stack: counted, no function's
        ]
    )
    a = parse_pprof(data)
    assert a.self_by_name == pytest.approx({"spin_a": 0.005, "doze": 0.00001})
    assert a.cpu_stacks == 4  # the samples with CPU time
    assert a.samples == 5  # every thread stack taken (wall samples)
    assert parse_pprof(gzip.compress(data)).self_by_name == a.self_by_name


def test_pprof_without_cpu_time_is_refused() -> None:
    prof = profile_pb2.Profile()
    prof.string_table.extend(["", "alloc-space", "bytes"])
    prof.sample_type.add(type=1, unit=2)
    with pytest.raises(ValueError, match="cpu-time"):
        parse_pprof(prof.SerializeToString())


def test_decompress_pprof_reads_zstd_gzip_and_plain() -> None:
    raw = dd_profile([(["f"], [1, 1, 1, 1, 0, 0])])
    assert decompress_pprof(raw) == raw
    assert decompress_pprof(gzip.compress(raw)) == raw
    zstandard = pytest.importorskip("zstandard")
    assert decompress_pprof(zstandard.ZstdCompressor().compress(raw)) == raw


def test_merge_answers_adds_files_up() -> None:
    one = Answer(self_by_name={"a": 1.0}, samples=10, cpu_stacks=4)
    two = Answer(self_by_name={"a": 0.5, "b": 2.0}, calls={"b": 3}, samples=5, cpu_stacks=5)
    got = merge_answers([one, two])
    assert got.self_by_name == {"a": 1.5, "b": 2.0}
    assert got.calls == {"b": 3}
    assert (got.samples, got.cpu_stacks) == (15, 9)


def test_dyper_sampler_from_the_field_or_the_native_counters() -> None:
    assert dyper_sampler({"sampler": {"name": "native", "why": "DYPER_SAMPLER=native"}}) == "native"
    assert dyper_sampler({"sampler": "gil"}) == "gil"
    # the report says nothing; the profile's process does
    assert dyper_sampler({}, {"sampler": {"name": "gil", "why": "no layout"}}) == "gil"
    # no field: the native sampler's dropped reads say it ran
    assert dyper_sampler({}, {"dropped": {"samples": 0, "native_invalid": 2}}) == "native"
    assert dyper_sampler({"dropped": {"samples": 3}}, {}) is None


def test_dyper_report_counts_cpu_stacks_and_the_sampler() -> None:
    report = {
        "process": {"samples": 13},
        "proflets": {"cpu": {"functions": [{"name": "a", "self": 5}, {"name": "b", "self": 2}]}},
    }
    a = parse_dyper_report(report, {"process": {"dropped": {"native_torn": 1}}})
    assert (a.samples, a.cpu_stacks, a.sampler) == (13, 7, "native")
    assert parse_dyper_report(report).sampler is None


def test_samplers_said_and_the_label() -> None:
    assert samplers_said(["native", "native"]) == "native"
    assert samplers_said(["native", None, "native", "gil"]) == "native 2, gil 1, not said 1"
    assert tool_label("dyper-native-1%", {"samplers": "gil"}) == "dyper-native-1% (ran: gil)"
    assert tool_label("py-spy", {"samplers": None}) == "py-spy"


def test_per_tool_cpu() -> None:
    assert per_tool_cpu(300.0, 0.03) == pytest.approx(10_000.0)
    assert per_tool_cpu(300.0, -0.01) is None  # a tool CPU at or below zero is noise, not infinite yield
    assert per_tool_cpu(None, 0.03) is None


def test_median_shares() -> None:
    runs = [{"a": 0.5, "b": 0.5}, {"a": 0.7, "b": 0.3}, {"a": 0.6}]
    assert median_shares(runs) == pytest.approx({"a": 0.6, "b": 0.3})
    assert median_shares([]) == {}


def test_commands_and_environments_of_the_new_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYPER_SAMPLER", "native")  # from the caller: dyper-1% must not inherit it
    out = tmp_path / "ddprof"
    dd = command("ddtrace", sys.executable, ["io-mix", "--rounds", "3", "t.json"], out)
    assert Path(dd[0]).name == "ddtrace-run" and dd[1:3] == [sys.executable, str(TRUTH)]
    assert env("ddtrace", out)["DD_PROFILING_ENABLED"] == "true"
    assert env("ddtrace", out)["DD_PROFILING_OUTPUT_PPROF"] == str(out)
    native = command("dyper-native-1%", sys.executable, ["deep8", "--rounds", "3", "t.json"], tmp_path / "o.json")
    assert native[1:5] == ["run", "-q", "--budget", "1%"]
    assert env("dyper-native-1%", out)["DYPER_SAMPLER"] == "native"
    assert "DYPER_SAMPLER" not in env("dyper-1%", out)
    assert env("dyper-gil-1%", out)["DYPER_SAMPLER"] == "gil"
