"""Zooming (seed 000, section 2.3): list the nearby summaries worth looking at.

Listing every extension of a summary buries the analyst in cheap ones, and
listing one extension that carries nearly all the cost only costs a keystroke.
Zooming drops the cheap tail (whatever lies beyond the smallest prefix of the
extensions, by descending ``|cum|``, whose total reaches ``cutoff * |cum(s)|``)
and, when that prefix is a single summary, moves through it and looks again.

The paper's pseudocode::

    Zoom(s, c)    = ZoomRec(s, c * |cum_of(s)|)
    ZoomRec(s, C) = T   := top extensions of s, descending by |cum_of|
                    T_c := first N summaries of T, N the smallest with
                           |total_cum_of(T_c)| >= C, or {} if there is none
                    if |T_c| = 1 then return ZoomRec(first(T_c), C) else return T_c

Where this module departs from it (see :func:`zoom`):

1. The worked example and the pseudocode disagree, and the example wins. In
   Figure 2, from [c; d] zooming "would zoom to the 2-method top extension
   [a; b; c; d] instead of listing [b; c; d]". Followed literally, the pseudocode
   returns {} there: [a; b; c; d] has no top extension, so its T_c is {}, and {}
   is what comes back up. Here, when zooming has moved into a summary whose own
   extensions cannot be listed (there are none, or no prefix reaches C), that
   summary is the answer: ``[[a, b, c, d]]``.
2. At the summary the analyst is on, if no prefix of its extensions reaches C,
   the pseudocode lists nothing. That happens whenever more than ``1 - c`` of
   the summary's cum is in none of its extensions (final nodes without
   children, for bottom extensions; occurrences at a root of the tree, for top
   ones): the bottom extensions of [c] in Figure 2 hold 87 of its 97 (the c
   called from a, 10, has no callee), so [c; e] and [c; d] would be hidden.
   Our choice, not the paper's: list all of them. Nothing is "low cost" next to
   a total that no set of them reaches.
3. A summary with cum 0 gives C = 0, which the first extension always reaches,
   so the pseudocode would zoom through arbitrary zero-cost extensions. Here its
   extensions are listed as they are.

Trimmings zoom the same way (``trim=True``): the one trimmed summary is zoomed
through while its cum reaches C. In a single profile a shorter path usually
has a larger cum, so this runs down to the path of length 1 unless the cum falls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal, TypeVar

from monitor.search.interface import ProfileInterface

S = TypeVar("S")

Direction = Literal["top", "bottom"]

#: the paper's default cutoff ratio
DEFAULT_CUTOFF = 0.95


def zoom(
    profile: ProfileInterface[S],
    summary: S,
    direction: Direction = "top",
    cutoff: float = DEFAULT_CUTOFF,
    *,
    trim: bool = False,
) -> list[S]:
    """The summaries to list next to ``summary``: its zoomed extensions (or trimmings) at one end.

    ``direction="top"`` extends (or trims) at the root side of the path, towards
    callers; ``"bottom"`` at the leaf side, towards callees. The result is in
    descending ``|cum|`` order, ties by path.
    """
    if direction not in ("top", "bottom"):
        raise ValueError(f"direction must be 'top' or 'bottom', not {direction!r}")
    if cutoff <= 0:
        raise ValueError(f"the cutoff ratio must be positive, not {cutoff}")
    neighbours = _neighbours(profile, direction, trim)
    bound = cutoff * abs(profile.cum_of(summary))
    ranked = _ranked(profile, neighbours(summary))
    if bound == 0:
        return [s for s, _ in ranked]  # departure 3
    chosen = _concentrating_prefix(profile, ranked, bound)
    if chosen is None:
        return [s for s, _ in ranked]  # departure 2
    while len(chosen) == 1:
        current = chosen[0]
        chosen = _concentrating_prefix(profile, _ranked(profile, neighbours(current)), bound)
        if chosen is None:
            return [current]  # departure 1: the worked example
    return chosen


def _neighbours(profile: ProfileInterface[S], direction: Direction, trim: bool) -> Callable[[S], list[S]]:
    if trim:
        trimmer = profile.trim_top if direction == "top" else profile.trim_bottom

        def trimmed(summary: S) -> list[S]:
            shorter = trimmer(summary)
            return [] if shorter is None else [shorter]

        return trimmed
    return profile.top_extension_summaries if direction == "top" else profile.bottom_extension_summaries


def _ranked(profile: ProfileInterface[S], summaries: list[S]) -> list[tuple[S, int]]:
    """Summaries with their cum, by descending |cum| (ties by path, so the order is stable)."""
    with_cum = [(s, profile.cum_of(s)) for s in summaries]
    with_cum.sort(key=lambda item: (-abs(item[1]), profile.path_of(item[0])))
    return with_cum


def _concentrating_prefix(profile: ProfileInterface[S], ranked: list[tuple[S, int]], bound: float) -> list[S] | None:
    """The shortest non-empty prefix whose |total_cum_of| reaches ``bound``, or None if none does.

    Overlap is the expensive part (a popular function has thousands of
    extensions, some nested under each other), and the answer is usually a
    short prefix: the extensions come by descending |cum|. A profile that
    offers ``iter_total_cum_of_prefixes`` (the prefix totals one at a time,
    each worked out when asked for: both of ours do) is asked for them in
    order, and the first total that reaches the bound ends the search. In a
    monotone profile a total never exceeds the sum of the cums it is made of,
    which tells without any overlap computed when no prefix can reach it.
    """
    if not ranked:
        return None
    summaries = [s for s, _ in ranked]
    if abs(ranked[0][1]) >= bound:
        return summaries[:1]  # the common case when zooming through: no overlap to work out
    if profile.monotone and sum(cum for _, cum in ranked) < bound:
        return None  # not even with no overlap at all
    lazy: Callable[[list[S]], Iterator[int]] | None = getattr(profile, "iter_total_cum_of_prefixes", None)
    totals = lazy(summaries) if lazy is not None else profile.total_cum_of_prefixes(summaries)
    for n, total in enumerate(totals, 1):
        if abs(total) >= bound:
            return summaries[:n]
    return None
