"""The profile interface over one call tree (seed 000, section 2.2, "Call-tree Profiles").

The tree is stored as numpy arrays indexed by node id, with ids given in DFS
preorder. Preorder makes a subtree an interval: node ``n`` and its descendants
are exactly the ids ``n .. end[n]-1``. That turns the paper's "is ``n`` in
descendants(s)?" from a walk to the root into a comparison, so cum and overlap
cost a few whole-array passes over the summary's final nodes, without ever
listing a subtree.

Definitions, as in the paper, for a summary ``s`` with call sequence ``path``:

- paths(s): every chain of nodes, parent to child, labelled ``path``;
- final(s): the nodes at the end of such a chain (the summary stores them);
- along(s): every node on such a chain; interior(s) = along(s) - final(s);
- descendants(s): every node strictly below a node of final(s);
- ``base_of(s)`` = cost of along(s);
- ``cum_of(s)`` = cost of along(s) | descendants(s).

Each node is counted once, so a path that matches at nested places (recursion)
is not counted twice, and neither is a node shared by several summaries in
``total_base_of``/``total_cum_of``.

Why numpy: a popular function occurs at 100 000 places of a million-node tree,
and every operation on its summary touches each of them. A pass over them as
one array operation takes a fraction of a millisecond, as a Python loop tens of
milliseconds. Python loops are left only where there is one step per summary
of a listing (a few thousand at most) or per level of nesting, never one per
node. The index arrays that make listings cheap (nodes grouped by name, by
parent) and the cums and bases of the paths of length 1 are built at load.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, cast

import numpy as np
from numpy.typing import NDArray

from dyper.monitor.model.frames import frame_label

if TYPE_CHECKING:
    from dyper.monitor.model.frames import Frame
    from dyper.monitor.model.profile import Profile

#: "frame": a name is the whole frame string as written; "function": line numbers
#: are dropped, so the lines of one function merge into one name.
FrameKey = Literal["frame", "function"]

NodeId = int
#: node ids, name ids, costs or indexes, one per element
Ints = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class CallTreeSummary:
    """A call sequence and the places it occurs (the paper's ``{calls; roots}``).

    ``final_nodes[i]`` is the node at the end of one occurrence and
    ``root_nodes[i]`` the node at its start, so extending at either end needs no
    walk along the path. ``final_nodes`` is sorted (preorder), which the cum
    sweep relies on. Both are read-only arrays, often views into the profile's
    own; :attr:`finals` and :attr:`roots` give them as tuples of ints.

    Summaries compare and hash by path: a summary belongs to the profile that
    made it and means nothing in another one.
    """

    path: tuple[str, ...]
    final_nodes: Ints = field(compare=False, repr=False)
    root_nodes: Ints = field(compare=False, repr=False)

    def __len__(self) -> int:
        """How many places the call sequence occurs at."""
        return len(self.final_nodes)

    @property
    def finals(self) -> tuple[NodeId, ...]:
        """The final node of each occurrence, in preorder."""
        return tuple(self.final_nodes.tolist())

    @property
    def roots(self) -> tuple[NodeId, ...]:
        """The root node of each occurrence, in the order of :attr:`finals`."""
        return tuple(self.root_nodes.tolist())


# Listings make summaries by the thousand: setting the slots through their descriptors,
# rather than through the frozen dataclass's __init__, takes half the time.
_SUMMARY_SLOTS = tuple(vars(CallTreeSummary)[name].__set__ for name in ("path", "final_nodes", "root_nodes"))


def _summary(path: tuple[str, ...], finals: Ints, roots: Ints) -> CallTreeSummary:
    """``CallTreeSummary(path, finals, roots)``, made faster."""
    summary = object.__new__(CallTreeSummary)
    set_path, set_finals, set_roots = _SUMMARY_SLOTS
    set_path(summary, path)
    set_finals(summary, finals)
    set_roots(summary, roots)
    return summary


@dataclass
class CollapsedStats:
    """What reading a collapsed file skipped, so a caller can warn about it."""

    lines: int = 0
    blank: int = 0
    comments: int = 0
    malformed: int = 0
    #: a few of the malformed lines (cut short), to show what went wrong
    malformed_examples: list[str] = field(default_factory=list)


_MAX_MALFORMED_EXAMPLES = 10
_MAX_EXAMPLE_LENGTH = 200
#: how many cums the cum cache holds before it starts over (a few MB)
_CUM_CACHE_SIZE = 100_000
#: and how many totals of lists of summaries, and prefix totals of lists
_TOTAL_CACHE_SIZE = 1_000
#: and how many extension listings (each a few thousand summaries at most)
_EXTENSION_CACHE_SIZE = 16
#: how many summaries the first batch of lazily worked out prefix totals has (then twice as many, and so on)
_FIRST_BATCH = 16
#: keys below this are sorted as 16-bit ints, which numpy's stable sort does by radix, in one pass
_RADIX_LIMIT = 1 << 16
# "qualname (file.py:12)" (dyper, py-spy): the line number inside the parentheses.
_PAREN_LINE = re.compile(r" \((?P<file>[^(]*):\d+\)$")
# "file.py:function:12" (Austin): a trailing line number.
_TRAILING_LINE = re.compile(r":\d+$")
# Austin's alternative format gives the line as a frame of its own, "L12".
_LINE_FRAME = re.compile(r"L\d+")
_AUSTIN_PROCESS = re.compile(r"P\d+")
# Name id of a frame that names no function (Austin's "L12" line frames, by function).
_DROPPED = -1
_NO_INTS: Ints = np.zeros(0, np.int64)


def function_key(frame: str) -> str:
    """The frame string without its line number: ``f (x.py:12)`` -> ``f (x.py)``, ``x.py:f:12`` -> ``x.py:f``."""
    m = _PAREN_LINE.search(frame)
    if m is not None:
        return f"{frame[: m.start()]} ({m['file']})"
    return _TRAILING_LINE.sub("", frame)


def function_label(frame: Frame) -> str:
    """A dyper frame at function level: what :func:`function_key` makes of :func:`frame_label`."""
    return f"{frame.name} ({frame.file})".replace(";", ":")


class _TreeBuilder:
    """Grows the call tree stack by stack, then renumbers it in preorder.

    Nodes are created in the order stacks mention them, which puts every parent
    before its children but does not make subtrees contiguous; :meth:`finish`
    computes subtree sizes and lays the nodes out in preorder. The per-node
    columns are lists while they grow (appending to a list is three times as
    fast as to an ``array('q')``, and numpy converts a list at about 80 ns a node).
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self.parent: list[NodeId] = []
        self.name: list[int] = []
        self.cost: list[int] = []
        self.depth: list[int] = []
        # (parent + 1) << 32 | name id -> child; parent -1 stands for "no parent" (a root).
        self.children: dict[int, NodeId] = {}

    def name_id(self, name: str) -> int:
        nid = self.name_ids.get(name)
        if nid is None:
            nid = self.name_ids[name] = len(self.names)
            self.names.append(name)
        return nid

    def child(self, node: NodeId, nid: int) -> NodeId:
        """The child of ``node`` (-1: a root) named ``nid``, created if it does not exist yet."""
        key = ((node + 1) << 32) | nid
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = len(self.parent)
            self.parent.append(node)
            self.name.append(nid)
            self.cost.append(0)
            self.depth.append(self.depth[node] + 1 if node >= 0 else 0)
        return child

    def add(self, stack: Iterable[int], cost: int) -> None:
        """Charge ``cost`` to the node for ``stack`` (name ids, root first)."""
        node = -1
        for nid in stack:
            node = self.child(node, nid)
        if node >= 0:
            self.cost[node] += cost

    def finish(self) -> CallTreeProfile:
        """The profile, with the nodes renumbered in preorder (children in the order they were created).

        Every step is a whole-array operation, or one per depth of the tree:
        subtree sizes are summed level by level from the deepest up, chain
        costs and preorder positions are pushed level by level from the roots down.
        """
        self.children.clear()  # only needed while growing; free it before the arrays exist
        parent = _ints(self.parent)  # -1: a root
        name = _ints(self.name)
        cost = _ints(self.cost)
        levels = _levels(_ints(self.depth))
        del self.parent, self.name, self.cost, self.depth
        n = len(parent)
        size = np.ones(n, np.int64)
        for nodes in reversed(levels[1:]):
            np.add.at(size, parent[nodes], size[nodes])
        chain_cost = cost.copy()
        for nodes in levels[1:]:
            chain_cost[nodes] += chain_cost[parent[nodes]]
        position = _preorder_positions(parent, size, levels)
        ids = np.arange(n, dtype=np.int64)
        if not np.array_equal(position, ids):
            # Stacks came in no particular order; dyper's and flamegraph's collapsed
            # files come sorted, and then nodes were created in preorder already.
            at = np.empty(n, np.int64)
            at[position] = ids  # at[p]: the node laid out at preorder position p
            parent = np.where(parent >= 0, position[parent], -1)[at]
            name, cost, size, chain_cost = name[at], cost[at], size[at], chain_cost[at]
        end = ids + size
        running = np.concatenate((np.zeros(1, np.int64), np.cumsum(cost)))
        tree = _Tree(
            self.names,
            np.where(parent >= 0, parent, n),  # n: the virtual root, see CallTreeProfile
            name,
            cost,
            end,
            running[end] - running[ids],  # a subtree is an interval: its cost is a difference of running sums
            chain_cost,
        )
        return CallTreeProfile(tree)


def _ints(column: list[int]) -> Ints:
    return np.array(column, dtype=np.int64)


def _levels(depth: Ints) -> list[Ints]:
    """The nodes at each depth, shallowest first, each level in node order."""
    if not len(depth):
        return []
    counts = np.bincount(depth)
    return np.split(_stable_order(depth, len(counts)), np.cumsum(counts)[:-1])


def _preorder_positions(parent: Ints, size: Ints, levels: list[Ints]) -> Ints:
    """Where each node goes in preorder, children in node order.

    A node's subtree starts one past its parent's position, after the subtrees
    of its earlier siblings; a root's, after the subtrees of the earlier roots.
    """
    n = len(parent)
    siblings = np.argsort(parent, kind="stable")  # grouped by parent, in node order; the roots (-1) first
    sizes = size[siblings]
    before = np.cumsum(sizes) - sizes
    grouped = parent[siblings]
    first = np.ones(n, bool)
    first[1:] = grouped[1:] != grouped[:-1]
    group_start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    position = np.empty(n, np.int64)
    position[siblings] = before - before[group_start]  # the roots' positions already
    for nodes in levels[1:]:
        position[nodes] += position[parent[nodes]] + 1
    return position


@dataclass
class _Tree:
    """A call tree laid out in preorder, as :class:`CallTreeProfile` keeps it.

    Per node: ``parent`` (``len(parent)`` for a root: the virtual root),
    ``name`` (an index into ``names``), ``cost`` (its own), ``end`` (one past
    the last node of its subtree), ``cum`` (cost of its subtree) and
    ``chain_cost`` (cost of the nodes from the root down to it).
    """

    names: list[str]
    parent: Ints
    name: Ints
    cost: Ints
    end: Ints
    cum: Ints
    chain_cost: Ints


class ExtensionListing:
    """Every one-name extension of a path at one end (top: callers, bottom: callees), in one pair of arrays.

    Extension ``i`` adds the name ``names[i]`` (its rank in the profile's string
    order is ``ranks[i]``; listings are in path order, which is the order of
    these names). Its final and root nodes are ``finals[bounds[i]:bounds[i + 1]]``
    (and ``roots``). Its summary is made when first asked for, holding views of
    the arrays: zooming ranks thousands of extensions and shows a few.

    ``separate``: the occurrences of the extensions are occurrences of the path
    that share no node, and one below another's final node lies wholly in that
    subtree (see :meth:`CallTreeProfile._top_extension_prefixes`), so each can
    be counted on its own. Package-internal: :class:`CallTreeProfile` and
    :class:`~monitor.search.comparative.ComparativeProfile` use it.
    """

    def __init__(
        self,
        path: tuple[str, ...],
        at_top: bool,
        names: list[str],
        ranks: Ints,
        finals: Ints,
        roots: Ints,
        bounds: Ints,
        separate: bool,
    ) -> None:
        self.path = path
        self.at_top = at_top
        self.names = names
        self.ranks = ranks
        self.finals = finals
        self.roots = roots
        self.bounds = bounds
        self.separate = separate
        self._starts: list[int] = bounds.tolist()
        self._summaries: list[CallTreeSummary | None] = [None] * len(names)
        self._all: list[CallTreeSummary] | None = None  # _summaries, once every one is made
        self._index: dict[str, int] | None = None
        #: the extensions' cums, once worked out (:meth:`CallTreeProfile._listing_cums`)
        self.cums: Ints | None = None
        #: the extensions by cum, once zooming asked for them (:meth:`CallTreeProfile.ranked_extensions`)
        self.ranked: RankedListing | None = None

    def __len__(self) -> int:
        return len(self.names)

    def extended_path(self, i: int) -> tuple[str, ...]:
        return (self.names[i], *self.path) if self.at_top else (*self.path, self.names[i])

    def summary(self, i: int) -> CallTreeSummary:
        """The summary of extension ``i``."""
        s = self._summaries[i]
        if s is None:
            a, b = self._starts[i], self._starts[i + 1]
            s = self._summaries[i] = _summary(self.extended_path(i), self.finals[a:b], self.roots[a:b])
        return s

    def summaries(self) -> list[CallTreeSummary]:
        """The summary of every extension, in path order."""
        if self._all is None:
            made, starts, finals, roots, path = self._summaries, self._starts, self.finals, self.roots, self.path
            for i, name in enumerate(self.names):
                if made[i] is None:
                    a, b = starts[i], starts[i + 1]
                    extended = (name, *path) if self.at_top else (*path, name)
                    made[i] = _summary(extended, finals[a:b], roots[a:b])
            self._all = cast("list[CallTreeSummary]", made)
        return list(self._all)

    def index(self, name: str) -> int | None:
        """Which extension adds ``name``, if one does."""
        if self._index is None:
            self._index = {m: i for i, m in enumerate(self.names)}
        return self._index.get(name)

    def group_of_occurrences(self) -> Ints:
        """The extension of each occurrence in ``finals``."""
        return _group_of(self.bounds)


class RankedListing:
    """A listing's extensions by descending cum, ties by path: what :func:`~monitor.search.zoom.zoom` goes through.

    ``cums`` in that order; :meth:`summaries` makes only the summaries asked
    for; :meth:`prefix_totals` works out the totals of the first 16 summaries,
    then 32, 64 and so on, while they are asked for (zooming stops at the first
    that reaches its bound, usually early).
    """

    def __init__(self, profile: CallTreeProfile, listing: ExtensionListing) -> None:
        cums = profile._listing_cums(listing)  # never negative: |cum| is cum
        # A stable sort: the listing is in path order, so ties stay in it.
        self.order = np.argsort(-cums, kind="stable")
        self.cums: list[int] = cums[self.order].tolist()
        #: the place of each extension in the ranking
        self.place = np.empty(len(listing), np.int64)
        self.place[self.order] = np.arange(len(listing))
        self._profile = profile
        self._listing = listing
        self._totals: list[int] = []

    def summaries(self, count: int | None = None) -> list[CallTreeSummary]:
        """The first ``count`` summaries (all of them by default)."""
        return [self._listing.summary(i) for i in self.order[:count].tolist()]

    def prefix_totals(self) -> Iterator[int]:
        """``total_cum_of`` of the first 1, 2, ... summaries, worked out in batches as they are asked for."""
        for i in range(len(self.cums)):
            if i == len(self._totals):
                self._totals = self._profile._listing_prefix_totals(
                    self._listing, self.place, _batch(i, len(self.cums))
                ).tolist()
            yield self._totals[i]


class _OneNameListings:
    """The extension listings at one end of every path of length 1, laid out at load: each listing is a slice.

    Every search starts at a path of length 1 (suggesters rank them, zooming
    starts at one), and the popular functions, whose listings are the longest
    to work out, are among them. ``finals`` and ``roots`` hold the occurrences
    of every extension ``[m, f]`` (at the top) or ``[f, m]`` (at the bottom),
    sorted by ``f``, then by the rank of ``m``, then in preorder. Extension
    ``g`` is ``finals[bounds[g]:bounds[g + 1]]`` (and ``roots``), adds the name
    of rank ``ranks[g]`` and has the cum ``cums[g]``; the extensions of the
    name ``f`` are ``g = first[f] .. first[f + 1] - 1``.
    """

    def __init__(self, finals: Ints, roots: Ints, bounds: Ints, ranks: Ints, cums: Ints, first: Ints) -> None:
        self.finals = finals
        self.roots = roots
        self.bounds = bounds
        self.ranks = ranks
        self.cums = cums
        self.first = first

    def listing(self, path: tuple[str, ...], nid: int, at_top: bool, sorted_names: list[str]) -> ExtensionListing:
        """The listing of ``path`` = ``(names[nid],)``."""
        g, h = int(self.first[nid]), int(self.first[nid + 1])
        a, b = int(self.bounds[g]), int(self.bounds[h])
        ranks = self.ranks[g:h]
        names = [sorted_names[r] for r in ranks.tolist()]
        listing = ExtensionListing(
            path, at_top, names, ranks, self.finals[a:b], self.roots[a:b], self.bounds[g : h + 1] - a, separate=at_top
        )
        listing.cums = self.cums[g:h]
        return listing

    def ranks_of(self, nid: int) -> Ints:
        """The ranks of the names that extend the name ``nid``."""
        return self.ranks[self.first[nid] : self.first[nid + 1]]

    def extension(self, nid: int, rank: int) -> tuple[Ints, Ints] | None:
        """The final and root nodes of the extension of the name ``nid`` by the name of rank ``rank``, if any."""
        g, h = int(self.first[nid]), int(self.first[nid + 1])
        at = g + int(np.searchsorted(self.ranks[g:h], rank))
        if at == h or self.ranks[at] != rank:
            return None
        a, b = int(self.bounds[at]), int(self.bounds[at + 1])
        return self.finals[a:b], self.roots[a:b]


class CallTreeProfile:
    """A call-tree profile behind the paper's profile interface (Figure 3).

    Build one with :meth:`from_collapsed`, :meth:`from_profile` (dyper's saved or
    live profiles) or :meth:`from_stacks`.

    Node costs are never negative (a comparison of two profiles is
    :class:`~monitor.search.comparative.ComparativeProfile`).

    A search asks for the same numbers repeatedly (zooming ranks a summary's
    extensions by cum, the listing shows those cums, every selection is
    overlapped with the same labels), so cums, totals, prefix totals and
    extension listings are cached by path, in bounded caches that start over
    when full. Summaries hash by path, and a path means one set of occurrences
    in one profile, so a cached answer is the answer. :meth:`clear_caches`
    empties them (benchmarks of cold calls); what is built at load stays.
    """

    #: adding summaries never lowers total_cum_of: all costs are >= 0
    monotone = True

    def __init__(self, tree: _Tree) -> None:
        """Use :meth:`from_collapsed`, :meth:`from_profile` or :meth:`from_stacks`.

        The parent of a root is a virtual node, ``len(parent)``, with no name
        (-1) and no cost, appended to the name, cost and chain-cost arrays here,
        so that looking up a parent's name or cost never needs a test for
        "is a root".
        """
        self.names: tuple[str, ...] = tuple(tree.names)
        self._name_ids = {s: i for i, s in enumerate(self.names)}
        n, k = len(tree.parent), len(self.names)
        self._parent = _frozen(tree.parent)
        self._name = _frozen(np.append(tree.name, -1))
        self._cost = _frozen(np.append(tree.cost, 0))
        self._end = _frozen(tree.end)
        self._cum = _frozen(tree.cum)
        self._chain_cost = _frozen(np.append(tree.chain_cost, 0))
        # The cost of a node's strict ancestors, chain_cost[parent[n]]: the chain
        # part of an occurrence's cost is one lookup at each end, not two.
        self._above = _frozen(self._chain_cost[self._parent])
        # The nodes of each name, in preorder: name i's are _by_name[_name_start[i]:_name_start[i + 1]].
        self._by_name = _frozen(_stable_order(tree.name, k))
        self._name_start = _frozen(_bounds(np.bincount(tree.name, minlength=k)))
        # The children of each node, in preorder: node p's are _children[_child_start[p]:_child_start[p + 1]]
        # (the roots are the virtual root's, p = n).
        self._children = _frozen(np.argsort(self._parent, kind="stable"))
        self._child_start = _frozen(_bounds(np.bincount(self._parent, minlength=n + 1)))
        # Listings are in path order, that is by the names' string order: name ids by rank in that
        # order, and each name id's rank (the virtual root's name, -1, indexes the last slot: rank k,
        # after every name, so that occurrences at a root of the tree sort last and are cut off).
        by_string = sorted(range(k), key=self.names.__getitem__)
        self._sorted_names = [self.names[i] for i in by_string]
        self._name_by_rank = _frozen(np.array(by_string, dtype=np.int64))
        rank = np.full(k + 1, k, np.int64)
        rank[self._name_by_rank] = np.arange(k)
        self._rank = _frozen(rank)
        # The paths of length 1: every suggester ranks all of them, and zooming starts at one.
        self._name_base = _frozen(_segment_sums(self._cost[self._by_name], self._name_start))
        self._name_cum = _frozen(self._outermost_cums(self._by_name, self._cum[self._by_name], self._name_start))
        self._top_index, self._bottom_index = self._one_name_listings()
        self._total = int(tree.cost.sum())
        # Path -> cum. A search asks for the same cums again and again (a selection
        # is zoomed, listed, then overlapped with the labels), and listing the
        # extensions of a summary works out theirs in bulk.
        self._cums: dict[tuple[str, ...], int] = {}
        # Set of paths -> total_cum_of.
        self._total_cums: dict[frozenset[tuple[str, ...]], int] = {}
        # List of paths -> total_cum_of_prefixes (zooming again asks for the same).
        self._prefix_totals: dict[tuple[tuple[str, ...], ...], list[int]] = {}
        # ("top" or "bottom", path) -> the extension listing.
        self._extensions: dict[tuple[str, tuple[str, ...]], ExtensionListing] = {}
        #: set by :meth:`from_collapsed`
        self.collapsed_stats: CollapsedStats | None = None

    # --- construction ----------------------------------------------------------------

    @classmethod
    def from_stacks(cls, stacks: Iterable[tuple[Sequence[str], int]]) -> CallTreeProfile:
        """A profile from ``(frames root first, cost)`` pairs; repeated stacks add up.

        A stack with no frames or no cost adds nothing. Negative costs are refused.
        """
        builder = _TreeBuilder()
        for frames, cost in stacks:
            if cost < 0:
                raise ValueError(f"negative cost {cost} for stack {list(frames)!r}")
            if cost and frames:
                builder.add([builder.name_id(f) for f in frames], cost)
        return builder.finish()

    @classmethod
    def from_collapsed(
        cls,
        text: str | Iterable[str],
        *,
        frame_key: FrameKey = "frame",
        strip_austin: bool = True,
    ) -> CallTreeProfile:
        """Read folded stacks: one ``root;...;leaf count`` per line (flamegraph.pl's input).

        This is what dyper's ``.collapsed`` export, ``py-spy record -f raw`` and
        Austin write. ``frame_key="function"`` drops line numbers from frames
        (``f (x.py:12)`` -> ``f (x.py)``; Austin's ``x.py:f:12`` -> ``x.py:f`` and
        its ``L12`` line frames), so that the lines of one function merge.
        ``strip_austin`` drops Austin's leading ``P<pid>;T<thread>`` pseudo-frames,
        merging processes and threads as dyper's own trees do.

        Blank lines and ``#`` comments (Austin's metadata) are skipped; lines
        without a non-negative integer count, with an empty frame or with no
        frame at all (Austin's sample of a thread outside Python) are skipped and
        counted as malformed. :attr:`collapsed_stats` says how many of each. The
        lines are read into memory and sorted, whatever order they come in.
        """
        # Sorted, lines that share a stack prefix are neighbours (whatever order
        # the profiler wrote them in: Austin writes samples as they come), and
        # each line only walks the tree from where it differs from the last one.
        lines = sorted(text.splitlines() if isinstance(text, str) else text)
        stats = CollapsedStats()
        builder = _TreeBuilder()
        by_function = frame_key == "function"
        # Raw frame string -> name id. Several raw frames (lines of one function)
        # may share a name id; the regexes run once per distinct frame string.
        frame_ids: dict[str, int] = {}
        children = builder.children
        # The builder's columns, appended to right here (see _TreeBuilder.child).
        node_parent, node_name, node_cost, node_depth = builder.parent, builder.name, builder.cost, builder.depth
        # The previous stack, where each of its frames ends in it, and the node
        # reached after each frame: a line only splits and walks what differs.
        previous = ""
        previous_ends: list[int] = []
        previous_nodes: list[NodeId] = []
        stats.lines = len(lines)
        for raw in lines:
            line = raw.strip()
            if not line:
                stats.blank += 1
                continue
            if line.startswith("#"):
                stats.comments += 1
                continue
            parsed = _split_collapsed(line, strip_austin)
            if parsed is None:
                stats.malformed += 1
                if len(stats.malformed_examples) < _MAX_MALFORMED_EXAMPLES:
                    stats.malformed_examples.append(line[:_MAX_EXAMPLE_LENGTH])
                continue
            stack, cost = parsed
            if cost == 0:
                continue
            shared = _shared_frames(stack, previous, previous_ends)
            ends = previous_ends[:shared]
            nodes = previous_nodes[:shared]
            node = nodes[-1] if nodes else -1
            start = ends[-1] + 1 if ends else 0
            if start <= len(stack):  # past the end: the stack is all shared frames
                for frame in stack[start:].split(";"):
                    start += len(frame)
                    ends.append(start)
                    start += 1
                    nid = frame_ids.get(frame)
                    if nid is None:
                        if by_function and _LINE_FRAME.fullmatch(frame):
                            nid = _DROPPED
                        else:
                            nid = builder.name_id(function_key(frame) if by_function else frame)
                        frame_ids[frame] = nid
                    if nid != _DROPPED:
                        # builder.child(node, nid), inlined: it runs once per node of the tree
                        key = ((node + 1) << 32) | nid
                        child = children.get(key)
                        if child is None:
                            child = children[key] = len(node_parent)
                            node_parent.append(node)
                            node_name.append(nid)
                            node_cost.append(0)
                            node_depth.append(node_depth[node] + 1 if node >= 0 else 0)
                        node = child
                    nodes.append(node)
            if node >= 0:
                node_cost[node] += cost
            previous, previous_ends, previous_nodes = stack, ends, nodes
        profile = builder.finish()
        profile.collapsed_stats = stats
        return profile

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        metric: Literal["cpu", "wall"] = "cpu",
        *,
        frame_key: FrameKey = "function",
        charge_libraries: bool = False,
        scale: float = 1.0,
    ) -> CallTreeProfile:
        """The call tree of a dyper :class:`~monitor.profile.Profile` (saved, or live via ``Profile.from_session``).

        All threads merge (each thread's outermost function is a root), as in
        ``Profile.tree``. Names are ``qualname (file)`` by default, one per
        function; ``frame_key="frame"`` keeps ``qualname (file:line)``, one per
        line. Both are exactly what :meth:`from_collapsed` makes of dyper's own
        collapsed export with the same ``frame_key``, so the two can be compared.
        ``charge_libraries`` charges time inside the standard library and
        packages to the application line that called them (``Profile.charged_stacks``).
        ``scale`` multiplies every count (rounded): a window sampled at another
        rate, brought to the rate of the one it is compared with.
        """
        if metric not in ("cpu", "wall"):
            raise ValueError(f"metric must be 'cpu' or 'wall', not {metric!r}")
        builder = _TreeBuilder()
        label = function_label if frame_key == "function" else frame_label
        labels = [label(f) for f in profile.frames]
        for stack, frames in profile.charged_stacks(charge_libraries):
            cost = stack.cpu if metric == "cpu" else stack.wall
            if scale != 1.0:
                cost = round(cost * scale)
            if cost > 0 and frames:
                # Names are registered as stacks use them, so that a frame seen
                # only in stacks without cost (a sleep, for cpu) names nothing.
                builder.add([builder.name_id(labels[i]) for i in frames], cost)
        return builder.finish()

    def stacks(self) -> list[tuple[tuple[str, ...], int]]:
        """The tree back as ``(frames root first, cost)`` pairs, one per node with a cost of its own."""
        parent = self._parent.tolist()
        name = self._name.tolist()
        cost = self._cost.tolist()
        paths: list[tuple[str, ...]] = []
        out = []
        # Nodes come after their parents (preorder), so a parent's path is known by the time a child asks.
        roots = len(parent)  # the virtual root's number
        for node in range(len(parent)):
            up = parent[node]
            path = (*(paths[up] if up != roots else ()), self.names[name[node]])
            paths.append(path)
            if cost[node] > 0:
                out.append((path, int(cost[node])))
        return out

    # --- size ------------------------------------------------------------------------

    @property
    def node_count(self) -> int:
        return len(self._parent)

    def total(self) -> int:
        """The cost of the whole tree."""
        return self._total

    # --- summaries -------------------------------------------------------------------

    def summary(self, path: Sequence[str]) -> CallTreeSummary | None:
        """The summary of the call sequence ``path`` (root side first), or ``None`` if it never occurs."""
        path = tuple(path)
        if not path:
            return None
        ids: list[int] = []
        for name in path:
            nid = self._name_ids.get(name)
            if nid is None:
                return None
            ids.append(nid)
        # Start from every node named like the path's end, then keep those whose
        # ancestors spell the rest of the path, walking up one name at a time.
        finals = roots = self._nodes_named(ids[-1])
        for nid in reversed(ids[:-1]):
            finals, roots = self._keep_with_parent(finals, roots, nid)
            if not len(finals):
                return None
        return CallTreeSummary(path, finals, roots)

    def _nodes_named(self, nid: int) -> Ints:
        return self._by_name[self._name_start[nid] : self._name_start[nid + 1]]

    def _keep_with_parent(self, finals: Ints, roots: Ints, nid: int) -> tuple[Ints, Ints]:
        """The occurrences whose root's parent is named ``nid``, extended up to that parent."""
        parents = self._parent[roots]
        keep = self._name[parents] == nid
        return _frozen(finals[keep]), _frozen(parents[keep])

    def path_of(self, summary: CallTreeSummary) -> tuple[str, ...]:
        return summary.path

    def initial_summaries(self) -> list[CallTreeSummary]:
        """One summary per function name in the tree, in name order."""
        start = self._name_start.tolist()
        summaries = []
        for nid in self._name_by_rank.tolist():
            if start[nid + 1] > start[nid]:
                nodes = self._by_name[start[nid] : start[nid + 1]]
                summaries.append(_summary((self.names[nid],), nodes, nodes))
        return summaries

    def top_extensions(self, summary: CallTreeSummary) -> list[str]:
        """The names of the parents of the summary's roots: who calls the path's first call."""
        if len(summary.path) == 1:
            return self._named(self._top_index.ranks_of(self._name_ids[summary.path[0]]))
        return self._names_among(self._name[self._parent[summary.root_nodes]])

    def bottom_extensions(self, summary: CallTreeSummary) -> list[str]:
        """The names of the children of the summary's final nodes: what the path's last call calls."""
        if len(summary.path) == 1:
            return self._named(self._bottom_index.ranks_of(self._name_ids[summary.path[0]]))
        children, _ = self._children_of(summary.final_nodes)
        return self._names_among(self._name[children])

    def _named(self, ranks: Ints) -> list[str]:
        return [self._sorted_names[r] for r in ranks.tolist()]

    def _names_among(self, name_ids: Ints) -> list[str]:
        """The names of ``name_ids`` (-1, the virtual root's, left out), each once, in string order."""
        present = np.zeros(len(self.names) + 1, bool)
        present[name_ids] = True  # -1 marks the last slot, which no rank reads
        return [self._sorted_names[r] for r in np.flatnonzero(present[self._name_by_rank]).tolist()]

    def _children_of(self, nodes: Ints) -> tuple[Ints, Ints]:
        """The children of ``nodes`` (each node's in preorder), and for each child its parent's index in ``nodes``."""
        first = self._child_start[nodes]
        counts = self._child_start[nodes + 1] - first
        return self._children[_ranges(first, counts)], np.repeat(np.arange(len(nodes)), counts)

    def extend_top(self, summary: CallTreeSummary, name: str) -> CallTreeSummary:
        """The summary of ``[name] + path``; raises ``ValueError`` unless ``name`` is a top extension."""
        extended = self.try_extend_top(summary, name)
        if extended is None:
            raise ValueError(f"{name!r} is not a top extension of {list(summary.path)!r}")
        return extended

    def extend_bottom(self, summary: CallTreeSummary, name: str) -> CallTreeSummary:
        """The summary of ``path + [name]``; raises ``ValueError`` unless ``name`` is a bottom extension."""
        extended = self.try_extend_bottom(summary, name)
        if extended is None:
            raise ValueError(f"{name!r} is not a bottom extension of {list(summary.path)!r}")
        return extended

    def try_extend_top(self, summary: CallTreeSummary, name: str) -> CallTreeSummary | None:
        """Like :meth:`extend_top`, but ``None`` when ``[name] + path`` never occurs."""
        nid = self._name_ids.get(name)
        if nid is None:
            return None
        if len(summary.path) == 1:
            found = self._top_index.extension(self._name_ids[summary.path[0]], int(self._rank[nid]))
            return None if found is None else CallTreeSummary((name, *summary.path), *found)
        finals, roots = self._keep_with_parent(summary.final_nodes, summary.root_nodes, nid)
        if not len(finals):
            return None
        return CallTreeSummary((name, *summary.path), finals, roots)

    def try_extend_bottom(self, summary: CallTreeSummary, name: str) -> CallTreeSummary | None:
        """Like :meth:`extend_bottom`, but ``None`` when ``path + [name]`` never occurs."""
        nid = self._name_ids.get(name)
        if nid is None:
            return None
        if len(summary.path) == 1:
            found = self._bottom_index.extension(self._name_ids[summary.path[0]], int(self._rank[nid]))
            return None if found is None else CallTreeSummary((*summary.path, name), *found)
        # The new final nodes are the nodes named `name` whose parent is a final
        # node of `summary`; going through the name's node list keeps them in preorder.
        candidates = self._nodes_named(nid)
        parents = self._parent[candidates]
        finals = summary.final_nodes
        at = np.minimum(np.searchsorted(finals, parents), len(finals) - 1)
        keep = finals[at] == parents
        if not keep.any():
            return None
        return CallTreeSummary((*summary.path, name), _frozen(candidates[keep]), _frozen(summary.root_nodes[at[keep]]))

    def top_extension_summaries(self, summary: CallTreeSummary) -> list[CallTreeSummary]:
        """Every top extension of ``summary`` as a summary, grouped in one pass over its roots."""
        return self._listing(summary, at_top=True).summaries()

    def bottom_extension_summaries(self, summary: CallTreeSummary) -> list[CallTreeSummary]:
        """Every bottom extension of ``summary`` as a summary, grouped in one pass over the children of its finals."""
        return self._listing(summary, at_top=False).summaries()

    def ranked_extensions(self, summary: CallTreeSummary, direction: Literal["top", "bottom"]) -> RankedListing:
        """The extensions of ``summary`` at one end by descending cum, ties by path (see :class:`RankedListing`).

        What :func:`~monitor.search.zoom.zoom` asks for at each level instead of
        a list of summaries: their cums come out of one pass over the listing's
        occurrences, and only the summaries it shows are made.
        """
        listing = self._listing(summary, at_top=direction == "top")
        if listing.ranked is None:
            listing.ranked = RankedListing(self, listing)
        return listing.ranked

    def _listing(self, summary: CallTreeSummary, at_top: bool) -> ExtensionListing:
        """The extension listing, from the cache if this path was listed lately (zooming back, re-selecting)."""
        key = ("top" if at_top else "bottom", summary.path)
        listing = self._extensions.get(key)
        if listing is None:
            listing = self._top_listing(summary) if at_top else self._bottom_listing(summary)
            if len(self._extensions) >= _EXTENSION_CACHE_SIZE:
                self._extensions.clear()
            self._extensions[key] = listing
        return listing

    def _top_listing(self, summary: CallTreeSummary) -> ExtensionListing:
        if len(summary.path) == 1:
            return self._top_index.listing(summary.path, self._name_ids[summary.path[0]], True, self._sorted_names)
        parents = self._parent[summary.root_nodes]
        ranks = self._rank[self._name[parents]]
        # A stable sort by the caller's name keeps each caller's occurrences in preorder.
        order = _stable_order(ranks, len(self.names) + 1)
        ranks = ranks[order]
        called = int(np.searchsorted(ranks, len(self.names)))  # the rest start at a root: no caller
        order = order[:called]
        return self._grouped(summary.path, True, summary.final_nodes[order], parents[order], ranks[:called])

    def _bottom_listing(self, summary: CallTreeSummary) -> ExtensionListing:
        if len(summary.path) == 1:
            return self._bottom_index.listing(summary.path, self._name_ids[summary.path[0]], False, self._sorted_names)
        children, parent_at = self._children_of(summary.final_nodes)
        roots = summary.root_nodes[parent_at]
        if len(children) > 1 and bool((children[1:] < children[:-1]).any()):
            # Under recursion a final node can lie inside another's subtree,
            # so children of different finals interleave: restore preorder.
            order = np.argsort(children)
            children, roots = children[order], roots[order]
        ranks = self._rank[self._name[children]]
        order = _stable_order(ranks, len(self.names) + 1)
        return self._grouped(summary.path, False, children[order], roots[order], ranks[order])

    def _grouped(self, path: tuple[str, ...], at_top: bool, finals: Ints, roots: Ints, ranks: Ints) -> ExtensionListing:
        """One extension per run of equal name ranks (``ranks`` sorted; each run's nodes in preorder)."""
        firsts = np.flatnonzero(ranks[1:] != ranks[:-1]) + 1
        bounds = np.concatenate((np.zeros(min(len(ranks), 1), np.int64), firsts, [len(ranks)]))
        ranks = _frozen(ranks[bounds[:-1]])
        names = [self._sorted_names[r] for r in ranks.tolist()]
        # At the top, see _siblings_at_top: the callers are distinct names.
        separate = at_top and len(set(path)) == len(path) and not bool(np.isin(ranks, self._ranks(path[:-1])).any())
        return ExtensionListing(path, at_top, names, ranks, _frozen(finals), _frozen(roots), bounds, separate)

    def _ranks(self, names: Iterable[str]) -> Ints:
        return self._rank[[self._name_ids[name] for name in names]]

    def _listed_cum(self, path: tuple[str, ...]) -> int | None:
        """The cum of ``path`` if it extends a path listed lately (worked out then with all of the listing's)."""
        for key, name in ((("top", path[1:]), path[0]), (("bottom", path[:-1]), path[-1])):
            listing = self._extensions.get(key)
            if listing is not None:
                i = listing.index(name)
                if i is not None:
                    return int(self._listing_cums(listing)[i])
        return None

    def _listing_cums(self, listing: ExtensionListing) -> Ints:
        """The cum of every extension of a listing, worked out together the first time.

        Zooming ranks every extension by cum, and a popular function has
        thousands. :meth:`_outermost_cums` where it applies, as in
        :meth:`_cum_of`: to an extension that occurs once, or whose path
        repeats no name; and at the top, to one whose caller's name is the
        path's last one, which otherwise it does not repeat: then the caller's
        node is the other occurrence's final node, below which the occurrence
        lies (see :meth:`_top_extension_prefixes`). The others (recursion) go
        through :meth:`_cums_of_sets`, all together, with their interior nodes.
        """
        if listing.cums is not None:
            return listing.cums
        path, bounds = listing.path, listing.bounds
        sizes = np.diff(bounds)
        if len(set(path)) == len(path):
            general = np.isin(listing.ranks, self._ranks(path[:-1] if listing.at_top else path))
        else:
            general = np.ones(len(listing), bool)
        general &= sizes > 1
        cums = self._outermost_cums(listing.finals, self._occurrence_values(listing.finals, listing.roots), bounds)
        if general.any():
            which = np.flatnonzero(general)
            finals = listing.finals[general[listing.group_of_occurrences()]]
            sub_bounds = _bounds(sizes[which])
            interior, group = self._grouped_interiors(finals, _group_of(sub_bounds), len(path) + 1)
            cums[which] = self._cums_of_sets(finals, sub_bounds, interior, group)
        listing.cums = _frozen(cums)
        return listing.cums

    def _grouped_interiors(self, finals: Ints, group: Ints, length: int) -> tuple[Ints, Ints]:
        """The interior nodes of occurrences of ``length``-long paths, each once per group, with their groups."""
        width = len(self._parent) + 1
        keys = _distinct(self._chains(finals, length) + np.tile(group * width, length - 1))
        return keys % width, keys // width

    def _listing_prefix_totals(self, listing: ExtensionListing, place: Ints, count: int) -> Ints:
        """``total_cum_of`` of the first 1 .. ``count`` extensions of a listing, extension i coming at ``place[i]``.

        Extensions placed at ``count`` or after are left out. The occurrences
        of a listing's extensions are distinct, so each final node's index is
        its extension's place; otherwise as :meth:`_nested_prefixes`, or as
        :meth:`_top_extension_prefixes` for ``separate`` occurrences.
        """
        index = place[listing.group_of_occurrences()]
        chosen = index < count
        finals, roots, index = listing.finals[chosen], listing.roots[chosen], index[chosen]
        order = np.argsort(finals)
        finals, roots, index = finals[order], roots[order], index[order]
        if listing.separate:
            values = self._occurrence_values(finals, roots)
            return self._counted_prefixes(finals, index, values, _NO_INTS, _NO_INTS, count)
        length = len(listing.path) + 1
        interior, first = _first_of(self._chains(finals, length), np.tile(index, length - 1), count + 1)
        return self._counted_prefixes(finals, index, self._cum[finals], interior, first, count)

    def trim_top(self, summary: CallTreeSummary) -> CallTreeSummary | None:
        """The summary of ``path[1:]`` (it occurs at least wherever ``path`` does); ``None`` for a 1-long path."""
        if len(summary.path) <= 1:
            return None
        return self.summary(summary.path[1:])

    def trim_bottom(self, summary: CallTreeSummary) -> CallTreeSummary | None:
        """The summary of ``path[:-1]``; ``None`` for a 1-long path."""
        if len(summary.path) <= 1:
            return None
        return self.summary(summary.path[:-1])

    # --- metrics ---------------------------------------------------------------------

    def base_of(self, summary: CallTreeSummary) -> int:
        """The cost of along(s): the nodes on every occurrence of the path, each counted once."""
        path = summary.path
        if len(path) == 1:
            return int(self._name_base[self._name_ids[path[0]]])
        if len(set(path)) == len(path):
            # Occurrences of a path without a repeated name never share a node
            # (two sharing one would put its name at two places in the path), so
            # each occurrence's cost is a difference of chain costs.
            return int(self._chain_cost[summary.final_nodes].sum() - self._above[summary.root_nodes].sum())
        return int(self._cost[self._along([summary])].sum())

    def clear_caches(self) -> None:
        """Forget the cums worked out so far (what a benchmark of cold calls needs)."""
        self._cums.clear()
        self._total_cums.clear()
        self._prefix_totals.clear()
        self._extensions.clear()

    @staticmethod
    def _remember(cache: dict[tuple[str, ...], int], path: tuple[str, ...], value: int) -> int:
        if len(cache) >= _CUM_CACHE_SIZE:
            cache.clear()  # start over rather than track recency: a search moves on
        cache[path] = value
        return value

    def cum_of(self, summary: CallTreeSummary) -> int:
        """The cost of along(s) and of every descendant of final(s), each node counted once."""
        path = summary.path
        if len(path) == 1:
            return int(self._name_cum[self._name_ids[path[0]]])
        cached = self._cums.get(path)
        if cached is None:
            cached = self._listed_cum(path)
        if cached is None:
            cached = self._remember(self._cums, path, self._cum_of(summary))
        return cached

    def _cum_of(self, summary: CallTreeSummary) -> int:
        finals, path = summary.final_nodes, summary.path
        if len(finals) == 1 or len(set(path)) == len(path):
            return self._outermost_cum(finals, summary.root_nodes)
        return self._cum_of_sets(finals, self._interior(summary))

    def _outermost_cum(self, finals: Ints, roots: Ints) -> int:
        """The cum of occurrences ``roots[i]`` .. ``finals[i]`` (``finals`` sorted) of a path that repeats no name.

        Such occurrences share no node (that would put a name at two places in
        the path), and one below another's final node lies wholly in its
        subtree. So the cum adds up, over the final nodes below no other one,
        the final node's cum and the cost of its chain up to the root. (A single
        occurrence needs no condition on the path.)
        """
        cum, above = self._cum, self._above
        if len(finals) == 1:
            final = int(finals[0])
            return int(cum[final] + above[final] - above[int(roots[0])])
        reach = np.maximum.accumulate(self._end[finals])  # the furthest subtree end so far
        if bool((finals[1:] < reach[:-1]).any()):  # some final node is below another
            outermost = np.ones(len(finals), bool)
            outermost[1:] = finals[1:] >= reach[:-1]
            finals, roots = finals[outermost], roots[outermost]
        return int(cum[finals].sum() + above[finals].sum() - above[roots].sum())

    def _outermost_cums(self, finals: Ints, values: Ints, bounds: Ints) -> Ints:
        """:meth:`_outermost_cum` of every group ``finals[bounds[i]:bounds[i + 1]]`` at once.

        ``values`` holds each occurrence's cum on its own (its final node's cum
        and the cost of its chain above). Group ``i``'s nodes are shifted by
        ``i * (node count + 1)``, past every node of the groups before, so that
        one running maximum of subtree ends over all groups sees, within each
        group, only that group's own.
        """
        shift = _group_of(bounds) * (len(self._parent) + 1)
        reach = np.maximum.accumulate(self._end[finals] + shift)
        outermost = np.ones(len(finals), bool)
        outermost[1:] = finals[1:] + shift[1:] >= reach[:-1]
        return _segment_sums(np.where(outermost, values, 0), bounds)

    def _occurrence_values(self, finals: Ints, roots: Ints) -> Ints:
        """Each occurrence's cum on its own: its final node's, plus the chain from its root down to the final
        node's parent."""
        return self._cum[finals] + self._above[finals] - self._above[roots]

    def _one_name_listings(self) -> tuple[_OneNameListings, _OneNameListings]:
        """The extension listings of every path ``[f]`` of length 1, at the top and at the bottom (see
        :class:`_OneNameListings`).

        Every node with a caller ends an occurrence of one extension at each
        end: ``[m, f]`` at the top, where the node is f's and its caller m's,
        and ``[f, m]`` at the bottom, the other way round. The occurrence's
        root is the caller either way, so its cum on its own is the node's cum
        and the caller's cost.
        """
        nodes = np.flatnonzero(self._parent < len(self._parent))
        parents = self._parent[nodes]
        node_name, parent_name = self._name[nodes], self._name[parents]
        values = self._cum[nodes] + self._cost[parents]
        return (
            self._one_name_index(nodes, parents, values, node_name, self._rank[parent_name], at_top=True),
            self._one_name_index(nodes, parents, values, parent_name, self._rank[node_name], at_top=False),
        )

    def _one_name_index(
        self, nodes: Ints, parents: Ints, values: Ints, owner: Ints, rank: Ints, at_top: bool
    ) -> _OneNameListings:
        """The listings at one end, each node ending an occurrence of ``owner``'s path extended by the name of
        rank ``rank``."""
        k = len(self.names)
        # Two stable sorts: by the added name's rank, then by the extended name, keeping the first order within.
        order = _stable_order(rank, k + 1)
        order = order[_stable_order(owner[order], k)]
        finals, roots, values = _frozen(nodes[order]), _frozen(parents[order]), values[order]
        owner, rank = owner[order], rank[order]
        change = np.flatnonzero((owner[1:] != owner[:-1]) | (rank[1:] != rank[:-1])) + 1
        bounds = _frozen(np.concatenate((np.zeros(min(len(finals), 1), np.int64), change, [len(finals)])))
        ranks, owners = _frozen(rank[bounds[:-1]]), owner[bounds[:-1]]
        cums = self._outermost_cums(finals, values, bounds)
        if not at_top:
            # [f, f] repeats a name (recursion): as in _listing_cums, with the interior nodes, the roots.
            sizes = np.diff(bounds)
            general = (ranks == self._rank[owners]) & (sizes > 1)
            occurrences = general[_group_of(bounds)]
            sub_bounds = _bounds(sizes[general])
            cums[general] = self._cums_of_sets(
                finals[occurrences], sub_bounds, roots[occurrences], _group_of(sub_bounds)
            )
        first = _frozen(_bounds(np.bincount(owners, minlength=k)))
        return _OneNameListings(finals, roots, bounds, ranks, _frozen(cums), first)

    def total_base_of(self, summaries: Iterable[CallTreeSummary]) -> int:
        """The cost of along(S), the union of along(s) over the summaries."""
        return int(self._cost[self._along(list(summaries))].sum())

    def total_cum_of(self, summaries: Iterable[CallTreeSummary]) -> int:
        """The cost of along(S) | descendants(S), each node counted once."""
        by_path = {s.path: s for s in summaries}
        # A summary whose path starts with another's path adds nothing: the first
        # nodes of each of its occurrences are an occurrence of the other, and
        # the rest lies below that one's final node. (Selecting [f, g] with the
        # label [f] on is the common case: its overlap is then read off caches.)
        summaries = [s for path, s in by_path.items() if not any(path[:k] in by_path for k in range(1, len(path)))]
        if not summaries:
            return 0
        if len(summaries) == 1:
            return self.cum_of(summaries[0])
        # The same labels are overlapped with every summary the search selects.
        key = frozenset(s.path for s in summaries)
        total = self._total_cums.get(key)
        if total is None:
            total = self._total_cums[key] = self._total_cum_of(summaries)
            if len(self._total_cums) > _TOTAL_CACHE_SIZE:
                self._total_cums.clear()
        return total

    def _total_cum_of(self, summaries: list[CallTreeSummary]) -> int:
        if _siblings_at_top(summaries):
            return self._top_extension_prefixes(summaries)[-1]
        # A node final in two summaries is kept twice, which the sweep allows.
        finals = np.sort(np.concatenate([s.final_nodes for s in summaries]))
        return self._cum_of_sets(finals, _distinct(np.concatenate([self._chain_of(s) for s in summaries])))

    def _cum_of_sets(self, finals: Ints, interior: Ints) -> int:
        """:meth:`_cums_of_sets` of one group."""
        return int(self._cums_of_sets(finals, np.array([0, len(finals)]), interior, np.zeros_like(interior))[0])

    def _cums_of_sets(self, finals: Ints, bounds: Ints, interior: Ints, group: Ints) -> Ints:
        """The paper's formula, for each group ``i`` of final nodes ``finals[bounds[i]:bounds[i + 1]]`` and the
        interior nodes ``interior[group == i]``: cum-cost of final(S) - descendants(S) plus cost of interior(S) -
        descendants(S).

        Each group's final nodes are sorted, repeats allowed. A node is in
        descendants(S) when it lies before the furthest subtree end of the
        finals that precede it in preorder: with those running maxima, both
        tests are a lookup per node. A repeated final node lies before its own
        first copy's end, so it counts once; an interior node that is also
        final is found with its own end among those before it, so it counts
        only through the cum. Groups are shifted apart as in :meth:`_outermost_cums`.
        """
        width = len(self._parent) + 1
        shift = _group_of(bounds) * width
        shifted = finals + shift
        # reach[i]: the furthest subtree end among the first i finals; reach[0] = -1 (none yet)
        reach = np.empty(len(finals) + 1, np.int64)
        reach[0] = -1
        np.maximum.accumulate(self._end[finals] + shift, out=reach[1:])
        top_level = shifted >= reach[:-1]  # not below an earlier final
        totals = _segment_sums(np.where(top_level, self._cum[finals], 0), bounds)
        if len(interior):
            at = interior + group * width
            uncovered = at >= reach[np.searchsorted(shifted, at, side="right")]
            np.add.at(totals, group[uncovered], self._cost[interior[uncovered]])
        return totals

    def total_cum_of_prefixes(self, summaries: Sequence[CallTreeSummary]) -> list[int]:
        """``total_cum_of(summaries[:n])`` for n = 1, 2, ...: what zooming needs, in one pass.

        Top extensions of one path (what zooming lists at the top, see
        :func:`_siblings_at_top`) go through :meth:`_top_extension_prefixes`,
        everything else through :meth:`_nested_prefixes`.
        """
        if not summaries:
            return []
        key = tuple(s.path for s in summaries)
        totals = self._prefix_totals.get(key)
        if totals is None:
            if _siblings_at_top(summaries):
                totals = self._top_extension_prefixes(summaries)
            else:
                totals = self._nested_prefixes(summaries)
            if len(self._prefix_totals) >= _TOTAL_CACHE_SIZE:
                self._prefix_totals.clear()
            self._prefix_totals[key] = totals
        return list(totals)

    def iter_total_cum_of_prefixes(self, summaries: Sequence[CallTreeSummary]) -> Iterator[int]:
        """:meth:`total_cum_of_prefixes`, one total at a time, each batch worked out when it is asked for.

        Zooming stops at the first prefix that reaches its bound, usually a
        short one of a long list: the totals come from :meth:`total_cum_of_prefixes`
        on the first 16 summaries, then 32, 64 and so on.
        """
        done = 0
        while done < len(summaries):
            totals = self.total_cum_of_prefixes(summaries[: _batch(done, len(summaries))])
            yield from totals[done:]
            done = len(totals)

    def _top_extension_prefixes(self, summaries: Sequence[CallTreeSummary]) -> list[int]:
        """The totals of every prefix of top extensions ``[m] + path`` of one path (see :func:`_siblings_at_top`).

        What zooming asks for, so it gets a shortcut. The occurrences of the
        extensions are distinct occurrences of ``path``, which repeats no name:
        they share no node, and an occurrence below another's final node lies
        wholly in that subtree (the caller ``m`` is on no other occurrence's
        chain except as that final node itself, when ``m`` is the path's last
        name). So a prefix's total adds up, over the occurrences below no final
        node of the prefix, the occurrence's cum on its own: its final node's
        cum plus its chain's cost (see :meth:`_counted_prefixes`).
        """
        never = len(summaries)
        finals = np.concatenate([s.final_nodes for s in summaries])
        roots = np.concatenate([s.root_nodes for s in summaries])
        index = np.repeat(np.arange(never), [len(s) for s in summaries])
        order = np.argsort(finals)
        finals, roots, index = finals[order], roots[order], index[order]
        values = self._occurrence_values(finals, roots)
        totals: list[int] = self._counted_prefixes(finals, index, values, _NO_INTS, _NO_INTS, never).tolist()
        return totals

    def _nested_prefixes(self, summaries: Sequence[CallTreeSummary]) -> list[int]:
        """The totals of every prefix of ``summaries``, whatever their final nodes and interiors share.

        Each node counts from the first summary it is final in (with its
        subtree) or along (on its own), see :meth:`_counted_prefixes`.
        """
        never = len(summaries)
        finals, first_final = _first_index([s.final_nodes for s in summaries])
        interior, first_interior = _first_index([self._interior(s) for s in summaries])
        totals: list[int] = self._counted_prefixes(
            finals, first_final, self._cum[finals], interior, first_interior, never
        ).tolist()
        return totals

    def _counted_prefixes(
        self, finals: Ints, index: Ints, values: Ints, interior: Ints, interior_index: Ints, never: int
    ) -> Ints:
        """The totals of the prefixes 1 .. ``never`` of a list of summaries, from when each node starts to count.

        ``finals`` (sorted, distinct) are final nodes, each first final in
        summary ``index`` and worth ``values`` with everything below it (its
        cum, or an occurrence's cum); ``interior`` (distinct) are interior
        nodes, each first along summary ``interior_index``. Index ``never``
        stands for "never".

        Prefixes only grow, so a node, once counted, stays counted: node x
        counts from the first index t(x) at which it is along a summary or below
        one's final node, and the totals are the running sums of ``delta``,
        where ``delta[t(x)]`` adds up the cost of the nodes first counted there.
        Subtrees are not listed. A final node g, first final at index i, is
        *effective* when no final node above it is final at an index <= i: its
        subtree starts to count at i, except for the subtrees of effective
        final nodes below it, which start earlier and are taken out: its value
        is added at i and taken away at the least index of the final nodes
        above g (which counted g's subtree from then on). An interior node x
        counts from the first index it is along, if that is earlier than the
        least index of the final nodes holding it: its cost moves to the
        earlier index. :class:`_Nesting` finds those least indexes.
        """
        delta = np.zeros(never + 1, np.int64)
        nesting = _Nesting(finals, self._end[finals], index, never)
        effective = index < nesting.above
        values = values[effective]
        np.add.at(delta, index[effective], values)
        np.subtract.at(delta, nesting.above[effective], values)
        if len(interior):
            held = nesting.least_holding(interior)
            earlier = interior_index < held
            costs = self._cost[interior[earlier]]
            np.add.at(delta, interior_index[earlier], costs)
            np.subtract.at(delta, held[earlier], costs)
        return np.cumsum(delta[:never])

    def _chains(self, finals: Ints, length: int) -> Ints:
        """The nodes above each final node on its occurrence of a ``length``-long path: the parents of
        ``finals``, then their parents, and so on, ``length - 1`` rows one after the other."""
        rows = []
        node = finals
        for _ in range(length - 1):
            node = self._parent[node]
            rows.append(node)
        return np.concatenate(rows) if rows else _NO_INTS

    def _chain_of(self, summary: CallTreeSummary) -> Ints:
        if len(summary.path) == 2:
            return summary.root_nodes
        return self._chains(summary.final_nodes, len(summary.path))

    def _interior(self, summary: CallTreeSummary) -> Ints:
        """The nodes of the summary's occurrences other than their final nodes, sorted, each once.

        (The paper's interior(s) also leaves out nodes that are final in another
        occurrence; callers that need that subtract the finals.)
        """
        if len(summary.path) == 2:
            return summary.root_nodes  # distinct: each node has one child of a name
        return _distinct(self._chain_of(summary))

    def _along(self, summaries: list[CallTreeSummary]) -> Ints:
        """along(S): every node of every occurrence, each once."""
        if not summaries:
            return _NO_INTS
        return _distinct(np.concatenate([a for s in summaries for a in (s.final_nodes, self._chain_of(s))]))


