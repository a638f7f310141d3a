"""The call tree a flame graph draws: one builder for the exported HTML file and the dashboard.

Both draw it with ``monitor/web/static/flame.js``. The shape: ``frames``
``[name, file, line, kind]`` (kind 0 application, 1 library, 2 thread, 3
root; frame 0 is the root) and ``tree`` ``[frame, self, total, [children,
largest first]]``, with a fifth item, the base window's total of the same
call path, when the tree is built against a base profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dyper.monitor.model.profile import Metric, Profile

#: How a thread is named in the tree, from its id and name; threads with the same label are one node.
ThreadLabel = Callable[[int, str], str]

ROOT, THREAD = 3, 2


def by_name(tid: int, name: str) -> str:
    """Threads by name, so a differential view lines up the same thread across windows (and processes)."""
    return name


@dataclass(frozen=True)
class FlameTree:
    frames: list[list[Any]]
    tree: list[Any]
    #: the smallest total kept (0: nothing left out)
    floor: int
    #: the base profile's samples (None without a base)
    base_total: int | None


def flame_tree(
    profile: Profile,
    metric: Metric = "cpu",
    *,
    base: Profile | None = None,
    charge_libraries: bool = False,
    max_nodes: int = 20_000,
    thread_label: ThreadLabel = by_name,
) -> FlameTree:
    """The call tree of ``profile`` with threads first under the root, pruned to ``max_nodes``.

    With ``base`` every node also carries the base window's total of the same
    call path (paths only in the base have no width, so they are left out).
    Trees above ``max_nodes`` nodes lose their smallest frames, which leaves
    gaps of the size they had.
    """
    frames: list[list[Any]] = [["all", "", 0, ROOT]]
    frame_ids: dict[tuple[Any, ...], int] = {}
    # node: [frame, self, total, children by frame id, base total]
    root: list[Any] = [0, 0, 0, {}, 0]

    def fid(key: tuple[Any, ...], row: list[Any]) -> int:
        i = frame_ids.get(key)
        if i is None:
            i = frame_ids[key] = len(frames)
            frames.append(row)
        return i

    def add(p: Profile, slot: int) -> None:
        is_library = p.library_predicate()
        for st, stack in p.charged_stacks(charge_libraries):
            n = st.cpu if metric == "cpu" else st.wall
            if n == 0:
                continue
            thread = thread_label(st.thread, p.threads.get(st.thread, "thread"))
            keys = [fid(("t", thread), [thread, "", 0, THREAD])]
            for i in stack:
                f = p.frames[i]
                keys.append(fid((f.name, f.file, f.line), [f.name, f.file, f.line, int(is_library(f.file))]))
            node = root
            node[slot] += n
            for key in keys:
                child = node[3].get(key)
                if child is None:
                    child = node[3][key] = [key, 0, 0, {}, 0]
                child[slot] += n
                node = child
            if slot == 2:
                node[1] += n

    add(profile, 2)
    if base is not None:
        add(base, 4)
    floor = prune_floor(root, max_nodes)
    return FlameTree(frames, _nested(root, floor, base is not None), floor, root[4] if base is not None else None)


def prune_floor(root: list[Any], max_nodes: int) -> int:
    """The smallest total a node needs to be kept so that at most ``max_nodes`` are (0: keep all)."""
    totals: list[int] = []
    stack = [root]
    while stack:
        node = stack.pop()
        totals.append(node[2])
        stack.extend(node[3].values())
    if len(totals) <= max_nodes:
        return 0
    totals.sort(reverse=True)
    return int(totals[max_nodes - 1]) + 1


def _nested(root: list[Any], floor: int, with_base: bool) -> list[Any]:
    """``[frame, self, total, [children, largest first](, base total)]``, dropping children under ``floor``."""

    def copy(node: list[Any]) -> list[Any]:
        return [node[0], node[1], node[2], [], node[4]] if with_base else [node[0], node[1], node[2], []]

    out = copy(root)
    stack = [(root, out)]
    while stack:
        src, dst = stack.pop()
        for child in sorted(src[3].values(), key=lambda c: -c[2]):
            # Paths only in the base window have no width in this one: nothing to draw.
            if child[2] < max(floor, 1):
                continue
            c = copy(child)
            dst[3].append(c)
            stack.append((child, c))
    return out
