"""The profile interface over the difference of two call trees (seed 000, section 2.2, "Comparing").

A comparative summary is a call sequence with its occurrences in each tree
(the paper's ``{calls; a_roots; b_roots}``); either side may have none. Every
number is the single-tree number for A minus the one for B, so base and cum may
be negative and cum may be below base: the paper exposes these paradoxes
rather than hiding them, and so does this class. Subtrees of A and B are never
matched to each other; only call sequences are, which is the paper's point.

Two runs seldom have as many samples: one that ran 45% longer has 45% more of
everything, and a raw difference then shows every function as slower. With
``normalize=True`` (what the commands and the dashboard use unless asked for
``--raw``) B's counts are brought to A's total before the subtraction, as
pprof's ``-normalize`` does: each number is A's count minus B's count scaled
by ``total(A) / total(B)``, so that a number divided by ``total(A)`` is the
difference of the two shares (each side divided by its own total samples).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import sub
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from dyper.monitor.search.calltree import CallTreeProfile, CallTreeSummary, ExtensionListing, _batch


@dataclass(frozen=True, slots=True)
class ComparativeSummary:
    """A call sequence and its occurrences in A (``a``) and in B (``b``); ``None`` where it does not occur."""

    path: tuple[str, ...]
    a: CallTreeSummary | None = field(compare=False, repr=False)
    b: CallTreeSummary | None = field(compare=False, repr=False)


# Listings make summaries by the thousand (see monitor.search.calltree._summary).
_SUMMARY_SLOTS = tuple(vars(ComparativeSummary)[name].__set__ for name in ("path", "a", "b"))


def _comparative(path: tuple[str, ...], a: CallTreeSummary | None, b: CallTreeSummary | None) -> ComparativeSummary:
    """``ComparativeSummary(path, a, b)``, made faster."""
    summary = object.__new__(ComparativeSummary)
    set_path, set_a, set_b = _SUMMARY_SLOTS
    set_path(summary, path)
    set_a(summary, a)
    set_b(summary, b)
    return summary


class ComparativeProfile:
    """Profile A minus profile B, behind the same interface as :class:`CallTreeProfile`.

    Typically A is the slow run (or the recent window) and B the fast one (or an
    older window): a summary with a high cum is a call sequence that costs more in A.
    """

    #: adding a summary can lower |total_cum_of| (a negative difference)
    monotone = False

    def __init__(self, a: CallTreeProfile, b: CallTreeProfile, *, normalize: bool = False) -> None:
        self.a = a
        self.b = b
        #: ``"total samples"`` when B is brought to A's total before subtracting, else ``"raw"``
        self.normalization = "total samples" if normalize else "raw"
        #: what B's counts are multiplied by (1 when raw)
        self.b_scale = a.total() / b.total() if normalize and b.total() > 0 else 1.0

    def _b(self, value: int) -> int:
        """One of B's counts, scaled to A's total when normalised."""
        return value if self.b_scale == 1.0 else round(value * self.b_scale)

    def _b_array(self, values: NDArray[np.int64]) -> NDArray[np.int64]:
        if self.b_scale == 1.0:
            return values
        return np.rint(np.asarray(values, np.float64) * self.b_scale).astype(np.int64)

    def total(self) -> int:
        return self.a.total() - self._b(self.b.total())

    @property
    def percent_total(self) -> int:
        """What percentages are of: A's total when normalised (they are then differences of shares), else A - B."""
        return self.a.total() if self.normalization != "raw" else self.total()

    def clear_caches(self) -> None:
        """Forget what both sides have cached (what a benchmark of cold calls needs)."""
        self.a.clear_caches()
        self.b.clear_caches()

    # --- summaries -------------------------------------------------------------------

    def summary(self, path: Sequence[str]) -> ComparativeSummary | None:
        """The summary of ``path`` in both trees, or ``None`` if it occurs in neither."""
        path = tuple(path)
        return self._pair(path, self.a.summary(path), self.b.summary(path))

    def path_of(self, summary: ComparativeSummary) -> tuple[str, ...]:
        return summary.path

    def initial_summaries(self) -> list[ComparativeSummary]:
        """One summary per function name in either tree, in name order."""
        in_a = {s.path: s for s in self.a.initial_summaries()}
        in_b = {s.path: s for s in self.b.initial_summaries()}
        return [ComparativeSummary(path, in_a.get(path), in_b.get(path)) for path in sorted(in_a.keys() | in_b.keys())]

    def top_extensions(self, summary: ComparativeSummary) -> list[str]:
        """The union of the top extensions in A and in B."""
        names = set()
        if summary.a is not None:
            names.update(self.a.top_extensions(summary.a))
        if summary.b is not None:
            names.update(self.b.top_extensions(summary.b))
        return sorted(names)

    def bottom_extensions(self, summary: ComparativeSummary) -> list[str]:
        """The union of the bottom extensions in A and in B."""
        names = set()
        if summary.a is not None:
            names.update(self.a.bottom_extensions(summary.a))
        if summary.b is not None:
            names.update(self.b.bottom_extensions(summary.b))
        return sorted(names)

    def extend_top(self, summary: ComparativeSummary, name: str) -> ComparativeSummary:
        """The summary of ``[name] + path``; raises ``ValueError`` unless ``name`` is a top extension."""
        a = self.a.try_extend_top(summary.a, name) if summary.a is not None else None
        b = self.b.try_extend_top(summary.b, name) if summary.b is not None else None
        extended = self._pair((name, *summary.path), a, b)
        if extended is None:
            raise ValueError(f"{name!r} is not a top extension of {list(summary.path)!r}")
        return extended

    def extend_bottom(self, summary: ComparativeSummary, name: str) -> ComparativeSummary:
        """The summary of ``path + [name]``; raises ``ValueError`` unless ``name`` is a bottom extension."""
        a = self.a.try_extend_bottom(summary.a, name) if summary.a is not None else None
        b = self.b.try_extend_bottom(summary.b, name) if summary.b is not None else None
        extended = self._pair((*summary.path, name), a, b)
        if extended is None:
            raise ValueError(f"{name!r} is not a bottom extension of {list(summary.path)!r}")
        return extended

    def top_extension_summaries(self, summary: ComparativeSummary) -> list[ComparativeSummary]:
        return self._paired(summary, at_top=True)

    def bottom_extension_summaries(self, summary: ComparativeSummary) -> list[ComparativeSummary]:
        return self._paired(summary, at_top=False)

    def _paired(self, summary: ComparativeSummary, at_top: bool) -> list[ComparativeSummary]:
        """The extensions listed in A or in B, paired by the name they add, in path order."""
        a = self.a._listing(summary.a, at_top) if summary.a is not None else None
        b = self.b._listing(summary.b, at_top) if summary.b is not None else None
        in_a = a.summaries() if a is not None else []
        in_b = b.summaries() if b is not None else []
        if a is not None and b is not None and a.names == b.names:
            # The usual case when comparing two runs of one program: the same callers (or callees) on both sides.
            return [_comparative(x.path, x, y) for x, y in zip(in_a, in_b, strict=True)]
        return _merged(in_a, a.names if a is not None else [], in_b, b.names if b is not None else [])

    def ranked_extensions(self, summary: ComparativeSummary, direction: Literal["top", "bottom"]) -> RankedComparison:
        """The extensions of ``summary`` at one end by descending ``|cum|``, ties by path: a :class:`RankedComparison`.

        What :func:`~monitor.search.zoom.zoom` asks for at each level: both
        sides' listings, paired by name, with their cums and prefix totals
        worked out on each side's arrays.
        """
        at_top = direction == "top"
        a = self.a._listing(summary.a, at_top) if summary.a is not None else None
        b = self.b._listing(summary.b, at_top) if summary.b is not None else None
        return RankedComparison(self, summary.path, at_top, a, b)

    def trim_top(self, summary: ComparativeSummary) -> ComparativeSummary | None:
        """The summary of ``path[1:]``; ``None`` for a 1-long path.

        Built from the path, not from the two sides: a side where ``path`` never
        occurs may still have occurrences of the shorter path.
        """
        if len(summary.path) <= 1:
            return None
        return self.summary(summary.path[1:])

    def trim_bottom(self, summary: ComparativeSummary) -> ComparativeSummary | None:
        """The summary of ``path[:-1]``; ``None`` for a 1-long path."""
        if len(summary.path) <= 1:
            return None
        return self.summary(summary.path[:-1])

    # --- metrics: A minus B ----------------------------------------------------------

    def base_of(self, summary: ComparativeSummary) -> int:
        a = self.a.base_of(summary.a) if summary.a is not None else 0
        return a - (self._b(self.b.base_of(summary.b)) if summary.b is not None else 0)

    def cum_of(self, summary: ComparativeSummary) -> int:
        # Directly, not as total_cum_of((summary,)): zooming asks for thousands of these.
        a = self.a.cum_of(summary.a) if summary.a is not None else 0
        return a - (self._b(self.b.cum_of(summary.b)) if summary.b is not None else 0)

    def total_base_of(self, summaries: Iterable[ComparativeSummary]) -> int:
        summaries = list(summaries)
        return self.a.total_base_of(_side(summaries, "a")) - self._b(self.b.total_base_of(_side(summaries, "b")))

    def total_cum_of(self, summaries: Iterable[ComparativeSummary]) -> int:
        summaries = list(summaries)
        return self.a.total_cum_of(_side(summaries, "a")) - self._b(self.b.total_cum_of(_side(summaries, "b")))

    def total_cum_of_prefixes(self, summaries: Sequence[ComparativeSummary]) -> list[int]:
        a = _side_prefixes(self.a, [s.a for s in summaries])
        b = _side_prefixes(self.b, [s.b for s in summaries])
        return [x - self._b(y) for x, y in zip(a, b, strict=True)]

    def iter_total_cum_of_prefixes(self, summaries: Sequence[ComparativeSummary]) -> Iterator[int]:
        """:meth:`total_cum_of_prefixes`, one total at a time, each side working out only what is asked for."""
        a = _side_iter(self.a, [s.a for s in summaries])
        b = map(self._b, _side_iter(self.b, [s.b for s in summaries]))
        return map(sub, a, b)

    @staticmethod
    def _pair(path: tuple[str, ...], a: CallTreeSummary | None, b: CallTreeSummary | None) -> ComparativeSummary | None:
        if a is None and b is None:
            return None
        return ComparativeSummary(path, a, b)


