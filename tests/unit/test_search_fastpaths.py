"""The fast paths of the search modules against slow references, on random trees.

The references compute each quantity the plain way (one ``total_cum_of`` per
prefix, one ``extend_*`` per name, the paper's pseudocode for zooming), which
the property tests in ``test_search_properties`` already check against the
definitions; here the trees are larger and the summary lists longer, so that
final nodes nest many levels deep, as under a popular recursive function.
"""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from dyper.monitor.search import CallTreeProfile, CallTreeSummary, ComparativeProfile, zoom
from dyper.monitor.search.zoom import Direction

NAMES = "abcdef"
Stacks = list[tuple[list[str], int]]
Paths = list[tuple[str, ...]]

stacks_strategy = st.lists(
    st.tuples(st.lists(st.sampled_from(NAMES), min_size=1, max_size=9), st.integers(min_value=0, max_value=30)),
    min_size=1,
    max_size=40,
)
paths_strategy = st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(tuple), min_size=1, max_size=8)

SETTINGS = settings(max_examples=200, deadline=None)


def summaries_of(p: CallTreeProfile, paths: list[tuple[str, ...]]) -> list[CallTreeSummary]:
    found = (p.summary(path) for path in paths)
    return [s for s in found if s is not None]


def reference_zoom(
    p: CallTreeProfile, s: CallTreeSummary, direction: Direction, cutoff: float = 0.95
) -> list[CallTreeSummary]:
    """zoom() as its docstring specifies it, with one total_cum_of per prefix."""
    neighbours = p.top_extension_summaries if direction == "top" else p.bottom_extension_summaries

    def ranked(x: CallTreeSummary) -> list[CallTreeSummary]:
        return sorted(neighbours(x), key=lambda e: (-abs(p.cum_of(e)), e.path))

    def prefix(listed: list[CallTreeSummary], bound: float) -> list[CallTreeSummary] | None:
        for n in range(1, len(listed) + 1):
            if abs(p.total_cum_of(listed[:n])) >= bound:
                return listed[:n]
        return None

    bound = cutoff * abs(p.cum_of(s))
    listed = ranked(s)
    if bound == 0:
        return listed
    chosen = prefix(listed, bound)
    if chosen is None:
        return listed
    while len(chosen) == 1:
        current = chosen[0]
        chosen = prefix(ranked(current), bound)
        if chosen is None:
            return [current]
    return chosen


@SETTINGS
@given(stacks_strategy, paths_strategy)
def test_prefix_totals_match_one_total_per_prefix(stacks: Stacks, paths: Paths) -> None:
    p = CallTreeProfile.from_stacks(stacks)
    for summaries in [summaries_of(p, paths), *(p.top_extension_summaries(s) for s in summaries_of(p, paths))]:
        expected = [p.total_cum_of(summaries[:n]) for n in range(1, len(summaries) + 1)]
        assert p.total_cum_of_prefixes(summaries) == expected
        assert p.total_cum_of(summaries) == (expected[-1] if expected else 0)


@SETTINGS
@given(stacks_strategy, paths_strategy)
def test_summaries_under_another_add_nothing_to_a_total(stacks: Stacks, paths: Paths) -> None:
    p = CallTreeProfile.from_stacks(stacks)
    found = summaries_of(p, paths)
    under: list[CallTreeSummary] = []
    for s in found:
        under += p.bottom_extension_summaries(s)
    everything = found + under + found
    # total_cum_of drops the summaries whose path starts with another's; the sweep over all of them agrees.
    assert p.total_cum_of(everything) == (p._total_cum_of(everything) if everything else 0)


@SETTINGS
@given(stacks_strategy, paths_strategy, st.sampled_from([0, 1, 4096]))
def test_lazy_prefix_totals_match_one_total_per_prefix(stacks: Stacks, paths: Paths, first_batch: int) -> None:
    p = CallTreeProfile.from_stacks(stacks)
    found = summaries_of(p, paths)
    with mock.patch("dyper.monitor.search.calltree._FIRST_BATCH", first_batch):
        for summaries in [found, *(p.top_extension_summaries(s) for s in found)]:
            p.clear_caches()
            expected = [p.total_cum_of(summaries[:n]) for n in range(1, len(summaries) + 1)]
            assert list(p.iter_total_cum_of_prefixes(summaries)) == expected