class _Nesting:
    """Subtrees of distinct nodes, each with an index: the least index of those holding any node.

    Subtrees are intervals of preorder that nest or are disjoint, so the nodes
    form a forest under "holds". A node's *depth* here is how many of the others
    hold it: the nodes before it minus those whose subtree ends before it. The
    nearest node holding node j is the last one before j whose depth is one
    less (one in between at that depth would start inside the holder and so be
    held by it too). With the nodes sorted by (depth, position), finding it is a
    bisection; the least index over a node and all that hold it is then pushed
    down the forest one depth at a time.
    """

    def __init__(self, nodes: Ints, ends: Ints, index: Ints, never: int) -> None:
        """``nodes`` sorted and distinct, ``ends`` their subtree ends; ``never`` stands for "no index"."""
        self.nodes = nodes
        self.never = never
        self.ends = np.sort(ends)
        count = len(nodes)
        depth = np.arange(count) - np.searchsorted(self.ends, nodes, side="right")
        levels = np.bincount(depth) if count else np.zeros(1, np.int64)
        order = _stable_order(depth, len(levels))
        self.width = count + 1
        self.keys = (depth * self.width + np.arange(count))[order]  # sorted
        #: the least index of the nodes holding each one (``never``: none does)
        self.above = np.full(count, never, np.int64)
        #: the least index of each node and the nodes holding it
        self.least = index.copy()
        bounds = _bounds(levels).tolist()
        for d in range(1, len(levels)):
            members = order[bounds[d] : bounds[d + 1]]
            holder = self._last(np.full(len(members), d - 1), members)
            self.above[members] = self.least[holder]
            self.least[members] = np.minimum(index[members], self.above[members])

    def _last(self, depth: Ints, position: Ints) -> Ints:
        """For each pair, the last node at ``depth`` at or before ``position`` (one must exist)."""
        found = np.searchsorted(self.keys, depth * self.width + position, side="right") - 1
        return self.keys[found] - depth * self.width

    def least_holding(self, queries: Ints) -> Ints:
        """For each query node, the least index of the nodes whose subtree holds it, itself included."""
        last = np.searchsorted(self.nodes, queries, side="right") - 1  # the last node at or before it
        holders = (last + 1) - np.searchsorted(self.ends, queries, side="right")
        least = np.full(len(queries), self.never, np.int64)
        held = holders > 0
        least[held] = self.least[self._last(holders[held] - 1, last[held])]
        return least


