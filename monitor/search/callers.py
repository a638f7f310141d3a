"""Refining a hot function by its callers: what a person would change (seed 000's path summaries, bottom-up).

A leaf helper called from everywhere (a checksum, a string routine) is the
hottest function of many profiles, and naming it alone says little: the fix is
often in the one caller that calls it most, or in the routine above it that a
dozen handlers share. :func:`refine` starts from such a function and extends
its call sequence at the top (the paper's ``extend_top``: one caller more)
while one caller holds most of its cost, and stops where the callers split:

- of several callers, one that holds at least :data:`DOMINANT` of the
  sequence's cost is added, as long as the sequence stays what the caller is
  mostly about (its cost is at least :data:`SPECIFIC` of the caller's own
  cum: adding ``main`` above everything names nothing); a function with one
  caller only is where it stops (there is no caller to choose);
- library code (the standard library, site-packages) is never where the
  refinement stops when an application caller holds most of it: a hot
  ``Condition.wait`` is refined to the application function that waits;
- where no caller dominates, the sequence is the bottleneck, *spread* over
  its callers, which are listed with their parts.

The measures are those of the paper over the sampled stacks: a refinement
covers the samples of the function's own code under the call sequence (the
samples whose stack ends in it), a caller's cost is the samples whose stack
contains it (each counted once, however often it occurs in one: cum with
overlap counted once), and the overlap of two bottlenecks is the samples they
share. :func:`merge` makes one place of refinements that stop at the same
function, and a spread routine takes in the hot code below it: the fix of a
hot leaf that only the routine calls is in the routine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

#: A caller is followed when it holds at least this share of the sequence's cost.
DOMINANT = 0.5
#: ... and the sequence is at least this share of the caller's own cost.
SPECIFIC = 0.8
#: Longest sequence a refinement builds.
MAX_LENGTH = 12

Stack = tuple[str, ...]


def _occurs(stack: Stack, path: Stack) -> bool:
    n = len(path)
    if n == 1:
        return path[0] in stack
    first = path[0]
    return any(stack[i] == first and stack[i : i + n] == path for i in range(len(stack) - n + 1))


def _callers_in(stack: Stack, path: Stack) -> set[str | None]:
    """The names just before each occurrence of ``path`` in ``stack`` (``None``: an occurrence at the root)."""
    n = len(path)
    out: set[str | None] = set()
    for i in range(len(stack) - n + 1):
        if stack[i : i + n] == path:
            out.add(stack[i - 1] if i > 0 else None)
    return out


class StackSet:
    """The sampled stacks of one hypothesis (names root first, with counts), and path summaries over them."""

    def __init__(self, stacks: Sequence[tuple[Sequence[str], int]]) -> None:
        self.stacks: list[Stack] = [tuple(s) for s, _ in stacks]
        self.counts: list[int] = [c for _, c in stacks]
        self.total = sum(self.counts)
        self._by_name: dict[str, list[int]] = {}
        for i, stack in enumerate(self.stacks):
            for name in set(stack):
                self._by_name.setdefault(name, []).append(i)

    def cost(self, indices: Iterable[int]) -> int:
        return sum(self.counts[i] for i in indices)

    def containing(self, path: Stack, among: Iterable[int] | None = None) -> frozenset[int]:
        """The stacks in which ``path`` occurs (each once)."""
        candidates = self._by_name.get(path[0], []) if among is None else among
        return frozenset(i for i in candidates if _occurs(self.stacks[i], path))

    def ending_with(self, path: Stack) -> frozenset[int]:
        """The stacks whose innermost frames are ``path``: where its last function runs its own code."""
        n = len(path)
        return frozenset(i for i in self._by_name.get(path[-1], []) if self.stacks[i][-n:] == path)

    def self_cost(self, name: str) -> int:
        return self.cost(self.ending_with((name,)))

    def functions(self) -> list[str]:
        return sorted(self._by_name)

    def callers(self, path: Stack, among: frozenset[int]) -> list[tuple[str | None, frozenset[int]]]:
        """Who calls ``path``'s first function, with the stacks under each, by descending cost.

        A stack where the sequence occurs under two callers (recursion) is in
        both parts; ``None`` stands for the occurrences at a root.
        """
        parts: dict[str | None, set[int]] = {}
        for i in among:
            for caller in _callers_in(self.stacks[i], path):
                parts.setdefault(caller, set()).add(i)
        ranked = [(c, frozenset(s)) for c, s in parts.items()]
        ranked.sort(key=lambda item: (-self.cost(item[1]), item[0] is None, item[0] or ""))
        return ranked


@dataclass(frozen=True)
class Refined:
    """A call sequence where the refinement stopped, the stacks it covers and how its callers split them."""

    path: Stack
    stacks: frozenset[int]
    cost: int
    #: (caller, cost under it), largest first; ``None``: occurrences at a root
    callers: tuple[tuple[str | None, int], ...]
    #: the function the refinement started from
    seed: str

    @property
    def spread(self) -> bool:
        """No caller holds most of it: the cost is spread over two callers or more."""
        named = [c for c, _ in self.callers if c is not None]
        return len(named) >= 2 and self.callers[0][1] < DOMINANT * self.cost


def refine(stacks: StackSet, seed: str, is_library: Callable[[str], bool]) -> Refined:
    """Extend ``[seed]`` at the top while one caller holds most of it (see the module docstring)."""
    path: Stack = (seed,)
    covered = stacks.ending_with(path)
    cost = stacks.cost(covered)
    while True:
        parts = stacks.callers(path, covered)
        if len(path) >= MAX_LENGTH or not parts or cost <= 0:
            break
        caller, under = parts[0]
        part = stacks.cost(under)
        if caller is None or caller in path or part < DOMINANT * cost:
            break
        # Library code is refined to whoever calls it; application code only to the one caller of
        # several that holds most of it, when this sequence is most of what that caller does (adding
        # the only caller there is, or ``main`` above everything, would name nothing more).
        if not is_library(path[0]) and (
            len(parts) == 1 or is_library(caller) or part < SPECIFIC * stacks.cost(stacks.containing((caller,)))
        ):
            break
        path, covered, cost = (caller, *path), under, part
    parts = stacks.callers(path, covered)
    return Refined(path, covered, cost, tuple((c, stacks.cost(s)) for c, s in parts), seed)


def merge(stacks: StackSet, found: Sequence[Refined]) -> list[Refined]:
    """Refinements that stopped at the same function become one: the routine, with everything below it.

    ``normalize > fold`` (from the hot leaf ``fold``) and ``normalize`` (from
    normalize's own code) are one place to change. The merged path is the
    longest sequence the paths start with, its stacks the union.
    """
    groups: dict[str, list[Refined]] = {}
    for r in found:
        groups.setdefault(r.path[0], []).append(r)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        path = group[0].path
        for r in group[1:]:
            k = 0
            while k < min(len(path), len(r.path)) and path[k] == r.path[k]:
                k += 1
            path = path[:k]
        covered = frozenset().union(*(r.stacks for r in group))
        parts = stacks.callers(path, covered)
        seed = max(group, key=lambda r: r.cost).seed
        out.append(Refined(path, covered, stacks.cost(covered), tuple((c, stacks.cost(s)) for c, s in parts), seed))
    return _absorbed(stacks, out)


def _absorbed(stacks: StackSet, found: list[Refined]) -> list[Refined]:
    """A spread routine takes in the refinements below it: those whose samples mostly lie under it."""
    spread = sorted((r for r in found if r.spread), key=lambda r: -r.cost)
    gone: set[int] = set()
    out = []
    for s in spread:
        under = stacks.containing(s.path)
        covered = s.stacks
        for i, r in enumerate(found):
            if r is s or i in gone or r.spread:
                continue
            mine = r.stacks & under
            if stacks.cost(mine) >= 0.5 * r.cost:
                covered = covered | mine
                gone.add(i)
        if covered is s.stacks:
            out.append(s)
            continue
        parts = stacks.callers(s.path, covered)
        out.append(Refined(s.path, covered, stacks.cost(covered), tuple((c, stacks.cost(x)) for c, x in parts), s.seed))
    out.extend(r for i, r in enumerate(found) if not r.spread and i not in gone)
    return out