class RankedComparison:
    """The extensions of a comparative summary by descending ``|cum|`` (A minus B), ties by path.

    The union of the names the two sides' listings add, in path order; each
    side's cums and prefix totals come from its own listing, with its
    extensions placed where the union's ranking puts them (see
    :class:`~monitor.search.calltree.RankedListing`, which this mirrors).
    """

    def __init__(
        self,
        profile: ComparativeProfile,
        path: tuple[str, ...],
        at_top: bool,
        a: ExtensionListing | None,
        b: ExtensionListing | None,
    ) -> None:
        self._profile, self._path, self._at_top, self._a, self._b = profile, path, at_top, a, b
        in_a = a.names if a is not None else []
        in_b = b.names if b is not None else []
        # Each listing is in name order: the sort merges two runs.
        self._names = list(dict.fromkeys(sorted(in_a + in_b)))
        at = {name: i for i, name in enumerate(self._names)}
        self._at_a = np.array([at[name] for name in in_a], np.int64)
        self._at_b = np.array([at[name] for name in in_b], np.int64)
        cums = np.zeros(len(self._names), np.int64)
        if a is not None:
            cums[self._at_a] += profile.a._listing_cums(a)
        if b is not None:
            cums[self._at_b] -= profile._b_array(profile.b._listing_cums(b))
        # A stable sort: the union is in path order, so ties stay in it.
        self._order = np.argsort(-np.abs(cums), kind="stable")
        self.cums: list[int] = cums[self._order].tolist()
        self._place = np.empty(len(self._names), np.int64)
        self._place[self._order] = np.arange(len(self._names))
        self._totals: list[int] = []

    def summaries(self, count: int | None = None) -> list[ComparativeSummary]:
        """The first ``count`` summaries (all of them by default)."""
        side_a = dict(zip(self._at_a.tolist(), range(len(self._at_a)), strict=True))
        side_b = dict(zip(self._at_b.tolist(), range(len(self._at_b)), strict=True))
        summaries = []
        for u in self._order[:count].tolist():
            name = self._names[u]
            i, j = side_a.get(u), side_b.get(u)
            summaries.append(
                _comparative(
                    (name, *self._path) if self._at_top else (*self._path, name),
                    self._a.summary(i) if self._a is not None and i is not None else None,
                    self._b.summary(j) if self._b is not None and j is not None else None,
                )
            )
        return summaries

    def prefix_totals(self) -> Iterator[int]:
        """``total_cum_of`` of the first 1, 2, ... summaries (A's minus B's), worked out in batches as asked for."""
        for i in range(len(self.cums)):
            if i == len(self._totals):
                size = _batch(i, len(self.cums))
                totals = np.zeros(size, np.int64)
                if self._a is not None:
                    totals += self._profile.a._listing_prefix_totals(self._a, self._place[self._at_a], size)
                if self._b is not None:
                    totals -= self._profile._b_array(
                        self._profile.b._listing_prefix_totals(self._b, self._place[self._at_b], size)
                    )
                self._totals = totals.tolist()
            yield self._totals[i]