def _batch(done: int, count: int) -> int:
    """How many of ``count`` prefix totals to work out when ``done`` are: the first batch, then twice as many."""
    return min(count, max(_FIRST_BATCH, 2 * done, 1))


def _frozen(values: Ints) -> Ints:
    """``values``, made read-only: summaries and listings hand out views of the profile's arrays."""
    values.flags.writeable = False
    return values


def _stable_order(keys: Ints, bound: int) -> Ints:
    """The stable sort order of ``keys`` (all in ``0 .. bound - 1``): a radix sort when they fit in 16 bits."""
    if bound <= _RADIX_LIMIT:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    return np.argsort(keys, kind="stable")


def _bounds(counts: Ints) -> Ints:
    """Where each group starts when groups of ``counts`` elements follow each other, and where the last one ends."""
    return np.concatenate((np.zeros(1, np.int64), np.cumsum(counts, dtype=np.int64)))


def _group_of(bounds: Ints) -> Ints:
    """The group of each element, for groups laid out as ``bounds`` says."""
    return np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))


def _segment_sums(values: Ints, bounds: Ints) -> Ints:
    """The sum of each group of ``values`` (empty groups allowed), exact in int64."""
    running = np.concatenate((np.zeros(1, np.int64), np.cumsum(values, dtype=np.int64)))
    return running[bounds[1:]] - running[bounds[:-1]]


