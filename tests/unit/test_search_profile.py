"""The profile interface of seed 000 (BOTTLENECKS) on call trees, checked against the paper's numbers.

Figure 2's call tree, as the paper's worked numbers pin it down::

    a,1
    +-- b,2
    |   +-- c,5
    |       +-- d,30
    |       +-- e,52
    +-- c,10

"[c] has two roots: namely, the two nodes labeled c ... the only root of [c;d] is
the left node labeled c"; base_of([c]) = 15, cum_of([c]) = 97; for S = {[a], [c]},
total_base_of(S) = 16 and total_cum_of(S) = 100.
"""

from __future__ import annotations

import pytest

from dyper.monitor.exports import Collapsed
from dyper.monitor.model.frames import Frame
from dyper.monitor.model.profile import Profile, StackCount
from dyper.monitor.search import (
    SUGGESTERS,
    CallTreeProfile,
    CallTreeSummary,
    ComparativeProfile,
    HighBase,
    HighBaseSpread,
    HighCum,
    base_overlap,
    caller_split,
    cum_overlap,
    function_key,
    zoom,
)

FIGURE_2 = """\
a 1
a;b 2
a;b;c 5
a;b;c;d 30
a;b;c;e 52
a;c 10
"""


@pytest.fixture
def fig2() -> CallTreeProfile:
    return CallTreeProfile.from_collapsed(FIGURE_2)


def summary(p: CallTreeProfile, *path: str) -> CallTreeSummary:
    s = p.summary(path)
    assert s is not None, path
    return s


# --- the paper's worked numbers ------------------------------------------------------


def test_figure_2_initial_summaries_are_the_five_functions(fig2: CallTreeProfile) -> None:
    assert [fig2.path_of(s) for s in fig2.initial_summaries()] == [("a",), ("b",), ("c",), ("d",), ("e",)]
    assert fig2.node_count == 6
    assert fig2.total() == 100


def test_figure_2_summary_c(fig2: CallTreeProfile) -> None:
    c = summary(fig2, "c")
    assert len(c) == 2  # two roots: both nodes labelled c
    assert fig2.base_of(c) == 15
    assert fig2.cum_of(c) == 97
    assert fig2.top_extensions(c) == ["a", "b"]
    assert fig2.bottom_extensions(c) == ["d", "e"]


def test_figure_2_only_root_of_c_d_is_the_left_c(fig2: CallTreeProfile) -> None:
    cd = summary(fig2, "c", "d")
    assert len(cd) == 1
    (root,) = cd.roots
    # the root is the c under b (cost 5), whose parent is b
    b = summary(fig2, "b")
    assert fig2._parent[root] == b.finals[0]
    assert fig2._cost[root] == 5


def test_figure_2_total_of_a_and_c(fig2: CallTreeProfile) -> None:
    s = [summary(fig2, "a"), summary(fig2, "c")]
    assert fig2.total_base_of(s) == 16
    assert fig2.total_cum_of(s) == 100


def test_base_and_cum_count_every_node_along_the_path(fig2: CallTreeProfile) -> None:
    """base = cost of along(s), cum = along(s) | descendants(s): interior nodes count by their own cost."""
    cd = summary(fig2, "c", "d")
    assert fig2.base_of(cd) == 5 + 30
    assert fig2.cum_of(cd) == 5 + 30
    bcd = summary(fig2, "b", "c", "d")
    assert fig2.base_of(bcd) == 2 + 5 + 30
    assert fig2.cum_of(bcd) == 37
    assert fig2.cum_of(summary(fig2, "a", "b", "c", "d")) == 38
    bc = summary(fig2, "b", "c")
    assert fig2.base_of(bc) == 7
    assert fig2.cum_of(bc) == 2 + 5 + 30 + 52
    assert fig2.cum_of(summary(fig2, "a")) == 100
    assert fig2.base_of(summary(fig2, "a")) == 1