def _merged(
    a: list[CallTreeSummary], a_names: list[str], b: list[CallTreeSummary], b_names: list[str]
) -> list[ComparativeSummary]:
    """Two listings of one path's extensions (each in path order, with the names they add), paired, in path order.

    Extensions of one path differ in the name they add, so one merge pass over
    the two sorted lists of names pairs them.
    """
    merged = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a_names[i] == b_names[j]:
            merged.append(_comparative(a[i].path, a[i], b[j]))
            i += 1
            j += 1
        elif a_names[i] < b_names[j]:
            merged.append(_comparative(a[i].path, a[i], None))
            i += 1
        else:
            merged.append(_comparative(b[j].path, None, b[j]))
            j += 1
    merged += [_comparative(x.path, x, None) for x in a[i:]]
    merged += [_comparative(y.path, None, y) for y in b[j:]]
    return merged


def _side(summaries: list[ComparativeSummary], side: Literal["a", "b"]) -> list[CallTreeSummary]:
    """The single-tree summaries of one side, leaving out those that do not occur there."""
    picked = (s.a if side == "a" else s.b for s in summaries)
    return [s for s in picked if s is not None]


def _side_iter(profile: CallTreeProfile, sides: list[CallTreeSummary | None]) -> Iterator[int]:
    """One side's prefix totals, lazily; a summary absent on that side adds nothing to it."""
    totals = profile.iter_total_cum_of_prefixes([s for s in sides if s is not None])
    total = 0
    for s in sides:
        if s is not None:
            total = next(totals)
        yield total


def _side_prefixes(profile: CallTreeProfile, sides: list[CallTreeSummary | None]) -> list[int]:
    """One side's prefix totals; a summary absent on that side adds nothing to it."""
    totals = iter(profile.total_cum_of_prefixes([s for s in sides if s is not None]))
    total = 0
    out = []
    for s in sides:
        if s is not None:
            total = next(totals)
        out.append(total)
    return out