def _ranges(first: Ints, counts: Ints) -> Ints:
    """``first[i] .. first[i] + counts[i] - 1`` for every i, one after the other."""
    before = np.cumsum(counts) - counts
    return np.repeat(first - before, counts) + np.arange(int(counts.sum()))


def _distinct(values: Ints) -> Ints:
    """The values sorted, each once (``np.unique`` without its overhead)."""
    values = np.sort(values)
    if len(values) > 1:
        keep = np.ones(len(values), bool)
        keep[1:] = values[1:] != values[:-1]
        values = values[keep]
    return values


def _first_index(groups: Sequence[Ints]) -> tuple[Ints, Ints]:
    """Every node of the groups, sorted, each once, with the index of the first group it is in."""
    index = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    return _first_of(np.concatenate(groups), index, len(groups) + 1)


def _first_of(nodes: Ints, index: Ints, width: int) -> tuple[Ints, Ints]:
    """The distinct ``nodes``, sorted, each with its least ``index`` (all below ``width``)."""
    keys = np.sort(nodes * width + index)
    nodes = keys // width
    first = np.ones(len(keys), bool)
    first[1:] = nodes[1:] != nodes[:-1]
    return nodes[first], keys[first] - nodes[first] * width


def _siblings_at_top(summaries: Sequence[CallTreeSummary]) -> bool:
    """Whether the summaries are top extensions ``[m] + path`` of one path with no repeated name, with distinct
    callers ``m``, none of them in ``path`` except possibly as its last name (``[f, f]`` extends ``[f]``)."""
    path = summaries[0].path[1:]
    if not path or len(set(path)) != len(path):
        return False
    callers = {s.path[0] for s in summaries}
    return (
        len(callers) == len(summaries) and all(s.path[1:] == path for s in summaries) and callers.isdisjoint(path[:-1])
    )


