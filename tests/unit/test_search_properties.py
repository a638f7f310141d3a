"""Property tests of the profile interface, against the paper's definitions evaluated directly.

The reference below names each call-tree node by its full call path (a tuple,
root first) and computes final(S), along(S) and descendants(S) as sets, exactly
as section 2.2 of seed 000 defines them; the implementation under test never
lists a subtree and must agree with it on every random tree.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from dyper.monitor.search import CallTreeProfile, CallTreeSummary, ComparativeProfile, zoom

Node = tuple[str, ...]
Stacks = list[tuple[list[str], int]]

# Few names, so that recursion (a name under itself) and overlap are common.
NAMES = "abcd"

stacks_strategy = st.lists(
    st.tuples(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6), st.integers(min_value=0, max_value=20)),
    min_size=1,
    max_size=10,
)
paths_strategy = st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4).map(tuple), min_size=1, max_size=4)

SETTINGS = settings(max_examples=150, deadline=None)


# --- the reference: the paper's definitions over explicit node sets -------------------


def tree_of(stacks: Stacks) -> dict[Node, int]:
    """Node (full path) -> own cost. A stack without cost adds no node, as in the implementation."""
    cost: dict[Node, int] = {}
    for frames, c in stacks:
        if c == 0:
            continue
        for i in range(1, len(frames) + 1):
            cost.setdefault(tuple(frames[:i]), 0)
        cost[tuple(frames)] += c
    return cost


def final(tree: dict[Node, int], path: Sequence[str]) -> set[Node]:
    k = len(path)
    return {n for n in tree if n[-k:] == tuple(path)}


def along(tree: dict[Node, int], path: Sequence[str]) -> set[Node]:
    return {f[: len(f) - j] for f in final(tree, path) for j in range(len(path))}


def descendants(tree: dict[Node, int], finals: set[Node]) -> set[Node]:
    return {n for n in tree for f in finals if len(n) > len(f) and n[: len(f)] == f}


def ref_base(tree: dict[Node, int], paths: Sequence[Sequence[str]]) -> int:
    nodes = set().union(*(along(tree, p) for p in paths))
    return sum(tree[n] for n in nodes)


def ref_cum(tree: dict[Node, int], paths: Sequence[Sequence[str]]) -> int:
    nodes = set().union(*(along(tree, p) for p in paths))
    finals = set().union(*(final(tree, p) for p in paths))
    return sum(tree[n] for n in nodes | descendants(tree, finals))


def present(p: CallTreeProfile, paths: Sequence[Sequence[str]]) -> list[CallTreeSummary]:
    found = (p.summary(path) for path in paths)
    return [s for s in found if s is not None]


# --- agreement with the definitions ---------------------------------------------------


@SETTINGS
@given(stacks_strategy, paths_strategy)
def test_metrics_match_the_definitions(stacks: Stacks, paths: list[tuple[str, ...]]) -> None:
    p = CallTreeProfile.from_stacks(stacks)
    tree = tree_of(stacks)
    assert p.total() == sum(tree.values())
    for path in paths:
        s = p.summary(path)
        assert (s is None) == (not final(tree, path))
        if s is not None:
            assert len(s) == len(final(tree, path))
            assert p.base_of(s) == ref_base(tree, [path])
            assert p.cum_of(s) == ref_cum(tree, [path])
    summaries = present(p, paths)
    if summaries:
        found = [s.path for s in summaries]
        assert p.total_base_of(summaries) == ref_base(tree, found)
        assert p.total_cum_of(summaries) == ref_cum(tree, found)
        assert p.total_cum_of_prefixes(summaries) == [ref_cum(tree, found[:n]) for n in range(1, len(found) + 1)]


@SETTINGS
@given(stacks_strategy, paths_strategy)
def test_listed_extensions_match_the_definitions(stacks: Stacks, paths: list[tuple[str, ...]]) -> None:
    """The cums of a listing's extensions are worked out together, for all of them at once."""
    p = CallTreeProfile.from_stacks(stacks)
    tree = tree_of(stacks)
    for s in present(p, paths) + p.initial_summaries():
        for listed in (p.top_extension_summaries(s), p.bottom_extension_summaries(s)):
            for e in listed:
                assert p.cum_of(e) == ref_cum(tree, [e.path])
                assert p.base_of(e) == ref_base(tree, [e.path])
            found = [e.path for e in listed]
            assert p.total_cum_of_prefixes(listed) == [ref_cum(tree, found[:n]) for n in range(1, len(found) + 1)]


@SETTINGS
@given(stacks_strategy, paths_strategy)
def test_collapsed_text_in_any_order_gives_the_same_profile(stacks: Stacks, paths: list[tuple[str, ...]]) -> None:
    direct = CallTreeProfile.from_stacks(stacks)
    lines = [f"{';'.join(frames)} {c}" for frames, c in stacks]
    for text in (lines, sorted(lines), list(reversed(lines))):
        loaded = CallTreeProfile.from_collapsed(text)
        assert loaded.total() == direct.total()
        for path in paths:
            a, b = direct.summary(path), loaded.summary(path)
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert (direct.base_of(a), direct.cum_of(a)) == (loaded.base_of(b), loaded.cum_of(b))


# --- invariants of a non-negative profile ----------------------------------------------


@SETTINGS
@given(stacks_strategy, paths_strategy)
def test_invariants(stacks: Stacks, paths: list[tuple[str, ...]]) -> None:
    p = CallTreeProfile.from_stacks(stacks)
    summaries = present(p, paths) + p.initial_summaries()
    for s in summaries:
        assert 0 <= p.base_of(s) <= p.cum_of(s) <= p.total()
    assert p.total_cum_of(summaries) <= sum(p.cum_of(s) for s in summaries)
    assert p.total_base_of(summaries) <= sum(p.base_of(s) for s in summaries)
    assert p.total_cum_of(p.initial_summaries()) == p.total()
    # Length-1 summaries of different names never share a node: no overlap in base.
    initial = p.initial_summaries()
    assert p.total_base_of(initial) == sum(p.base_of(s) for s in initial) == p.total()


