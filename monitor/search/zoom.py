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

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Literal, Protocol, TypeVar

from dyper.monitor.search.interface import ProfileInterface

S = TypeVar("S")

Direction = Literal["top", "bottom"]

#: the paper's default cutoff ratio
DEFAULT_CUTOFF = 0.95


class Ranked(Protocol[S]):
    """A summary's neighbours at one end by descending ``|cum|`` (ties by path), as zooming goes through them.

    A profile may offer ``ranked_extensions(summary, direction)`` returning one
    (both of ours do): then a level of zooming costs a few passes over the
    extensions' occurrences, and only the summaries zooming returns are made.
    Otherwise zooming builds one from the profile interface (:class:`_Listed`).
    """

    @property
    def cums(self) -> Sequence[int]:
        """The cum of each neighbour, in ranked order."""
        ...

    def summaries(self, count: int | None = None) -> list[S]:
        """The first ``count`` neighbours (all of them by default), in ranked order."""
        ...

    def prefix_totals(self) -> Iterator[int]:
        """``total_cum_of`` of the first 1, 2, ... neighbours, each worked out when it is asked for."""
        ...


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
    rank = _ranker(profile, direction, trim)
    bound = cutoff * abs(profile.cum_of(summary))
    ranked = rank(summary)
    if bound == 0:
        return ranked.summaries()  # departure 3
    chosen = _concentrating_prefix(profile, ranked, bound)
    if chosen is None:
        return ranked.summaries()  # departure 2
    while chosen == 1:
        current = ranked.summaries(1)[0]
        ranked = rank(current)
        chosen = _concentrating_prefix(profile, ranked, bound)
        if chosen is None:
            return [current]  # departure 1: the worked example
    return ranked.summaries(chosen)


def _ranker(profile: ProfileInterface[S], direction: Direction, trim: bool) -> Callable[[S], Ranked[S]]:
    if trim:
        trimmer = profile.trim_top if direction == "top" else profile.trim_bottom

        def trimmed(summary: S) -> Ranked[S]:
            shorter = trimmer(summary)
            return _Listed(profile, [] if shorter is None else [shorter])

        return trimmed
    ranked_extensions: Callable[[S, Direction], Ranked[S]] | None = getattr(profile, "ranked_extensions", None)
    if ranked_extensions is not None:
        return lambda summary: ranked_extensions(summary, direction)
    neighbours = profile.top_extension_summaries if direction == "top" else profile.bottom_extension_summaries
    return lambda summary: _Listed(profile, neighbours(summary))


class _Listed(Generic[S]):
    """Neighbours ranked through the profile interface alone: one ``cum_of`` each, then a sort."""

    def __init__(self, profile: ProfileInterface[S], neighbours: list[S]) -> None:
        with_cum = [(s, profile.cum_of(s)) for s in neighbours]
        with_cum.sort(key=lambda item: (-abs(item[1]), profile.path_of(item[0])))
        self._profile = profile
        self._summaries = [s for s, _ in with_cum]
        self.cums = [cum for _, cum in with_cum]

    def summaries(self, count: int | None = None) -> list[S]:
        return self._summaries[:count]

    def prefix_totals(self) -> Iterator[int]:
        """From ``iter_total_cum_of_prefixes`` if the profile offers it (both of ours do), else all at once."""
        lazy: Callable[[list[S]], Iterator[int]] | None = getattr(self._profile, "iter_total_cum_of_prefixes", None)
        if lazy is not None:
            return lazy(self._summaries)
        return iter(self._profile.total_cum_of_prefixes(self._summaries))


def _concentrating_prefix(profile: ProfileInterface[Any], ranked: Ranked[Any], bound: float) -> int | None:
    """The length of the shortest non-empty prefix whose |total_cum_of| reaches ``bound``, or None if none does.

    Overlap is the expensive part (a popular function has thousands of
    extensions, some nested under each other), and the answer is usually a
    short prefix: the extensions come by descending |cum|. So the prefix totals
    are asked for in order, and the first that reaches the bound ends the
    search. In a monotone profile a total never exceeds the sum of the cums it
    is made of, which tells without any overlap computed when no prefix can
    reach it.
    """
    cums = ranked.cums
    if not cums:
        return None
    if abs(cums[0]) >= bound:
        return 1  # the common case when zooming through: no overlap to work out
    if profile.monotone and sum(cums) < bound:
        return None  # not even with no overlap at all
    for n, total in enumerate(ranked.prefix_totals(), 1):
        if abs(total) >= bound:
            return n
    return None