def _shared_frames(stack: str, previous: str, previous_ends: list[int]) -> int:
    """How many leading frames ``stack`` shares with ``previous``, whose frames end at ``previous_ends``.

    Sharing j frames implies sharing j - 1, so the answer is searched from the
    end (in sorted input a line mostly shares all but its last frame or two
    with the one before): a gallop down, then a bisection.
    """

    def shares(j: int) -> bool:
        end = previous_ends[j - 1]
        return stack.startswith(previous[:end]) and (len(stack) == end or stack[end] == ";")

    high = len(previous_ends)
    if high == 0 or shares(high):
        return high
    step = 1
    low = high - 1
    while low > 0 and not shares(low):
        high = low
        step *= 2
        low = max(high - step, 0)
    # shares(low) (or low == 0), not shares(high)
    while high - low > 1:
        middle = (low + high) // 2
        if shares(middle):
            low = middle
        else:
            high = middle
    return low


def _split_collapsed(line: str, strip_austin: bool) -> tuple[str, int] | None:
    """The stack (frames root first, ';'-separated) and count of a collapsed line, or None if malformed."""
    parts = line.rsplit(None, 1)
    if len(parts) != 2:
        return None
    try:
        cost = int(parts[1])
    except ValueError:
        return None
    if cost < 0:
        return None
    stack = parts[0]
    if strip_austin and stack.startswith("P"):
        process, _, rest = stack.partition(";")
        if _AUSTIN_PROCESS.fullmatch(process) and rest.startswith("T"):
            stack = rest.partition(";")[2]  # empty for a thread sampled with no Python frame
    if not stack or stack.startswith(";") or stack.endswith(";") or ";;" in stack:
        return None  # an empty frame
    return stack, cost
