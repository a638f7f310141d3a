"""Consolidation of many profiles (seed 004): numbers worked out by hand."""

from __future__ import annotations

import json

import pytest

from dyper.monitor.consolidate import (
    Consolidated,
    SourceShares,
    collect_windows,
    consolidate,
    diff_profiles,
    from_profile,
    load_source,
    parse_collapsed,
    parse_frame,
    parse_threshold,
    parse_windows,
    report,
)
from dyper.monitor.exports import Collapsed
from dyper.monitor.model.frames import Frame
from dyper.monitor.model.profile import Profile, StackCount

# Three sources where every number is known.
#   A (10 samples): work 6 self, idle 4 self, main only on the stack.
#   B (20 samples): work 10 self over two lines, main 10 self on another line.
#   C (4 samples):  work 3 self, rec 1 self recursing into itself.
A = """\
main (app.py:1);work (app.py:10) 6
main (app.py:1);idle (app.py:20) 4
"""
B = """\
main (app.py:1);work (app.py:10) 5
main (app.py:1);work (app.py:11) 5
main (app.py:2) 10
"""
C = """\
main (app.py:1);rec (app.py:30);rec (app.py:30) 1
main (app.py:1);work (app.py:10) 3
"""


def _sources() -> list[SourceShares]:
    return [parse_collapsed(A, "a"), parse_collapsed(B, "b"), parse_collapsed(C, "c")]


def _by_name(rows: list[Consolidated]) -> dict[str, Consolidated]:
    out = {r.name: r for r in rows}
    assert len(out) == len(rows), "one row per function"
    return out


def test_collapsed_shares_self_and_total_with_recursion_counted_once():
    c = parse_collapsed(C, "c")
    assert c.samples == 4
    assert c.functions[("rec", "app.py", None)] == (25.0, 25.0)  # not 50: once per stack
    assert c.functions[("work", "app.py", None)] == (75.0, 75.0)
    assert c.functions[("main", "app.py", None)] == (0.0, 100.0)
    assert c.lines[("rec", "app.py", 30)] == (25.0, 25.0)
    b = parse_collapsed(B, "b")
    assert b.functions[("work", "app.py", None)] == (50.0, 50.0)  # two lines, one function
    assert b.lines[("work", "app.py", 11)] == (25.0, 25.0)
    assert b.lines[("main", "app.py", 1)] == (0.0, 50.0)
    assert b.lines[("main", "app.py", 2)] == (50.0, 50.0)


def test_function_statistics_by_hand():
    rows = consolidate(_sources(), 5.0)
    assert [r.name for r in rows] == ["work", "main", "idle", "rec"]  # by significance
    work, main, idle, rec = rows

    assert work.values_pct == (60.0, 50.0, 75.0)
    assert (work.min_pct, work.max_pct, work.range_pct) == (50.0, 75.0, 25.0)
    assert work.avg_pct == pytest.approx(185 / 3)
    assert work.frequency == 1.0
    assert work.significance == pytest.approx(185 / 3)
    assert work.occurrence == 1.0 and work.flagged

    # main is on every stack, but its own samples are only in B.
    assert main.values_pct == (0.0, 50.0, 0.0)
    assert (main.min_pct, main.max_pct, main.range_pct) == (0.0, 50.0, 50.0)
    assert main.avg_pct == pytest.approx(50 / 3)
    assert main.frequency == 1.0
    assert main.occurrence == pytest.approx(1 / 3)
    assert main.other_avg_pct == 100.0  # its total share, for context

    # idle runs in A only: avg over the sources where it appears, frequency 1/3.
    assert idle.values_pct == (40.0, 0.0, 0.0)
    assert (idle.min_pct, idle.max_pct, idle.range_pct) == (0.0, 40.0, 40.0)
    assert idle.avg_pct == 40.0
    assert idle.frequency == pytest.approx(1 / 3)
    assert idle.significance == pytest.approx(40 / 3)
    assert idle.occurrence == pytest.approx(1 / 3)

    assert rec.values_pct == (0.0, 0.0, 25.0)
    assert rec.avg_pct == 25.0 and rec.significance == pytest.approx(25 / 3)
    assert rec.occurrence == pytest.approx(1 / 3)
    # significance = frequency x avg = the mean over all sources, absent counting 0
    for r in rows:
        assert r.significance == pytest.approx(sum(r.values_pct) / 3)