def test_summary_of_a_sequence_that_never_occurs(fig2: CallTreeProfile) -> None:
    assert fig2.summary(["d", "c"]) is None
    assert fig2.summary(["nope"]) is None
    assert fig2.summary([]) is None
    assert fig2.summary(["a", "d"]) is None  # d is below a, but not a child of it


# --- overlap -------------------------------------------------------------------------


def test_overlap_is_counted_once(fig2: CallTreeProfile) -> None:
    c, a, b = summary(fig2, "c"), summary(fig2, "a"), summary(fig2, "b")
    # everything c costs is inside a
    assert cum_overlap(fig2, c, [a]) == 97
    # b's subtree {b, c5, d, e} = 89 and c's {c5, d, e, c10} = 97 share c5, d, e
    assert fig2.total_cum_of([b, c]) == 99
    assert cum_overlap(fig2, b, [c]) == 87
    # [c d] and [c e] share their interior node c5
    cd, ce = summary(fig2, "c", "d"), summary(fig2, "c", "e")
    assert fig2.total_base_of([cd, ce]) == 5 + 30 + 52
    assert base_overlap(fig2, cd, [ce]) == 5
    assert cum_overlap(fig2, cd, [ce]) == 5
    # the same summary twice is counted once
    assert fig2.total_cum_of([c, c]) == 97
    assert fig2.total_base_of([c, c]) == 15
    assert fig2.total_cum_of([]) == 0


RECURSIVE = """\
a 1
a;f 2
a;f;g 4
a;f;g;f 8
a;f;g;f;g 16
"""


def test_recursion_is_not_counted_twice() -> None:
    p = CallTreeProfile.from_collapsed(RECURSIVE)
    f, g = summary(p, "f"), summary(p, "g")
    assert len(f) == 2 and len(g) == 2
    assert p.cum_of(f) == 30  # not 30 + 24: the inner f is inside the outer one
    assert p.base_of(f) == 2 + 8
    assert p.cum_of(g) == 28
    fg = summary(p, "f", "g")
    assert len(fg) == 2
    assert p.base_of(fg) == 2 + 4 + 8 + 16
    assert p.cum_of(fg) == 30
    gf = summary(p, "g", "f")
    assert len(gf) == 1
    assert p.base_of(gf) == 12
    assert p.cum_of(gf) == 28
    assert p.total_cum_of([f, g]) == 30
    assert p.total_base_of([f, g]) == 30
    assert p.total_cum_of([gf, summary(p, "a")]) == 31
    assert p.total_cum_of_prefixes([g, gf, f]) == [28, 28, 30]


def test_recursion_with_a_repeated_name_in_the_path() -> None:
    p = CallTreeProfile.from_collapsed("r;f 1\nr;f;f 2\nr;f;f;f 4\nr;f;f;f;x 8\n")
    ff = summary(p, "f", "f")
    assert len(ff) == 2  # (f1, f2) and (f2, f3)
    assert p.base_of(ff) == 1 + 2 + 4
    assert p.cum_of(ff) == 15
    fff = summary(p, "f", "f", "f")
    assert p.base_of(fff) == 7
    assert p.cum_of(fff) == 15
    assert p.cum_of(summary(p, "f", "x")) == 12
    assert p.cum_of(summary(p, "r")) == p.total() == 15


# --- extensions and trims ------------------------------------------------------------


