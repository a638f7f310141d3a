"""The profile interface of BOTTLENECKS (seed 000, Figure 3), as a Protocol.

The search tool (suggesters, zooming, labels, the REPL and the web UI) is
written against this interface only, so it works unchanged on one call tree
(:class:`~monitor.search.calltree.CallTreeProfile`) and on the difference of two
(:class:`~monitor.search.comparative.ComparativeProfile`).

A *summary* stands for a call sequence (its *path*, root side first) and every
place in the profile where that sequence occurs. ``base`` and ``cum`` are the
paper's two metrics; ``total_base_of`` and ``total_cum_of`` count a measurement
once even when it belongs to several summaries, which is what makes overlap
(:func:`cum_overlap`, :func:`base_overlap`) computable.

Additions to the paper's Figure 3, each a shortcut the search tool needs to
stay fast on a million-node tree, each definable from the paper's primitives:

- ``summary(path)``: the summary of an explicit call sequence, or ``None``;
- ``top_extension_summaries(s)`` / ``bottom_extension_summaries(s)``: every
  one-name extension of ``s`` at once, instead of one ``extend_*`` call per name;
- ``total_cum_of_prefixes(S)``: ``total_cum_of`` of every prefix of ``S`` at
  once, which zooming needs for a summary with hundreds of extensions;
- ``total()``: the cum of the whole profile, ``total_cum_of(initial_summaries())``;
- ``monotone``: whether ``total_cum_of`` can only grow as summaries are added
  (true for a single profile, whose costs are never negative; false for a
  comparative one), which lets a suggester skip exact overlaps that a bound
  already decides.

Not part of the Protocol, looked up by zooming when a profile offers them (both
of ours do): ``iter_total_cum_of_prefixes(S)``, the prefix totals one at a time,
and ``ranked_extensions(s, direction)``, the extensions at one end ranked by
``|cum|`` with their prefix totals (:class:`~monitor.search.zoom.Ranked`), which
spares making a summary for each of a popular function's thousands of extensions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

S = TypeVar("S")


class ProfileInterface(Protocol[S]):
    """Figure 3 of the paper: construct summaries, read their metrics, measure overlap."""

    @property
    def monotone(self) -> bool:
        """True when adding summaries to a list never lowers its ``total_cum_of``."""
        ...

    def summary(self, path: Sequence[str]) -> S | None:
        """The summary of the call sequence ``path`` (root side first), ``None`` if it never occurs."""
        ...

    def path_of(self, summary: S) -> tuple[str, ...]:
        """The summary's call sequence, root side (top) first."""
        ...

    def initial_summaries(self) -> list[S]:
        """One summary per function name that occurs: the paths of length 1."""
        ...

    def top_extensions(self, summary: S) -> list[str]:
        """Names ``m`` such that ``[m] + path`` occurs: the callers of the path's first call."""
        ...

    def bottom_extensions(self, summary: S) -> list[str]:
        """Names ``m`` such that ``path + [m]`` occurs: the callees of the path's last call."""
        ...

    def extend_top(self, summary: S, name: str) -> S:
        """The summary of ``[name] + path``; ``name`` must be one of :meth:`top_extensions`."""
        ...

    def extend_bottom(self, summary: S, name: str) -> S:
        """The summary of ``path + [name]``; ``name`` must be one of :meth:`bottom_extensions`."""
        ...

    def top_extension_summaries(self, summary: S) -> list[S]:
        """``extend_top(summary, m)`` for every top extension ``m``, computed in one pass."""
        ...

    def bottom_extension_summaries(self, summary: S) -> list[S]:
        """``extend_bottom(summary, m)`` for every bottom extension ``m``, computed in one pass."""
        ...

    def trim_top(self, summary: S) -> S | None:
        """The summary of ``path[1:]``; ``None`` for a path of length 1."""
        ...

    def trim_bottom(self, summary: S) -> S | None:
        """The summary of ``path[:-1]``; ``None`` for a path of length 1."""
        ...

    def base_of(self, summary: S) -> int:
        """The cost of the nodes along the summary's paths."""
        ...

    def cum_of(self, summary: S) -> int:
        """The cost of the nodes along the summary's paths and of everything below their ends."""
        ...

    def total_base_of(self, summaries: Iterable[S]) -> int:
        """``base`` of a list of summaries, counting each node once."""
        ...

    def total_cum_of(self, summaries: Iterable[S]) -> int:
        """``cum`` of a list of summaries, counting each node once."""
        ...

    def total_cum_of_prefixes(self, summaries: Sequence[S]) -> list[int]:
        """``[total_cum_of(summaries[:n]) for n in 1..len(summaries)]``, computed together."""
        ...

    def total(self) -> int:
        """The cum of the whole profile (equal to ``total_cum_of(initial_summaries())``)."""
        ...


def cum_overlap(profile: ProfileInterface[S], summary: S, others: Sequence[S]) -> int:
    """The cum that ``summary`` shares with ``others`` (the paper's ``cumol``, section 2.1).

    It is how much optimising ``summary`` away would *not* add to what optimising
    ``others`` already saves: ``cum(s) + total_cum(S) - total_cum(s :: S)``.
    """
    return profile.cum_of(summary) + profile.total_cum_of(others) - profile.total_cum_of([summary, *others])


def base_overlap(profile: ProfileInterface[S], summary: S, others: Sequence[S]) -> int:
    """The base that ``summary`` shares with ``others``, defined like :func:`cum_overlap`."""
    return profile.base_of(summary) + profile.total_base_of(others) - profile.total_base_of([summary, *others])