@SETTINGS
@given(stacks_strategy)
def test_the_root_holds_the_whole_cost(stacks: Stacks) -> None:
    rooted = [(["root", *frames], c) for frames, c in stacks]
    p = CallTreeProfile.from_stacks(rooted)
    root = p.summary(["root"])
    if p.total() == 0:
        assert root is None
    else:
        assert root is not None and p.cum_of(root) == p.total() == sum(c for _, c in stacks)


@SETTINGS
@given(stacks_strategy, paths_strategy)
def test_extensions_and_trims_agree_with_explicit_sequences(stacks: Stacks, paths: list[tuple[str, ...]]) -> None:
    p = CallTreeProfile.from_stacks(stacks)
    for s in present(p, paths):
        tops = p.top_extension_summaries(s)
        assert [t.path[0] for t in tops] == p.top_extensions(s)
        for t in tops:
            assert t.path == (t.path[0], *s.path)
            same = p.summary(t.path)
            assert same is not None and (same.finals, same.roots) == (t.finals, t.roots)
            assert p.extend_top(s, t.path[0]).finals == t.finals
            back = p.trim_top(t)
            assert back is not None and back.finals == s.finals
        bottoms = p.bottom_extension_summaries(s)
        assert [b.path[-1] for b in bottoms] == p.bottom_extensions(s)
        for b in bottoms:
            same = p.summary(b.path)
            assert same is not None and (same.finals, same.roots) == (b.finals, b.roots)
            assert p.extend_bottom(s, b.path[-1]).finals == b.finals
            back = p.trim_bottom(b)
            assert back is not None and back.finals == s.finals
        if len(s.path) == 1:
            assert p.trim_top(s) is None and p.trim_bottom(s) is None


@SETTINGS
@given(stacks_strategy, paths_strategy, st.sampled_from(["top", "bottom"]), st.booleans())
def test_zoom_lists_summaries_at_the_right_end(
    stacks: Stacks, paths: list[tuple[str, ...]], direction: str, trim: bool
) -> None:
    p = CallTreeProfile.from_stacks(stacks)
    for s in present(p, paths):
        listed = zoom(p, s, direction, trim=trim)  # type: ignore[arg-type]
        for z in listed:
            if trim:
                assert len(z.path) < len(s.path)
                assert (s.path[-len(z.path) :] if direction == "top" else s.path[: len(z.path)]) == z.path
            else:
                assert len(z.path) > len(s.path)
                assert (z.path[-len(s.path) :] if direction == "top" else z.path[: len(s.path)]) == s.path
        cums = [abs(p.cum_of(z)) for z in listed]
        if len({len(z.path) for z in listed}) == 1:
            assert cums == sorted(cums, reverse=True)


# --- comparative profiles --------------------------------------------------------------


@SETTINGS
@given(stacks_strategy, paths_strategy)
def test_a_profile_minus_itself_is_zero(stacks: Stacks, paths: list[tuple[str, ...]]) -> None:
    p = CallTreeProfile.from_stacks(stacks)
    cp = ComparativeProfile(p, p)
    assert cp.total() == 0
    summaries = [s for s in (cp.summary(path) for path in paths) if s is not None] + cp.initial_summaries()
    for s in summaries:
        assert cp.base_of(s) == 0 and cp.cum_of(s) == 0
        for e in cp.top_extension_summaries(s) + cp.bottom_extension_summaries(s):
            assert cp.base_of(e) == 0 and cp.cum_of(e) == 0
    assert cp.total_cum_of(summaries) == cp.total_base_of(summaries) == 0


@SETTINGS
@given(stacks_strategy, stacks_strategy, paths_strategy)
def test_comparative_is_a_minus_b(a_stacks: Stacks, b_stacks: Stacks, paths: list[tuple[str, ...]]) -> None:
    a, b = CallTreeProfile.from_stacks(a_stacks), CallTreeProfile.from_stacks(b_stacks)
    cp = ComparativeProfile(a, b)
    assert cp.total() == a.total() - b.total()

    def cum(p: CallTreeProfile, path: Sequence[str]) -> int:
        s = p.summary(path)
        return 0 if s is None else p.cum_of(s)

    def base(p: CallTreeProfile, path: Sequence[str]) -> int:
        s = p.summary(path)
        return 0 if s is None else p.base_of(s)

    summaries = []
    for path in paths:
        s = cp.summary(path)
        assert (s is None) == (a.summary(path) is None and b.summary(path) is None)
        if s is None:
            continue
        summaries.append(s)
        assert cp.cum_of(s) == cum(a, path) - cum(b, path)
        assert cp.base_of(s) == base(a, path) - base(b, path)
        names = set(a.top_extensions(s.a) if s.a else []) | set(b.top_extensions(s.b) if s.b else [])
        assert cp.top_extensions(s) == sorted(names)
        for e in cp.top_extension_summaries(s):
            assert cp.cum_of(e) == cum(a, e.path) - cum(b, e.path)
    if summaries:
        found = [s.path for s in summaries]
        expected = ref_cum(tree_of(a_stacks), found) - ref_cum(tree_of(b_stacks), found)
        assert cp.total_cum_of(summaries) == expected
        assert cp.total_cum_of_prefixes(summaries)[-1] == expected
        assert cp.total_base_of(summaries) == ref_base(tree_of(a_stacks), found) - ref_base(tree_of(b_stacks), found)