def test_threshold_and_both_rules():
    at30 = _by_name(consolidate(_sources(), 30.0))
    assert {n for n, r in at30.items() if r.flagged} == {"work", "main", "idle"}
    assert at30["rec"].occurrence == 0.0
    # The paper's rule (Algorithm 2): significance and range both at or above the threshold.
    paper20 = _by_name(consolidate(_sources(), 20.0, rule="paper"))
    assert {n for n, r in paper20.items() if r.flagged} == {"work"}  # main: significance 16.7 < 20
    paper30 = _by_name(consolidate(_sources(), 30.0, rule="paper"))
    assert not any(r.flagged for r in paper30.values())  # work: range 25 < 30
    # flagged rows come first
    flags = [r.flagged for r in consolidate(_sources(), 30.0)]
    assert flags == sorted(flags, reverse=True)


def test_total_basis_and_lines():
    total = _by_name(consolidate(_sources(), 5.0, basis="total"))
    assert total["main"].values_pct == (100.0, 100.0, 100.0)
    assert total["main"].range_pct == 0.0 and total["main"].occurrence == 1.0
    assert total["rec"].values_pct == (0.0, 0.0, 25.0)

    lines = {(r.name, r.line): r for r in consolidate(_sources(), 5.0, level="lines")}
    w10 = lines[("work", 10)]
    assert w10.values_pct == (60.0, 25.0, 75.0)
    assert w10.avg_pct == pytest.approx(160 / 3) and w10.range_pct == 50.0
    w11 = lines[("work", 11)]
    assert w11.values_pct == (0.0, 25.0, 0.0) and w11.frequency == pytest.approx(1 / 3)
    assert w11.significance == pytest.approx(25 / 3)
    main1 = lines[("main", 1)]  # never a leaf
    assert main1.max_pct == 0.0 and not main1.flagged
    assert lines[("main", 2)].values_pct == (0.0, 50.0, 0.0)


def _window(spike: bool) -> str:
    """100 samples: a steady 3% function, and in some windows a 40% spike."""
    rows = ["serve (svc.py:1);steady (svc.py:10) 3"]
    if spike:
        rows += ["serve (svc.py:1);spike (svc.py:20) 40", "serve (svc.py:1);base (svc.py:30) 57"]
    else:
        rows += ["serve (svc.py:1);base (svc.py:30) 97"]
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("rule", ["occurrence", "paper"])
def test_planted_rare_spike_is_flagged_and_steady_three_percent_is_not(rule):
    windows = [parse_collapsed(_window(i in (1, 3)), f"w{i}") for i in range(5)]
    rows = _by_name(consolidate(windows, 5.0, rule=rule))
    spike, steady = rows["spike"], rows["steady"]
    assert spike.flagged
    assert spike.occurrence == pytest.approx(0.4)
    assert spike.values_pct == (0.0, 40.0, 0.0, 40.0, 0.0)
    assert (spike.min_pct, spike.max_pct, spike.avg_pct) == (0.0, 40.0, 40.0)
    assert spike.frequency == pytest.approx(0.4) and spike.significance == pytest.approx(16.0)
    assert not steady.flagged
    assert steady.occurrence == 0.0
    assert steady.significance == pytest.approx(3.0) and steady.range_pct == pytest.approx(0.0)
    # A merged profile would say spike is 16%, steady 3%: the spike's 40% windows are what consolidation shows.


def test_threshold_reached_exactly_counts():
    # 1 of 20 samples is 5%: "equal to or above" the threshold, as the paper says.
    a = parse_collapsed("m (x.py:1);f (x.py:2) 1\nm (x.py:1) 19\n", "a")
    b = parse_collapsed("m (x.py:1) 20\n", "b")
    f = _by_name(consolidate([a, b], 5.0))["f"]
    assert f.occurrence == 0.5 and f.flagged


