"""Bottleneck search over call-tree profiles, after BOTTLENECKS (seed 000).

The profile interface (:class:`ProfileInterface`, the paper's Figure 3) has two
implementations: :class:`CallTreeProfile` for one call tree and
:class:`ComparativeProfile` for the difference of two. Suggesters
(:mod:`monitor.search.suggest`) and zooming (:func:`zoom`) are written against
the interface only::

    from dyper.monitor.search import CallTreeProfile, zoom
    p = CallTreeProfile.from_collapsed(text)   # or CallTreeProfile.from_profile(profile, metric="cpu")
    s = p.summary(["handle", "parse"])
    p.cum_of(s), p.base_of(s), zoom(p, s, "top")
"""

from dyper.monitor.search.calltree import CallTreeProfile, CallTreeSummary, CollapsedStats, function_key
from dyper.monitor.search.comparative import ComparativeProfile, ComparativeSummary
from dyper.monitor.search.interface import ProfileInterface, base_overlap, cum_overlap
from dyper.monitor.search.suggest import SUGGESTERS, HighBase, HighBaseSpread, HighCum, Suggester, caller_split
from dyper.monitor.search.zoom import DEFAULT_CUTOFF, zoom

__all__ = [
    "DEFAULT_CUTOFF",
    "SUGGESTERS",
    "CallTreeProfile",
    "CallTreeSummary",
    "CollapsedStats",
    "ComparativeProfile",
    "ComparativeSummary",
    "HighBase",
    "HighBaseSpread",
    "HighCum",
    "ProfileInterface",
    "Suggester",
    "base_overlap",
    "caller_split",
    "cum_overlap",
    "function_key",
    "zoom",
]