def test_extensions(fig2: CallTreeProfile) -> None:
    c = summary(fig2, "c")
    bc = fig2.extend_top(c, "b")
    assert fig2.path_of(bc) == ("b", "c")
    assert fig2.cum_of(bc) == 89
    ce = fig2.extend_bottom(c, "e")
    assert fig2.path_of(ce) == ("c", "e")
    assert fig2.base_of(ce) == 57
    assert [fig2.path_of(s) for s in fig2.top_extension_summaries(c)] == [("a", "c"), ("b", "c")]
    assert [fig2.path_of(s) for s in fig2.bottom_extension_summaries(c)] == [("c", "d"), ("c", "e")]
    with pytest.raises(ValueError, match="not a top extension"):
        fig2.extend_top(c, "d")
    with pytest.raises(ValueError, match="not a bottom extension"):
        fig2.extend_bottom(c, "a")
    a = summary(fig2, "a")
    assert fig2.top_extensions(a) == []  # a is the root
    assert fig2.top_extension_summaries(a) == []
    assert fig2.bottom_extensions(summary(fig2, "d")) == []


def test_trims(fig2: CallTreeProfile) -> None:
    abcd = summary(fig2, "a", "b", "c", "d")
    bcd = fig2.trim_top(abcd)
    assert bcd is not None and fig2.path_of(bcd) == ("b", "c", "d")
    abc = fig2.trim_bottom(abcd)
    assert abc is not None and fig2.path_of(abc) == ("a", "b", "c")
    # trimming finds every occurrence of the shorter path, not only those of the longer one
    c = fig2.trim_bottom(summary(fig2, "c", "d"))
    assert c is not None and len(c) == 2 and fig2.cum_of(c) == 97
    assert fig2.trim_top(summary(fig2, "c")) is None
    assert fig2.trim_bottom(summary(fig2, "c")) is None
    # a trim undoes an extension
    again = fig2.trim_top(fig2.extend_top(summary(fig2, "c", "d"), "b"))
    assert again == summary(fig2, "c", "d") and again is not None and again.finals == summary(fig2, "c", "d").finals


# --- comparative profiles ------------------------------------------------------------


def test_comparative_values_may_be_negative_and_cum_below_base(fig2: CallTreeProfile) -> None:
    slower = CallTreeProfile.from_collapsed("a 1\na;b 2\na;b;c 5\na;b;c;d 50\na;c 10\na;x 7\n")
    cp = ComparativeProfile(fig2, slower)
    d = cp.summary(["d"])
    assert d is not None and cp.base_of(d) == -20 and cp.cum_of(d) == -20
    e = cp.summary(["e"])  # only in A
    assert e is not None and e.b is None and cp.base_of(e) == 52
    x = cp.summary(["x"])  # only in B
    assert x is not None and x.a is None and cp.cum_of(x) == -7
    c = cp.summary(["c"])
    assert c is not None and cp.base_of(c) == 0 and cp.cum_of(c) == 97 - 65
    assert cp.total() == 100 - 75
    assert cp.bottom_extensions(c) == ["d", "e"]
    assert cp.top_extensions(c) == ["a", "b"]
    assert [s.path for s in cp.initial_summaries()] == [("a",), ("b",), ("c",), ("d",), ("e",), ("x",)]
    ce = cp.extend_bottom(c, "e")
    assert ce.b is None and cp.cum_of(ce) == 57
    with pytest.raises(ValueError):
        cp.extend_bottom(c, "x")
    assert cp.total_cum_of([d, x]) == (30 - 50) - 7
    assert cp.total_cum_of_prefixes([d, x, e]) == [-20, -27, 25]
    # a trim finds the shorter path on a side that lacks the longer one
    trimmed = cp.trim_bottom(ce)
    assert trimmed is not None and trimmed.b is not None and cp.cum_of(trimmed) == 32

    cheap = CallTreeProfile.from_collapsed("c 15\nc;d 5\n")
    dear = CallTreeProfile.from_collapsed("c 5\nc;d 45\n")
    both = ComparativeProfile(cheap, dear)
    c2 = both.summary(["c"])
    assert c2 is not None
    assert both.base_of(c2) == 10
    assert both.cum_of(c2) == -30  # cum below base


