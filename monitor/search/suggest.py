"""Suggesters (seed 000, section 2.3): ranked summaries at which to start a search.

A suggester looks at a profile through the profile interface only, so each one
works on a single call tree and on a comparison of two. ``HighCum`` and
``HighBase`` are the paper's two; ``HighBaseSpread`` is ours, for the case both
of them and a top-down search handle badly.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, TypeVar

from dyper.monitor.search.interface import ProfileInterface, base_overlap

S = TypeVar("S")

#: The Performance Consultant's CPU-bottleneck threshold (seed 002: "a 5% threshold").
DEFAULT_THRESHOLD = 0.05


class Suggester(Protocol):
    """Something that ranks starting summaries; ``limit`` keeps the first ones only."""

    name: ClassVar[str]

    def suggest(self, profile: ProfileInterface[S], limit: int | None = None) -> list[S]: ...


class HighCum:
    """Paths of length 1 (functions) by descending cum: starting points for a top-down search."""

    name: ClassVar[str] = "HighCum"

    def suggest(self, profile: ProfileInterface[S], limit: int | None = None) -> list[S]:
        scored = [(profile.cum_of(s), s) for s in profile.initial_summaries()]
        return _ranked(profile, scored, limit)


class HighBase:
    """Paths of length 1 (functions) by descending base: starting points for a bottom-up search."""

    name: ClassVar[str] = "HighBase"

    def suggest(self, profile: ProfileInterface[S], limit: int | None = None) -> list[S]:
        scored = [(profile.base_of(s), s) for s in profile.initial_summaries()]
        return _ranked(profile, scored, limit)


class HighBaseSpread:
    """Functions whose base is high in total but split thin among their callers.

    A search that refines top-down and drops whatever is under a threshold (the
    Performance Consultant's callgraph search, seed 002, or zooming here, which
    drops the cheap tail of a summary's extensions) misses "a single
    resource-intensive function called by numerous parent functions" none of
    whose shares reaches the threshold: 30% of the time spent in one parser
    called from 40 request handlers at under 1% each. HighBase lists such a
    function too, but among the functions a top-down search finds anyway, and
    without saying that nothing about its callers will explain it.

    For each function ``f`` with ``|base| >= threshold * |total|``, the base is
    split among its callers ``m`` by base overlap (the base ``[f]`` shares with
    ``[m, f]``; the occurrences of ``f`` at a root of the tree form one more
    part). Parts of at least the threshold are what a threshold search can
    reach; the rest is *hidden*. Functions are ranked by hidden base, and only
    those whose hidden base itself reaches the threshold are suggested.
    """

    name: ClassVar[str] = "HighBaseSpread"

    def __init__(self, threshold: float = DEFAULT_THRESHOLD) -> None:
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], not {threshold}")
        self.threshold = threshold

    def suggest(self, profile: ProfileInterface[S], limit: int | None = None) -> list[S]:
        bound = self.threshold * abs(profile.total())
        scored: list[tuple[int, int, S]] = []
        for s in profile.initial_summaries():
            base = profile.base_of(s)
            if base <= 0 or base < bound:
                continue
            parts = caller_split(profile, s, at_least=bound)
            hidden = base - sum(share for _, share in parts if abs(share) >= bound)
            if hidden >= bound:
                scored.append((hidden, len(parts), s))
        scored.sort(key=lambda item: (-item[0], -item[1], profile.path_of(item[2])))
        picked = [s for _, _, s in scored]
        return picked if limit is None else picked[:limit]


def caller_split(profile: ProfileInterface[S], summary: S, at_least: float = 0.0) -> list[tuple[S | None, int]]:
    """How the base of ``summary`` divides among its callers, largest part first.

    One ``(top extension, shared base)`` pair per caller, plus ``(None, base)``
    for the occurrences at a root of the tree, which have no caller. The shared
    base is the base overlap of ``summary`` with the extension, so it is exactly
    the cost of ``summary``'s own occurrences under that caller.

    In a monotone profile a part is never larger than the extension's own base,
    so extensions whose base is below ``at_least`` are reported with that base as
    an upper bound instead of being measured exactly: enough to tell that the
    part is under a threshold of ``at_least``, and much cheaper for a function
    with hundreds of callers.
    """
    extensions = profile.top_extension_summaries(summary)
    parts: list[tuple[S | None, int]] = []
    for e in extensions:
        if profile.monotone and profile.base_of(e) < at_least:
            parts.append((e, profile.base_of(e)))
        else:
            parts.append((e, base_overlap(profile, summary, [e])))
    # What no caller shares: the occurrences at a root of the tree.
    at_roots = profile.base_of(summary) - base_overlap(profile, summary, extensions)
    if at_roots != 0:
        parts.append((None, at_roots))
    parts.sort(key=lambda item: -abs(item[1]))
    return parts


#: the suggesters by name, as the search tool's "set suggester" command knows them
SUGGESTERS: dict[str, type[HighCum] | type[HighBase] | type[HighBaseSpread]] = {
    HighCum.name: HighCum,
    HighBase.name: HighBase,
    HighBaseSpread.name: HighBaseSpread,
}


def _ranked(profile: ProfileInterface[S], scored: list[tuple[int, S]], limit: int | None) -> list[S]:
    """Descending by score, ties by path so that the order is the same every time."""
    scored.sort(key=lambda item: (-item[0], profile.path_of(item[1])))
    ranked = [s for _, s in scored]
    return ranked if limit is None else ranked[:limit]