def test_frame_formats():
    assert parse_frame("Handler.get (/srv/app.py:42)") == ("Handler.get", "/srv/app.py", 42)
    assert parse_frame("<lambda> (C:\\srv\\app.py:7)") == ("<lambda>", "C:\\srv\\app.py", 7)  # py-spy on Windows
    assert parse_frame("get (/srv/app.py)") == ("get", "/srv/app.py", None)  # py-spy --nolineno
    assert parse_frame("/srv/app.py:get:42") == ("get", "/srv/app.py", 42)  # Austin 3
    assert parse_frame("/srv/app.py:get:L42") == ("get", "/srv/app.py", 42)
    assert parse_frame("libc.so.6`read") == ("libc.so.6`read", "", None)  # anything else: a name


def test_austin_process_and_thread_frames_and_metadata_are_skipped():
    text = "# austin: 3.6.0\n# mode: wall\n\nP42;T0:7f01;/a.py:main:3;/a.py:f:9 30\nP42;T0:7f01;/a.py:main:4 10\n"
    s = parse_collapsed(text, "austin")
    assert s.samples == 40
    assert set(s.functions) == {("main", "/a.py", None), ("f", "/a.py", None)}
    assert s.functions[("f", "/a.py", None)] == (75.0, 75.0)
    full = parse_collapsed("P1;T1;/a.py:f:1 5,100,0\n", "full")  # --full: time,+mem,-mem
    assert full.samples == 5


def test_malformed_and_empty_collapsed_files_are_errors():
    with pytest.raises(ValueError, match=r"bad:2: not a collapsed stack line"):
        parse_collapsed("a;b 1\nthis is not a stack\n", "bad")
    with pytest.raises(ValueError, match="no samples"):
        parse_collapsed("\n# nothing\na;b 0\n", "empty")


def _profile() -> Profile:
    frames = [
        Frame("/srv/app.py", "main", 1, 5),
        Frame("/srv/app.py", "work", 10, 12),
        Frame("/srv/app.py", "work", 10, 13),
        Frame("/srv/app.py", "wait", 20, 21),
    ]
    stacks = [
        StackCount(1, (0, 1), wall=30, cpu=30),
        StackCount(1, (0, 2), wall=10, cpu=10),
        StackCount(2, (0, 3), wall=60, cpu=0),  # blocked: wall only
    ]
    return Profile(frames, stacks, {1: "MainThread", 2: "waiter"})


def test_dyper_profile_shares_match_top_and_its_own_collapsed_export():
    p = _profile()
    s = from_profile(p, "p.json")
    assert s.samples == 40
    assert s.functions[("work", "/srv/app.py", None)] == (100.0, 100.0)
    assert s.first_lines[("work", "/srv/app.py", None)] == 10
    assert s.lines[("work", "/srv/app.py", 12)] == (75.0, 75.0)
    wall = from_profile(p, "p.json", metric="wall")
    assert wall.samples == 100
    assert wall.functions[("wait", "/srv/app.py", None)] == (60.0, 60.0)
    # The same profile as dyper's collapsed export gives the same shares.
    c = parse_collapsed(Collapsed("wall").render(p), "p.collapsed")
    assert c.functions == wall.functions
    assert c.lines == wall.lines
    rows = consolidate([wall, c], 5.0)
    assert all(r.range_pct == 0.0 and r.frequency == 1.0 for r in rows)
    work = next(r for r in rows if r.name == "work")
    assert work.line == 10  # the first line, known from the dyper profile


def test_load_source_tells_formats_apart(tmp_path):
    j = tmp_path / "p.json"
    j.write_text(json.dumps(_profile().to_json()))
    assert load_source(j).kind == "profile"
    c = tmp_path / "p.txt"
    c.write_text(A)
    assert load_source(c).kind == "collapsed"
    bad = tmp_path / "other.json"
    bad.write_text('{"format": "speedscope"}')
    with pytest.raises(ValueError, match="not a dyper profile"):
        load_source(bad)
    with pytest.raises(ValueError, match="cannot read"):
        load_source(tmp_path / "missing.collapsed")
    binary = tmp_path / "x.collapsed"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="cannot read"):
        load_source(binary)