def test_comparative_of_a_profile_with_itself_is_zero(fig2: CallTreeProfile) -> None:
    cp = ComparativeProfile(fig2, fig2)
    for s in cp.initial_summaries():
        assert cp.base_of(s) == 0 and cp.cum_of(s) == 0
        for e in cp.top_extension_summaries(s) + cp.bottom_extension_summaries(s):
            assert cp.cum_of(e) == 0
    assert cp.total() == 0


# --- zooming -------------------------------------------------------------------------


def test_zoom_worked_example(fig2: CallTreeProfile) -> None:
    """Section 2.3: from [c d], zooming lists [a b c d] instead of [b c d].

    The pseudocode alone would list nothing here (see monitor/search/zoom.py).
    """
    zoomed = zoom(fig2, summary(fig2, "c", "d"), "top")
    assert [fig2.path_of(s) for s in zoomed] == [("a", "b", "c", "d")]


def test_zoom_lists_the_prefix_that_concentrates_the_cost(fig2: CallTreeProfile) -> None:
    c = summary(fig2, "c")
    # [b c] (89) alone is below 0.95 * 97; with [a c] (11) the union is 100
    assert [s.path for s in zoom(fig2, c, "top")] == [("b", "c"), ("a", "c")]
    # the bottom extensions hold 87 of 97 ({c5, d, e}), never 0.95 of it: all are listed (departure 2)
    assert [s.path for s in zoom(fig2, c, "bottom")] == [("c", "e"), ("c", "d")]
    # with a low cutoff [c e] alone concentrates the cost and is zoomed through
    assert [s.path for s in zoom(fig2, c, "bottom", cutoff=0.5)] == [("c", "e")]
    # zooming through two levels, then stopping at two extensions that together reach 80
    a = summary(fig2, "a")
    assert [s.path for s in zoom(fig2, a, "bottom", cutoff=0.8)] == [("a", "b", "c", "e"), ("a", "b", "c", "d")]
    assert zoom(fig2, a, "top") == []
    assert zoom(fig2, summary(fig2, "d"), "bottom") == []


def test_zoom_trims(fig2: CallTreeProfile) -> None:
    abcd = summary(fig2, "a", "b", "c", "d")  # cum 38, so C = 36.1
    # [b c d] (37) reaches C and is zoomed through; [c d] (35) does not
    assert [s.path for s in zoom(fig2, abcd, "top", trim=True)] == [("b", "c", "d")]
    # [a b c] has cum 90: zoomed through, then [a b] (90), then [a] (100)
    assert [s.path for s in zoom(fig2, abcd, "bottom", trim=True)] == [("a",)]


def test_zoom_on_a_comparative_profile_uses_absolute_values(fig2: CallTreeProfile) -> None:
    slower = CallTreeProfile.from_collapsed("a 1\na;b 2\na;b;c 5\na;b;c;d 130\na;b;c;e 52\na;c 10\n")
    cp = ComparativeProfile(fig2, slower)
    c = cp.summary(["c"])
    assert c is not None and cp.cum_of(c) == -100
    assert [s.path for s in zoom(cp, c, "bottom")] == [("c", "d")]