@SETTINGS
@given(stacks_strategy, paths_strategy)
def test_extension_summaries_match_one_extension_per_name(stacks: Stacks, paths: Paths) -> None:
    p = CallTreeProfile.from_stacks(stacks)
    for s in summaries_of(p, paths) + p.initial_summaries():
        tops = p.top_extension_summaries(s)
        assert [t.path for t in tops] == [(m, *s.path) for m in p.top_extensions(s)]
        for t in tops:
            e = p.extend_top(s, t.path[0])
            assert (t.finals, t.roots) == (e.finals, e.roots)
            assert p.cum_of(t) == p.total_cum_of([t, t]) and p.base_of(t) == p.total_base_of([t])
        bottoms = p.bottom_extension_summaries(s)
        assert [b.path for b in bottoms] == [(*s.path, m) for m in p.bottom_extensions(s)]
        for b in bottoms:
            e = p.extend_bottom(s, b.path[-1])
            assert (b.finals, b.roots) == (e.finals, e.roots)
            assert p.cum_of(b) == p.total_cum_of([b, b]) and p.base_of(b) == p.total_base_of([b])


class WithoutLazyPrefixes:
    """A profile that offers only the interface's total_cum_of_prefixes, as a third-party one might."""

    def __init__(self, profile: CallTreeProfile) -> None:
        self.profile = profile

    def __getattr__(self, name: str) -> object:
        if name in ("iter_total_cum_of_prefixes", "ranked_extensions"):
            raise AttributeError(name)
        return getattr(self.profile, name)


@SETTINGS
@given(stacks_strategy, paths_strategy, st.sampled_from(["top", "bottom"]), st.sampled_from([0.5, 0.8, 0.95]))
def test_zoom_matches_the_reference(stacks: Stacks, paths: Paths, direction: Direction, cutoff: float) -> None:
    p = CallTreeProfile.from_stacks(stacks)
    for s in summaries_of(p, paths):
        expected = [z.path for z in reference_zoom(p, s, direction, cutoff)]
        assert [z.path for z in zoom(p, s, direction, cutoff)] == expected
        plain = WithoutLazyPrefixes(p)
        assert [z.path for z in zoom(plain, s, direction, cutoff)] == expected  # type: ignore[arg-type]


@SETTINGS
@given(stacks_strategy, stacks_strategy, paths_strategy)
def test_comparative_prefix_totals_match_one_total_per_prefix(a: Stacks, b: Stacks, paths: Paths) -> None:
    cp = ComparativeProfile(CallTreeProfile.from_stacks(a), CallTreeProfile.from_stacks(b))
    found = [s for s in (cp.summary(path) for path in paths) if s is not None]
    for summaries in [found, *(cp.top_extension_summaries(s) for s in found)]:
        expected = [cp.total_cum_of(summaries[:n]) for n in range(1, len(summaries) + 1)]
        assert cp.total_cum_of_prefixes(summaries) == expected
        assert list(cp.iter_total_cum_of_prefixes(summaries)) == expected


def test_cached_answers_are_copies_and_clear_caches_forgets() -> None:
    p = CallTreeProfile.from_stacks([(["a", "b"], 3), (["c", "b"], 4), (["b", "d"], 5)])
    b = p.summary(["b"])
    assert b is not None
    first = p.top_extension_summaries(b)
    first.clear()
    assert [s.path for s in p.top_extension_summaries(b)] == [("a", "b"), ("c", "b")]
    tops = p.top_extension_summaries(b)
    totals = p.total_cum_of_prefixes(tops)
    totals.append(-1)
    assert p.total_cum_of_prefixes(tops) == [3, 7]
    assert p.cum_of(b) == 12 and p.total_cum_of(tops) == 7
    p.clear_caches()
    assert p.cum_of(b) == 12 and p.total_cum_of(tops) == 7 and p.total_cum_of_prefixes(tops) == [3, 7]