def test_fewer_than_two_sources_or_an_empty_one_is_an_error():
    with pytest.raises(ValueError, match="at least 2 sources"):
        consolidate(_sources()[:1])
    empty = SourceShares("e", "window", 0, {}, {})
    with pytest.raises(ValueError, match="e: no samples"):
        consolidate([*_sources(), empty])


def test_report_json_shape():
    data = report(_sources(), 5.0, lines=True)
    assert data["threshold_pct"] == 5.0 and data["basis"] == "self_pct" and data["rule"] == "occurrence"
    assert [s["label"] for s in data["sources"]] == ["a", "b", "c"]
    assert [s["samples"] for s in data["sources"]] == [10, 20, 4]
    keys = {"name", "file", "line", "min_pct", "max_pct", "avg_pct", "significance", "range_pct", "occurrence"}
    for row in data["functions"] + data["lines"]:
        assert keys | {"flagged"} <= set(row)
    assert data["functions"][0]["name"] == "work"
    assert report(_sources(), 5.0)["lines"] == []
    json.dumps(data)


def test_parse_threshold_and_windows():
    assert parse_threshold("5%") == 5.0
    assert parse_threshold("2.5") == 2.5
    for bad in ("five", "0%", "101%", "-1"):
        with pytest.raises(ValueError):
            parse_threshold(bad)
    assert parse_windows("6x10s") == (6, 10.0)
    assert parse_windows("3x0.5") == (3, 0.5)
    for bad in ("6", "1x10s", "6x0s", "x10", "6x10m"):
        with pytest.raises(ValueError):
            parse_windows(bad)


def test_diff_profiles_matches_frames_by_content():
    early = _profile()
    later = Profile(
        # the same frames, numbered differently, plus a new one
        [early.frames[2], early.frames[0], early.frames[1], Frame("/srv/app.py", "new", 40, 41)],
        [
            StackCount(1, (1, 2), wall=35, cpu=35),  # main;work:12 +5
            StackCount(1, (1, 0), wall=10, cpu=10),  # main;work:13 unchanged
            StackCount(1, (1, 3), wall=7, cpu=7),  # new
        ],
    )
    d = diff_profiles(later, early)
    got = {(s.thread, tuple(d.frames[i].line for i in s.frames)): (s.wall, s.cpu) for s in d.stacks}
    assert got == {(1, (5, 12)): (5, 5), (1, (5, 41)): (7, 7)}  # the waiter's stack went away: dropped


def test_collect_windows_with_a_fake_clock():
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    frames = [Frame("/s.py", "serve", 1, 2), Frame("/s.py", "spike", 5, 6)]
    cumulative = [0, 0]  # serve self, spike self
    per_window = [(10, 0), (5, 5), (10, 0)]
    calls = [0]

    def fetch() -> Profile:
        # Each fetch after the first adds one window's counts and takes 0.25 s.
        if calls[0] > 0:
            serve, spike = per_window[calls[0] - 1]
            cumulative[0] += serve
            cumulative[1] += spike
            now[0] += 0.25
        calls[0] += 1
        stacks = [StackCount(1, (0,), cumulative[0], cumulative[0])]
        if cumulative[1]:
            stacks.append(StackCount(1, (0, 1), cumulative[1], cumulative[1]))
        return Profile(list(frames), stacks)

    seen: list[int] = []
    windows = collect_windows(fetch, 3, 10.0, clock=lambda: now[0], sleep=sleep, progress=lambda i, w: seen.append(i))
    assert seen == [1, 2, 3]
    assert [w.total("cpu") for w in windows] == [10, 10, 10]
    assert slept == [10.0, 9.75, 9.75]  # fixed deadlines: no drift from slow fetches
    shares = [from_profile(w, f"w{i}", "window") for i, w in enumerate(windows)]
    spike = _by_name(consolidate(shares, 5.0))["spike"]
    assert spike.values_pct == (0.0, 50.0, 0.0)
    assert spike.occurrence == pytest.approx(1 / 3)