def test_zoom_checks_its_arguments(fig2: CallTreeProfile) -> None:
    with pytest.raises(ValueError):
        zoom(fig2, summary(fig2, "c"), "sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        zoom(fig2, summary(fig2, "c"), "top", cutoff=0)


# --- suggesters ----------------------------------------------------------------------


def test_high_cum_and_high_base(fig2: CallTreeProfile) -> None:
    assert [s.path for s in HighCum().suggest(fig2)] == [("a",), ("c",), ("b",), ("e",), ("d",)]
    assert [s.path for s in HighBase().suggest(fig2)] == [("e",), ("d",), ("c",), ("b",), ("a",)]
    assert [s.path for s in HighBase().suggest(fig2, limit=2)] == [("e",), ("d",)]
    assert set(SUGGESTERS) == {"HighCum", "HighBase", "HighBaseSpread"}


def spread_profile() -> CallTreeProfile:
    """parse: 60 in all, 3 under each of 20 handlers; render: 40 under one handler."""
    lines = [f"main;handler{i};parse 3" for i in range(20)]
    lines.append("main;handler0;render 40")
    return CallTreeProfile.from_collapsed("\n".join(lines))


def test_high_base_spread_finds_the_function_split_among_callers() -> None:
    p = spread_profile()
    assert [s.path for s in HighBase().suggest(p, limit=2)] == [("parse",), ("render",)]
    # render's cost is all under one caller, which a top-down search reaches; parse's is not
    assert [s.path for s in HighBaseSpread().suggest(p)] == [("parse",)]
    parts = caller_split(p, summary(p, "parse"))
    assert len(parts) == 20 and {share for _, share in parts} == {3}
    # with a threshold below each caller's share, nothing is hidden
    assert HighBaseSpread(threshold=0.02).suggest(p) == []
    with pytest.raises(ValueError):
        HighBaseSpread(threshold=0)


def test_high_base_spread_counts_occurrences_at_a_root() -> None:
    p = CallTreeProfile.from_collapsed("parse 30\nmain;h1;parse 2\nmain;h2;parse 2\nmain 66\n")
    parts = caller_split(p, summary(p, "parse"))
    assert sorted(parts, key=lambda part: part[1]) == [
        (summary(p, "h1", "parse"), 2),
        (summary(p, "h2", "parse"), 2),
        (None, 30),
    ]
    # 30 at a root is where a top-down search starts; the other 4 are hidden, but under 5%
    assert HighBaseSpread().suggest(p) == []
    # at 3% each, the hidden 6 is over 5%
    p = CallTreeProfile.from_collapsed("parse 30\nmain;h1;parse 3\nmain;h2;parse 3\nmain 64\n")
    assert [s.path for s in HighBaseSpread().suggest(p)] == [("parse",)]


def test_high_base_spread_on_a_comparative_profile() -> None:
    after = spread_profile()
    before = CallTreeProfile.from_collapsed("\n".join([f"main;handler{i};parse 1" for i in range(20)]))
    cp = ComparativeProfile(after, before)
    assert [s.path for s in HighBaseSpread().suggest(cp)] == [("parse",)]


# --- reading profiles ----------------------------------------------------------------


def test_collapsed_input_is_robust() -> None:
    text = (
        "# austin: 3.6\n"
        "\n"
        "a;b 3\n"
        "a;b 2\n"  # repeated stacks add up
        "a;c nope\n"
        "a;c -1\n"
        "a;;c 4\n"
        "justonefield\n"
        "a;c 0\n"  # no cost: no node
        "  a;d\t7  \n"
    )
    p = CallTreeProfile.from_collapsed(text)
    stats = p.collapsed_stats
    assert stats is not None
    assert (stats.lines, stats.blank, stats.comments, stats.malformed) == (10, 1, 1, 4)
    assert sorted(stats.malformed_examples) == ["a;;c 4", "a;c -1", "a;c nope", "justonefield"]
    assert p.cum_of(summary(p, "a", "b")) == 5
    assert p.summary(["c"]) is None
    assert p.cum_of(summary(p, "d")) == 7
    assert p.total() == 12


def test_collapsed_order_does_not_matter() -> None:
    lines = FIGURE_2.splitlines()
    shuffled = CallTreeProfile.from_collapsed(list(reversed(lines)))
    assert shuffled.cum_of(summary(shuffled, "c")) == 97
    assert shuffled.total_cum_of([summary(shuffled, "a"), summary(shuffled, "c")]) == 100


def test_austin_pseudo_frames_and_function_keys() -> None:
    text = "P42;T7f3a:1;app.py:main:3;app.py:work:10 5\nP42;T7f3b:2;app.py:main:4;app.py:work:11 7\nP42;T1 9\n"
    by_line = CallTreeProfile.from_collapsed(text)
    assert sorted(s.path[0] for s in by_line.initial_summaries()) == [
        "app.py:main:3",
        "app.py:main:4",
        "app.py:work:10",
        "app.py:work:11",
    ]
    assert by_line.collapsed_stats is not None and by_line.collapsed_stats.malformed == 1  # no Python frame
    by_function = CallTreeProfile.from_collapsed(text, frame_key="function")
    work = summary(by_function, "app.py:main", "app.py:work")
    assert by_function.cum_of(work) == 12
    kept = CallTreeProfile.from_collapsed(text, strip_austin=False)
    assert kept.summary(["P42"]) is not None
    # Austin's alternative format: the line as a frame of its own
    alt = CallTreeProfile.from_collapsed("P1;T1;app.py:main;L3;app.py:work;L10 5\n", frame_key="function")
    assert alt.cum_of(summary(alt, "app.py:main", "app.py:work")) == 5


def test_function_key() -> None:
    assert function_key("work (app.py:12)") == "work (app.py)"
    assert function_key("Handler.get (/srv/a (1).py:7)") == "Handler.get (/srv/a (1).py)"
    assert function_key("f (a) (b.py:3)") == "f (a) (b.py)"
    assert function_key("app.py:work:12") == "app.py:work"
    assert function_key("<module> (x.py)") == "<module> (x.py)"


def dyper_profile() -> Profile:
    frames = [
        Frame("/app/app.py", "main", 1, 2),
        Frame("/app/app.py", "work", 10, 11),
        Frame("/app/app.py", "work", 10, 14),
        Frame("/app/app.py", "sleep", 20, 21),
    ]
    stacks = [
        StackCount(1, (0, 1), wall=10, cpu=8),
        StackCount(1, (0, 2), wall=5, cpu=5),
        StackCount(2, (0, 3), wall=20, cpu=0),
        StackCount(2, (), wall=3, cpu=3),
    ]
    return Profile(frames, stacks)


def test_from_dyper_profile() -> None:
    profile = dyper_profile()
    cpu = CallTreeProfile.from_profile(profile)
    assert cpu.total() == 13
    work = summary(cpu, "main (/app/app.py)", "work (/app/app.py)")  # the two lines of work merge
    assert len(work) == 1 and cpu.cum_of(work) == 13
    assert cpu.summary(["sleep (/app/app.py)"]) is None  # no cpu: no node
    wall = CallTreeProfile.from_profile(profile, "wall")
    assert wall.total() == 35
    assert wall.cum_of(summary(wall, "sleep (/app/app.py)")) == 20
    by_line = CallTreeProfile.from_profile(profile, frame_key="frame")
    assert by_line.cum_of(summary(by_line, "work (/app/app.py:14)")) == 5
    with pytest.raises(ValueError):
        CallTreeProfile.from_profile(profile, "io")  # type: ignore[arg-type]


def test_from_profile_agrees_with_the_collapsed_export() -> None:
    profile = dyper_profile()
    for metric in ("cpu", "wall"):
        for key in ("function", "frame"):
            direct = CallTreeProfile.from_profile(profile, metric, frame_key=key)  # type: ignore[arg-type]
            exported = CallTreeProfile.from_collapsed(Collapsed(metric).render(profile), frame_key=key)  # type: ignore[arg-type]
            assert sorted(direct.names) == sorted(exported.names)
            both = ComparativeProfile(direct, exported)
            assert all(both.cum_of(s) == 0 and both.base_of(s) == 0 for s in both.initial_summaries())
            assert direct.total() == exported.total()


def test_from_stacks_refuses_negative_costs() -> None:
    with pytest.raises(ValueError):
        CallTreeProfile.from_stacks([(["a"], -1)])
    empty = CallTreeProfile.from_stacks([([], 5), (["a"], 0)])
    assert empty.node_count == 0 and empty.total() == 0 and empty.initial_summaries() == []