@SETTINGS
@given(stacks_strategy, stacks_strategy, paths_strategy)
def test_comparative_listings_pair_the_two_sides(a: Stacks, b: Stacks, paths: Paths) -> None:
    pa, pb = CallTreeProfile.from_stacks(a), CallTreeProfile.from_stacks(b)
    cp = ComparativeProfile(pa, pb)
    found = [s for s in (cp.summary(path) for path in paths) if s is not None] + cp.initial_summaries()
    for s in found:
        for listed in (cp.top_extension_summaries(s), cp.bottom_extension_summaries(s)):
            assert [e.path for e in listed] == sorted({e.path for e in listed})
            for e in listed:
                in_a, in_b = pa.summary(e.path), pb.summary(e.path)
                assert (e.a is None, e.b is None) == (in_a is None, in_b is None)
                assert e.a is None or in_a is None or e.a.finals == in_a.finals
                assert e.b is None or in_b is None or e.b.finals == in_b.finals
        tops = {(m, *s.path) for m in cp.top_extensions(s)}
        assert {e.path for e in cp.top_extension_summaries(s)} == tops


class WithoutRanking:
    """A comparative profile seen through the profile interface only, so that zoom ranks its listings itself."""

    def __init__(self, profile: ComparativeProfile) -> None:
        self.profile = profile

    def __getattr__(self, name: str) -> object:
        if name == "ranked_extensions":
            raise AttributeError(name)
        return getattr(self.profile, name)


@SETTINGS
@given(
    stacks_strategy,
    stacks_strategy,
    paths_strategy,
    st.sampled_from(["top", "bottom"]),
    st.sampled_from([0.5, 0.8, 0.95]),
    st.sampled_from([1, 16]),
)
def test_comparative_zoom_matches_the_interface_zoom(
    a: Stacks, b: Stacks, paths: Paths, direction: Direction, cutoff: float, first_batch: int
) -> None:
    cp = ComparativeProfile(CallTreeProfile.from_stacks(a), CallTreeProfile.from_stacks(b))
    plain = WithoutRanking(cp)
    with mock.patch("dyper.monitor.search.calltree._FIRST_BATCH", first_batch):
        for s in [s for s in (cp.summary(path) for path in paths) if s is not None]:
            fast = zoom(cp, s, direction, cutoff)
            expected = zoom(plain, s, direction, cutoff)  # type: ignore[arg-type]
            assert [z.path for z in fast] == [z.path for z in expected]
            assert [(z.a is None, z.b is None) for z in fast] == [(z.a is None, z.b is None) for z in expected]


@SETTINGS
@given(stacks_strategy, paths_strategy, st.sampled_from([1, 2, 16]))
def test_ranked_extensions_match_the_interface(stacks: Stacks, paths: Paths, first_batch: int) -> None:
    p = CallTreeProfile.from_stacks(stacks)
    with mock.patch("dyper.monitor.search.calltree._FIRST_BATCH", first_batch):
        for s in summaries_of(p, paths) + p.initial_summaries():
            for direction in ("top", "bottom"):
                p.clear_caches()
                ranked = p.ranked_extensions(s, direction)
                # _cum_of and _total_cum_of work each one out on its own, not from the listing's bulk answers.
                listed = sorted(
                    p.top_extension_summaries(s) if direction == "top" else p.bottom_extension_summaries(s),
                    key=lambda e: (-p._cum_of(e), e.path),
                )
                assert [e.path for e in ranked.summaries()] == [e.path for e in listed]
                assert [e.path for e in ranked.summaries(2)] == [e.path for e in listed[:2]]
                assert ranked.cums == [p._cum_of(e) for e in listed]
                expected = [p._total_cum_of(listed[:n]) for n in range(1, len(listed) + 1)]
                assert list(ranked.prefix_totals()) == expected
                assert list(ranked.prefix_totals()) == expected  # again, from what the first pass kept
