"""The profile interface over one call tree (seed 000, section 2.2, "Call-tree Profiles").

The tree is stored as flat lists indexed by node id, with ids given in DFS
preorder. Preorder makes a subtree an interval: node ``n`` and its descendants
are exactly the ids ``n .. end[n]-1``. That turns the paper's "is ``n`` in
descendants(s)?" from a walk to the root into a comparison, so cum and overlap
cost one pass over the summary's final nodes, without ever listing a subtree.

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
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, compress, islice, repeat
from operator import add, ge, lt, sub
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from monitor.profile import Profile
    from monitor.session import Frame

#: "frame": a name is the whole frame string as written; "function": line numbers
#: are dropped, so the lines of one function merge into one name.
FrameKey = Literal["frame", "function"]

NodeId = int


@dataclass(frozen=True)
class CallTreeSummary:
    """A call sequence and the places it occurs (the paper's ``{calls; roots}``).

    ``finals[i]`` is the node at the end of one occurrence and ``roots[i]`` the
    node at its start, so extending at either end needs no walk along the path.
    ``finals`` is sorted (preorder), which is what the cum sweep relies on.

    Summaries compare and hash by path: a summary belongs to the profile that
    made it and means nothing in another one.
    """

    path: tuple[str, ...]
    finals: tuple[NodeId, ...] = field(compare=False, repr=False)
    roots: tuple[NodeId, ...] = field(compare=False, repr=False)

    def __len__(self) -> int:
        """How many places the call sequence occurs at."""
        return len(self.finals)


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
#: how many outermost occurrences the incremental prefix totals keep before batches are cheaper
#: (an insertion moves up to this many list slots; a popular function's first
#: few dozen callers on a million-node tree hold some 40 000 outermost occurrences)
_MAX_OUTERMOST = 1 << 16
#: and how many extension listings (each a few thousand summaries at most)
_EXTENSION_CACHE_SIZE = 16
# "qualname (file.py:12)" (dyper, py-spy): the line number inside the parentheses.
_PAREN_LINE = re.compile(r" \((?P<file>[^(]*):\d+\)$")
# "file.py:function:12" (Austin): a trailing line number.
_TRAILING_LINE = re.compile(r":\d+$")
# Austin's alternative format gives the line as a frame of its own, "L12".
_LINE_FRAME = re.compile(r"L\d+")
_AUSTIN_PROCESS = re.compile(r"P\d+")
# Name id of a frame that names no function (Austin's "L12" line frames, by function).
_DROPPED = -1


def function_key(frame: str) -> str:
    """The frame string without its line number: ``f (x.py:12)`` -> ``f (x.py)``, ``x.py:f:12`` -> ``x.py:f``."""
    m = _PAREN_LINE.search(frame)
    if m is not None:
        return f"{frame[: m.start()]} ({m['file']})"
    return _TRAILING_LINE.sub("", frame)


def frame_label(frame: Frame) -> str:
    """A dyper frame at line level, as ``monitor.exports`` writes it to collapsed files."""
    return f"{frame.name} ({frame.file}:{frame.line})".replace(";", ":")


def function_label(frame: Frame) -> str:
    """A dyper frame at function level: what :func:`function_key` makes of :func:`frame_label`."""
    return f"{frame.name} ({frame.file})".replace(";", ":")


class _TreeBuilder:
    """Grows the call tree stack by stack, then renumbers it in preorder.

    Nodes are created in the order stacks mention them, which puts every parent
    before its children but does not make subtrees contiguous; :meth:`finish`
    computes subtree sizes and lays the nodes out in preorder.
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self.parent: list[NodeId] = []
        self.name: list[int] = []
        self.cost: list[int] = []
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
        return child

    def add(self, stack: Iterable[int], cost: int) -> None:
        """Charge ``cost`` to the node for ``stack`` (name ids, root first)."""
        node = -1
        for nid in stack:
            node = self.child(node, nid)
        if node >= 0:
            self.cost[node] += cost

    def finish(self) -> CallTreeProfile:
        parent, name, cost = self.parent, self.name, self.cost
        n = len(parent)
        self.children.clear()  # only needed while growing; free it before the new lists exist
        # Children come after their parent: one backward pass sums subtree
        # sizes and cum-costs, one forward pass sums chain costs from the root.
        size = [1] * n
        cum = list(cost)
        for i in range(n - 1, -1, -1):
            p = parent[i]
            if p >= 0:
                size[p] += size[i]
                cum[p] += cum[i]
        # Preorder position of each node: a node's subtree starts where its parent
        # says the next free slot is, and occupies size[] slots.
        position = [0] * n
        next_free = [0] * n
        chain_cost = list(cost)
        next_root = 0
        for i in range(n):
            p = parent[i]
            if p < 0:
                at = next_root
                next_root += size[i]
            else:
                at = next_free[p]
                next_free[p] = at + size[i]
                chain_cost[i] += chain_cost[p]
            position[i] = at
            next_free[i] = at + 1
        del next_free
        if position == list(range(n)):
            # Stacks came sorted or in DFS order (dyper's and flamegraph's
            # collapsed files do): nodes were created in preorder already.
            tree = _Tree(
                self.names,
                [p if p >= 0 else n for p in parent],  # n: the virtual root, see CallTreeProfile
                name,
                cost,
                [i + s for i, s in enumerate(size)],
                cum,
                chain_cost,
            )
            return CallTreeProfile(tree)
        tree = _Tree(self.names, [n] * n, [0] * n, [0] * n, [0] * n, [0] * n, [0] * n)
        for i in range(n):
            at = position[i]
            p = parent[i]
            if p >= 0:
                tree.parent[at] = position[p]
            tree.name[at] = name[i]
            tree.cost[at] = cost[i]
            tree.end[at] = at + size[i]
            tree.cum[at] = cum[i]
            tree.chain_cost[at] = chain_cost[i]
        return CallTreeProfile(tree)


@dataclass
class _Tree:
    """A call tree laid out in preorder, as :class:`CallTreeProfile` keeps it.

    Per node: ``parent`` (``len(parent)`` for a root: the virtual root),
    ``name`` (an index into ``names``), ``cost`` (its own), ``end`` (one past
    the last node of its subtree), ``cum`` (cost of its subtree) and
    ``chain_cost`` (cost of the nodes from the root down to it).
    """

    names: list[str]
    parent: list[NodeId]
    name: list[int]
    cost: list[int]
    end: list[NodeId]
    cum: list[int]
    chain_cost: list[int]


class CallTreeProfile:
    """A call-tree profile behind the paper's profile interface (Figure 3).

    Build one with :meth:`from_collapsed`, :meth:`from_profile` (dyper's saved or
    live profiles) or :meth:`from_stacks`.

    Node costs are never negative (a comparison of two profiles is
    :class:`~monitor.search.comparative.ComparativeProfile`).

    Hot loops go through ``map``/``compress`` over the node lists rather than
    Python-level loops where they can: a popular function can occur at 100 000
    places of a million-node tree, and every operation touches each of them.

    A search asks for the same numbers repeatedly (zooming ranks a summary's
    extensions by cum, the listing shows those cums, every selection is
    overlapped with the same labels), so cums, totals, prefix totals and
    extension listings are cached by path, in bounded caches that start over
    when full. Summaries hash by path, and a path means one set of occurrences
    in one profile, so a cached answer is the answer. :meth:`clear_caches`
    empties them (benchmarks of cold calls).
    """

    #: adding summaries never lowers total_cum_of: all costs are >= 0
    monotone = True

    def __init__(self, tree: _Tree) -> None:
        """Use :meth:`from_collapsed`, :meth:`from_profile` or :meth:`from_stacks`.

        The parent of a root is a virtual node, ``len(parent)``, with no name
        (-1) and no cost, appended to the name, cost and chain-cost lists here,
        so that looking up a parent's name or cost never needs a test for
        "is a root".
        """
        self.names: tuple[str, ...] = tuple(tree.names)
        self._name_ids = {s: i for i, s in enumerate(self.names)}
        # One int object per node id and per name id, shared by every list that
        # holds it: a third of the memory, and lookups that stay in the cache.
        ids = list(range(len(tree.parent) + 1))
        name_ids = list(range(len(self.names)))
        self._parent = list(map(ids.__getitem__, tree.parent))
        self._name = [*map(name_ids.__getitem__, tree.name), -1]
        self._cost = [*tree.cost, 0]
        self._end = list(map(ids.__getitem__, tree.end))
        self._cum = tree.cum
        self._chain_cost = [*tree.chain_cost, 0]
        # The cost of a node's strict ancestors, chain_cost[parent[n]]: the chain
        # part of an occurrence's cost is one lookup at each end, not two.
        self._above = list(map(self._chain_cost.__getitem__, self._parent))
        by_name: list[list[NodeId]] = [[] for _ in self.names]
        for i, nid in zip(ids, tree.name, strict=False):  # ids has one more: the virtual root
            by_name[nid].append(i)
        # Sorted by construction (preorder), which the cum sweep needs.
        self._by_name: list[tuple[NodeId, ...]] = [tuple(nodes) for nodes in by_name]
        self._total = sum(self._cum[i] for i in self._tree_roots())
        # Path -> cum. A search asks for the same cums again and again (a selection
        # is zoomed, listed, then overlapped with the labels), and listing the
        # extensions of a summary works out theirs in bulk.
        self._cums: dict[tuple[str, ...], int] = {}
        # Set of paths -> total_cum_of.
        self._total_cums: dict[frozenset[tuple[str, ...]], int] = {}
        # List of paths -> total_cum_of_prefixes (zooming again asks for the same).
        self._prefix_totals: dict[tuple[tuple[str, ...], ...], list[int]] = {}
        # ("top" or "bottom", path) -> the extension listing; and the listings whose
        # cums are in the cum cache already.
        self._extensions: dict[tuple[str, tuple[str, ...]], list[CallTreeSummary]] = {}
        self._cums_listed: set[tuple[str, tuple[str, ...]]] = set()
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
                            child = builder.child(node, nid)
                        node = child
                    nodes.append(node)
            if node >= 0:
                builder.cost[node] += cost
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
    ) -> CallTreeProfile:
        """The call tree of a dyper :class:`~monitor.profile.Profile` (saved, or live via ``Profile.from_session``).

        All threads merge (each thread's outermost function is a root), as in
        ``Profile.tree``. Names are ``qualname (file)`` by default, one per
        function; ``frame_key="frame"`` keeps ``qualname (file:line)``, one per
        line. Both are exactly what :meth:`from_collapsed` makes of dyper's own
        collapsed export with the same ``frame_key``, so the two can be compared.
        ``charge_libraries`` charges time inside the standard library and
        packages to the application line that called them (``Profile.charged_stacks``).
        """
        if metric not in ("cpu", "wall"):
            raise ValueError(f"metric must be 'cpu' or 'wall', not {metric!r}")
        builder = _TreeBuilder()
        label = function_label if frame_key == "function" else frame_label
        labels = [label(f) for f in profile.frames]
        for stack, frames in profile.charged_stacks(charge_libraries):
            cost = stack.cpu if metric == "cpu" else stack.wall
            if cost > 0 and frames:
                # Names are registered as stacks use them, so that a frame seen
                # only in stacks without cost (a sleep, for cpu) names nothing.
                builder.add([builder.name_id(labels[i]) for i in frames], cost)
        return builder.finish()

    # --- size ------------------------------------------------------------------------

    @property
    def node_count(self) -> int:
        return len(self._parent)

    def total(self) -> int:
        """The cost of the whole tree."""
        return self._total

    def _tree_roots(self) -> Iterator[NodeId]:
        node = 0
        while node < len(self._parent):
            yield node
            node = self._end[node]

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
        finals = self._by_name[ids[-1]]
        roots = finals
        for nid in reversed(ids[:-1]):
            finals, roots = self._keep_with_parent(finals, roots, nid)
            if not finals:
                return None
        return CallTreeSummary(path, finals, roots)

    def _keep_with_parent(
        self, finals: tuple[NodeId, ...], roots: tuple[NodeId, ...], nid: int
    ) -> tuple[tuple[NodeId, ...], tuple[NodeId, ...]]:
        """The occurrences whose root's parent is named ``nid``, extended up to that parent."""
        parents = list(map(self._parent.__getitem__, roots))
        keep = list(map(nid.__eq__, map(self._name.__getitem__, parents)))
        return tuple(compress(finals, keep)), tuple(compress(parents, keep))

    def path_of(self, summary: CallTreeSummary) -> tuple[str, ...]:
        return summary.path

    def initial_summaries(self) -> list[CallTreeSummary]:
        """One summary per function name in the tree, in name order."""
        return [
            CallTreeSummary((self.names[nid],), nodes, nodes)
            for nid, nodes in sorted(enumerate(self._by_name), key=lambda item: self.names[item[0]])
            if nodes
        ]

    def top_extensions(self, summary: CallTreeSummary) -> list[str]:
        """The names of the parents of the summary's roots: who calls the path's first call."""
        ids = set(map(self._name.__getitem__, map(self._parent.__getitem__, summary.roots)))
        ids.discard(-1)  # the virtual root: occurrences that start at a root of the tree
        return sorted(self.names[i] for i in ids)

    def bottom_extensions(self, summary: CallTreeSummary) -> list[str]:
        """The names of the children of the summary's final nodes: what the path's last call calls."""
        name, end = self._name, self._end
        ids: set[int] = set()
        for f in summary.finals:
            child, stop = f + 1, end[f]
            while child < stop:
                ids.add(name[child])
                child = end[child]
        return sorted(self.names[i] for i in ids)

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
        finals, roots = self._keep_with_parent(summary.finals, summary.roots, nid)
        if not finals:
            return None
        return CallTreeSummary((name, *summary.path), finals, roots)

    def try_extend_bottom(self, summary: CallTreeSummary, name: str) -> CallTreeSummary | None:
        """Like :meth:`extend_bottom`, but ``None`` when ``path + [name]`` never occurs."""
        nid = self._name_ids.get(name)
        if nid is None:
            return None
        # The new final nodes are the nodes named `name` whose parent is a final
        # node of `summary`; going through the name's node list keeps them in preorder.
        root_of = dict(zip(summary.finals, summary.roots, strict=True))
        candidates = self._by_name[nid]
        parents = list(map(self._parent.__getitem__, candidates))
        keep = list(map(root_of.__contains__, parents))
        finals = tuple(compress(candidates, keep))
        if not finals:
            return None
        roots = tuple(map(root_of.__getitem__, compress(parents, keep)))
        return CallTreeSummary((*summary.path, name), finals, roots)

    def top_extension_summaries(self, summary: CallTreeSummary) -> list[CallTreeSummary]:
        """Every top extension of ``summary`` as a summary, grouped in one pass over its roots."""
        return self._extensions_cached("top", summary, self._top_extension_summaries)

    def bottom_extension_summaries(self, summary: CallTreeSummary) -> list[CallTreeSummary]:
        """Every bottom extension of ``summary`` as a summary, grouped in one pass over the children of its finals."""
        return self._extensions_cached("bottom", summary, self._bottom_extension_summaries)

    def _extensions_cached(
        self,
        end: Literal["top", "bottom"],
        summary: CallTreeSummary,
        compute: Callable[[CallTreeSummary], list[CallTreeSummary]],
    ) -> list[CallTreeSummary]:
        """The extension listing, from the cache if this path was listed lately (zooming back, re-selecting).

        A copy is returned: callers may sort or trim the list they get.
        """
        key = (end, summary.path)
        listed = self._extensions.get(key)
        if listed is None:
            listed = compute(summary)
            if len(self._extensions) >= _EXTENSION_CACHE_SIZE:
                self._extensions.clear()
                self._cums_listed.clear()
            self._extensions[key] = listed
        return list(listed)

    def _top_extension_summaries(self, summary: CallTreeSummary) -> list[CallTreeSummary]:
        parents = list(map(self._parent.__getitem__, summary.roots))
        groups: dict[int, list[int]] = {}  # parent's name -> indexes of the occurrences
        for i, nid in enumerate(map(self._name.__getitem__, parents)):
            if nid in groups:
                groups[nid].append(i)
            else:
                groups[nid] = [i]
        groups.pop(-1, None)  # occurrences at a root of the tree have no caller
        finals = summary.finals
        extended = [
            CallTreeSummary(
                (self.names[nid], *summary.path),
                tuple(map(finals.__getitem__, indexes)),
                tuple(map(parents.__getitem__, indexes)),
            )
            for nid, indexes in groups.items()
        ]
        extended.sort(key=lambda s: s.path)
        return extended

    def _bottom_extension_summaries(self, summary: CallTreeSummary) -> list[CallTreeSummary]:
        name, end = self._name, self._end
        groups: dict[int, tuple[list[NodeId], list[NodeId]]] = {}  # callee's name -> (its nodes, their roots)
        for f, r in zip(summary.finals, summary.roots, strict=True):
            child, stop = f + 1, end[f]
            while child < stop:
                group = groups.get(name[child])
                if group is None:
                    group = groups[name[child]] = ([], [])
                group[0].append(child)
                group[1].append(r)
                child = end[child]
        extended = []
        for nid, (finals, roots) in groups.items():
            if any(map(lt, islice(finals, 1, None), finals)):
                # Under recursion a final node can lie inside another's subtree,
                # so children of different finals interleave: restore preorder.
                order = sorted(range(len(finals)), key=finals.__getitem__)
                finals = list(map(finals.__getitem__, order))
                roots = list(map(roots.__getitem__, order))
            extended.append(CallTreeSummary((*summary.path, self.names[nid]), tuple(finals), tuple(roots)))
        extended.sort(key=lambda s: s.path)
        return extended

    def _remember_listed_cums(self, summary: CallTreeSummary) -> None:
        """If ``summary`` is in a cached extension listing, put the cums of that listing in the cum cache.

        Zooming ranks every extension by cum, and a popular function has
        thousands: worked out here together, when the first is asked for, each
        is a few passes over its occurrences, without a call through
        :meth:`cum_of` apiece (and a listing nobody ranks costs nothing more).
        That applies where :meth:`_outermost_cum` does: when the extended path
        repeats no name, or at the top when the caller's name is the path's
        last one: then the caller's node is the other occurrence's final node,
        below which the occurrence lies (see :meth:`_top_extension_prefixes`).
        """
        for at_top, key in ((True, ("top", summary.path[1:])), (False, ("bottom", summary.path[:-1]))):
            if key in self._cums_listed:
                continue
            extended = self._extensions.get(key)
            if extended is not None:
                self._cums_listed.add(key)
                self._remember_cums(extended, key[1], at_top)

    def _remember_cums(self, extended: list[CallTreeSummary], path: tuple[str, ...], at_top: bool) -> None:
        if len(set(path)) != len(path):
            return  # every extension repeats a name
        blocked = set(path[:-1] if at_top else path)
        outermost_cum, cums = self._outermost_cum, self._cums
        for e in extended:
            if (e.path[0] if at_top else e.path[-1]) not in blocked:
                self._remember(cums, e.path, outermost_cum(e.finals, e.roots))

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
        cost = self._cost
        if len(summary.path) == 1:
            return sum(map(cost.__getitem__, summary.finals))
        if len(set(summary.path)) == len(summary.path):
            # Occurrences of a path without a repeated name never share a node
            # (two sharing one would put its name at two places in the path), so
            # each occurrence's cost is a difference of chain costs.
            return sum(map(self._chain_cost.__getitem__, summary.finals)) - sum(
                map(self._above.__getitem__, summary.roots)
            )
        return sum(map(cost.__getitem__, self._along([summary])))

    def clear_caches(self) -> None:
        """Forget the cums worked out so far (what a benchmark of cold calls needs)."""
        self._cums.clear()
        self._total_cums.clear()
        self._prefix_totals.clear()
        self._extensions.clear()
        self._cums_listed.clear()

    @staticmethod
    def _remember(cache: dict[tuple[str, ...], int], path: tuple[str, ...], value: int) -> int:
        if len(cache) >= _CUM_CACHE_SIZE:
            cache.clear()  # start over rather than track recency: a search moves on
        cache[path] = value
        return value

    def cum_of(self, summary: CallTreeSummary) -> int:
        """The cost of along(s) and of every descendant of final(s), each node counted once."""
        cached = self._cums.get(summary.path)
        if cached is None and len(summary.path) > 1:
            self._remember_listed_cums(summary)
            cached = self._cums.get(summary.path)
        if cached is None:
            cached = self._remember(self._cums, summary.path, self._cum_of(summary))
        return cached

    def _cum_of(self, summary: CallTreeSummary) -> int:
        finals, path = summary.finals, summary.path
        if len(path) == 1:
            return self._outermost_cum(finals, finals)
        if len(finals) == 1 or len(set(path)) == len(path):
            return self._outermost_cum(finals, summary.roots)
        if self._nested(finals):
            return self._cum_of_sets(finals, self._interior(summary))
        # No final node is below another, so no node of an occurrence is below
        # another occurrence's final node: the subtrees of the final nodes and
        # the interior nodes are all disjoint.
        return sum(map(self._cum.__getitem__, finals)) + sum(map(self._cost.__getitem__, self._interior(summary)))

    def _outermost_cum(self, finals: Sequence[NodeId], roots: Sequence[NodeId]) -> int:
        """The cum of occurrences ``roots[i]`` .. ``finals[i]`` (``finals`` sorted) of a path that repeats no name.

        Such occurrences share no node (that would put a name at two places in
        the path), and one below another's final node lies wholly in its
        subtree. So the cum adds up, over the final nodes below no other one,
        the final node's cum and the cost of its chain up to the root. (A single
        occurrence needs no condition on the path.)
        """
        cum, above = self._cum, self._above
        if len(finals) == 1:
            # Most extensions of a summary occur once or twice: no passes to set up.
            final = finals[0]
            return cum[final] + above[final] - above[roots[0]]
        alone = roots is finals  # a path of length 1: occurrences are their final nodes
        ends = list(map(self._end.__getitem__, finals))
        if any(map(lt, islice(finals, 1, None), ends)):  # some final node is below another
            # reach[i]: the furthest subtree end among finals[:i]; reach[0] = -1 (none yet)
            top_level = list(map(ge, finals, [-1, *accumulate(ends, max)]))
            finals = list(compress(finals, top_level))
            roots = finals if alone else list(compress(roots, top_level))
        total = sum(map(cum.__getitem__, finals))
        if alone:
            return total
        return total + sum(map(above.__getitem__, finals)) - sum(map(above.__getitem__, roots))

    def total_base_of(self, summaries: Iterable[CallTreeSummary]) -> int:
        """The cost of along(S), the union of along(s) over the summaries."""
        return sum(map(self._cost.__getitem__, self._along(list(summaries))))

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
        interior: set[NodeId] = set()
        for s in summaries:
            interior |= self._interior(s)
        # Each summary's final nodes are sorted already: the sort merges runs.
        # A node final in two summaries is kept twice, which the sweep allows.
        return self._cum_of_sets(sorted(chain.from_iterable(s.finals for s in summaries)), interior)

    def _cum_of_sets(self, finals: Sequence[NodeId], interior: Iterable[NodeId]) -> int:
        """The paper's formula: cum-cost of final(S) - descendants(S) plus cost of interior(S) - descendants(S).

        ``finals`` is sorted, repeats allowed. A node is in descendants(S) when
        it lies before the furthest subtree end of the finals that precede it in
        preorder: with those running maxima, both tests are a lookup per node.
        A repeated final node lies before its own first copy's end, so it counts
        once; an interior node (no repeats) that is also final is found with
        its own end among those before it, so it counts only through the cum.
        """
        end, cum, cost = self._end, self._cum, self._cost
        # reach[i]: the furthest subtree end among finals[:i]; reach[0] = -1 (none yet)
        reach = [-1, *accumulate(map(end.__getitem__, finals), max)]
        top_level = map(ge, finals, reach)  # not below an earlier final
        total = sum(map(cum.__getitem__, compress(finals, top_level)))
        interior = list(interior)
        below = map(reach.__getitem__, map(bisect_right, repeat(finals), interior))
        uncovered = map(ge, interior, below)
        return total + sum(map(cost.__getitem__, compress(interior, uncovered)))

    def total_cum_of_prefixes(self, summaries: Sequence[CallTreeSummary]) -> list[int]:
        """``total_cum_of(summaries[:n])`` for n = 1, 2, ...: what zooming needs, in one pass.

        When no final node of any summary is below another and no final node of
        one is an interior node of another, the sets are disjoint except for
        repeats, and each summary adds the cum-cost of its new final nodes and
        the cost of its new interior nodes. Otherwise (recursion),
        :meth:`_nested_prefixes` works out when each node starts to count.
        """
        if not summaries:
            return []
        key = tuple(s.path for s in summaries)
        totals = self._prefix_totals.get(key)
        if totals is None:
            totals = self._total_cum_of_prefixes(summaries)
            if len(self._prefix_totals) >= _TOTAL_CACHE_SIZE:
                self._prefix_totals.clear()
            self._prefix_totals[key] = totals
        return list(totals)

    def _total_cum_of_prefixes(self, summaries: Sequence[CallTreeSummary]) -> list[int]:
        if _siblings_at_top(summaries):
            return self._top_extension_prefixes(summaries)
        interiors = [self._interior(s) for s in summaries]
        all_finals: set[NodeId] = set()
        for s in summaries:
            all_finals.update(s.finals)
        if self._nested(sorted(all_finals)) or any(not all_finals.isdisjoint(i) for i in interiors):
            return self._nested_prefixes(summaries, interiors)
        cum, cost = self._cum, self._cost
        seen_finals: set[NodeId] = set()
        seen_interior: set[NodeId] = set()
        total = 0
        totals = []
        for s, interior in zip(summaries, interiors, strict=True):
            new_finals = set(s.finals).difference(seen_finals)
            seen_finals |= new_finals
            new_interior = interior.difference(seen_interior)
            seen_interior |= new_interior
            total += sum(map(cum.__getitem__, new_finals)) + sum(map(cost.__getitem__, new_interior))
            totals.append(total)
        return totals

    def iter_total_cum_of_prefixes(self, summaries: Sequence[CallTreeSummary]) -> Iterator[int]:
        """:meth:`total_cum_of_prefixes`, one total at a time, each worked out only when asked for.

        Zooming stops at the first prefix that reaches its bound, usually a
        short one of a long list. For top extensions of one path (what zooming
        lists at the top, see :func:`_siblings_at_top`) each summary's occurrences
        are added to the outermost ones counted so far; otherwise the totals come
        from :meth:`total_cum_of_prefixes` on the first 2, 4, 8, ... summaries.
        """
        done = 0
        if summaries and _siblings_at_top(summaries):
            for total in self._iter_top_extension_prefixes(summaries):
                yield total
                done += 1
        size = max(2, 2 * done)
        while done < len(summaries):
            totals = self.total_cum_of_prefixes(summaries[:size])
            yield from totals[done:]
            done = len(totals)
            size *= 2

    def _iter_top_extension_prefixes(self, summaries: Sequence[CallTreeSummary]) -> Iterator[int]:
        """The prefix totals of sibling top extensions, one summary at a time, for as long as that stays cheap.

        As in :meth:`_top_extension_prefixes`, a prefix's total adds up the cums
        of its outermost occurrences. Those are kept in preorder (starts, subtree
        ends, cums): an occurrence inside one of them adds nothing, ever (the
        set only grows); one outside adds its cum and replaces those inside its
        subtree. Under recursion, as for a popular function, few occurrences are
        outermost and most are answered by one bisection. When many are
        (occurrences far apart), inserting into the lists gets dear: then this
        stops, and :meth:`iter_total_cum_of_prefixes` goes on in batches.
        """
        cum, above, end = self._cum, self._above, self._end
        starts: list[NodeId] = []
        ends: list[NodeId] = []
        values: list[int] = []
        total = 0
        for s in summaries:
            finals = s.finals
            own = map(
                sub,
                map(add, map(cum.__getitem__, finals), map(above.__getitem__, finals)),
                map(above.__getitem__, s.roots),
            )
            for g, v in zip(finals, own, strict=True):
                j = bisect_right(starts, g)
                if j and ends[j - 1] > g:
                    continue  # inside an occurrence counted already
                g_end = end[g]
                k = bisect_left(starts, g_end, j)
                if k > j:  # outermost occurrences inside g's subtree: g's cum holds theirs now
                    total -= sum(values[j:k])
                    del starts[j:k], ends[j:k], values[j:k]
                if len(starts) >= _MAX_OUTERMOST:
                    return  # before this summary's total: the batches take over from it
                starts.insert(j, g)
                ends.insert(j, g_end)
                values.insert(j, v)
                total += v
            yield total

    def _top_extension_prefixes(self, summaries: Sequence[CallTreeSummary]) -> list[int]:
        """The totals of every prefix of top extensions ``[m] + path`` of one path (see :func:`_siblings_at_top`).

        What zooming asks for, so it gets a shortcut. The occurrences of the
        extensions are distinct occurrences of ``path``, which repeats no name:
        they share no node, and an occurrence below another's final node lies
        wholly in that subtree (the caller ``m`` is on no other occurrence's
        chain except as that final node itself, when ``m`` is the path's last
        name). So a prefix's total adds up, over the occurrences below no final
        node of the prefix, the occurrence's cum on its own: its final node's
        cum plus its chain's cost. An occurrence of summary i counts from prefix
        i until a final node above it joins, at the least index of those above
        it; one sweep in preorder with a stack of the final nodes that count
        finds that index, as in :meth:`_nested_prefixes`.
        """
        never = len(summaries)
        cum, above, end = self._cum, self._above, self._end
        nodes: list[NodeId] = []
        index: list[int] = []
        value: list[int] = []
        for i, s in enumerate(summaries):
            finals = s.finals
            nodes += finals
            index += repeat(i, len(finals))
            # The occurrence's cum: its final node's, plus the chain from its root down to the final node's parent.
            value += map(
                sub,
                map(add, map(cum.__getitem__, finals), map(above.__getitem__, finals)),
                map(above.__getitem__, s.roots),
            )
        delta = [0] * (never + 1)
        order = sorted(range(len(nodes)), key=nodes.__getitem__)
        nodes = list(map(nodes.__getitem__, order))
        if not self._nested(nodes):
            # No occurrence below another: each summary adds its occurrences' cums.
            for i, v in zip(index, value, strict=True):
                delta[i] += v
            return list(accumulate(delta[:never]))
        stack_ends: list[NodeId] = []  # subtree ends of the final nodes that count and hold the current one
        stack_index: list[int] = []  # and their summaries' indexes, decreasing
        for g, i, v, g_end in zip(
            nodes,
            map(index.__getitem__, order),
            map(value.__getitem__, order),
            map(end.__getitem__, nodes),
            strict=True,
        ):
            while stack_ends and stack_ends[-1] <= g:
                stack_ends.pop()
                stack_index.pop()
            if stack_index:
                held_from = stack_index[-1]
                if i >= held_from:
                    continue  # counted from `held_from` on, as part of that final node's subtree
                delta[held_from] -= v
            delta[i] += v
            stack_ends.append(g_end)
            stack_index.append(i)
        return list(accumulate(delta[:never]))

    def _nested_prefixes(self, summaries: Sequence[CallTreeSummary], interiors: list[set[NodeId]]) -> list[int]:
        """The totals of every prefix of ``summaries`` when final nodes nest.

        Prefixes only grow, so a node, once counted, stays counted: node x
        counts from the first index t(x) at which it is along a summary or below
        one's final node, and the totals are the running sums of ``delta``,
        where ``delta[t(x)]`` adds up the cost of the nodes first counted there.
        Index ``never`` = ``len(summaries)`` stands for "never".

        Subtrees are not listed. A final node g first final at index i is
        *effective* when no final node above it is final at an index <= i: its
        subtree starts to count at i, except for the subtrees of effective
        final nodes below it, which start earlier and are taken out. One sweep
        over the final nodes in preorder, with a stack of the effective ones
        holding the current node, adds cum[g] at i and takes it away from the
        index of the effective node above (which counted g's subtree until now).
        Then an interior node x counts from the first index it is along, if
        that is earlier than the index of the nearest effective final node
        holding it: its cost moves to the earlier index.
        """
        never = len(summaries)
        end, cum, cost = self._end, self._cum, self._cost
        # Node -> the first index it is final at (interior at): updating from the
        # last summary to the first leaves each node its earliest index.
        first_final: dict[NodeId, int] = {}
        first_interior: dict[NodeId, int] = {}
        for i in range(never - 1, -1, -1):
            first_final.update(zip(summaries[i].finals, repeat(i)))
            first_interior.update(zip(interiors[i], repeat(i)))
        delta = [0] * (never + 1)
        # The effective final nodes in preorder: node, subtree end, index, and the
        # position (in these lists) of the nearest effective one above it (-1: none).
        eff_nodes: list[NodeId] = []
        eff_ends: list[NodeId] = []
        eff_index: list[int] = []
        eff_up: list[int] = []
        stack: list[int] = []  # positions of the effective final nodes holding the current one
        nodes = sorted(first_final)
        for g, i, g_end in zip(nodes, map(first_final.__getitem__, nodes), map(end.__getitem__, nodes), strict=True):
            while stack and eff_ends[stack[-1]] <= g:
                stack.pop()
            if stack:
                up = stack[-1]
                above = eff_index[up]
                if i >= above:
                    continue  # already counted, from the index of the final node above
                delta[above] -= cum[g]
            else:
                up = -1
            delta[i] += cum[g]
            stack.append(len(eff_nodes))
            eff_nodes.append(g)
            eff_ends.append(g_end)
            eff_index.append(i)
            eff_up.append(up)
        # Interior nodes: the last effective final node at or before x in preorder
        # holds x, or one above it does (or none: x is counted from its own index only).
        for x, a in first_interior.items():
            j = bisect_right(eff_nodes, x) - 1
            while j >= 0 and eff_ends[j] <= x:
                j = eff_up[j]
            held = eff_index[j] if j >= 0 else never
            if a < held:
                c = cost[x]
                delta[a] += c
                delta[held] -= c
        return list(accumulate(delta[:never]))

    def _nested(self, finals: Sequence[NodeId]) -> bool:
        """Whether some node of ``finals`` (sorted) lies below another one.

        In preorder, if any node is inside another's subtree then some node is
        inside its predecessor's subtree, so neighbours are enough to check.
        """
        return any(map(lt, islice(finals, 1, None), map(self._end.__getitem__, finals)))

    def _interior(self, summary: CallTreeSummary) -> set[NodeId]:
        """The nodes of the summary's occurrences other than their final nodes.

        (The paper's interior(s) also leaves out nodes that are final in another
        occurrence; callers that need that subtract the finals.)
        """
        if len(summary.path) == 1:
            return set()
        parent = self._parent
        if len(summary.path) == 2:
            return set(summary.roots)
        nodes: set[NodeId] = set()
        for f, r in zip(summary.finals, summary.roots, strict=True):
            n = parent[f]
            nodes.add(n)
            while n != r:
                n = parent[n]
                nodes.add(n)
        return nodes

    def _along(self, summaries: list[CallTreeSummary]) -> set[NodeId]:
        """along(S): every node of every occurrence."""
        nodes: set[NodeId] = set()
        for s in summaries:
            nodes.update(s.finals)
            nodes |= self._interior(s)
        return nodes


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
