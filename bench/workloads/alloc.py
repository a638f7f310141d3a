"""alloc: allocation-heavy pure-Python work with frequent garbage collection.

Each unit builds a small tree of objects with back-references to their parent
(so every tree is cyclic garbage once dropped and only the cycle collector can
free it), with a dict, a list and a few tuples and strings per node, then walks
it and drops it. With the default gc thresholds the young generation is
collected every few hundred allocations and the older ones regularly, so the
gc's own work is a large part of the time.

Prints the seconds the work took (perf_counter around the work only), then the
number of collections per generation during it.

    python bench/workloads/alloc.py [units]
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any


class Node:
    def __init__(self, value: int, parent: Node | None) -> None:
        self.value = value
        self.parent = parent  # a cycle: parent -> children -> child -> parent
        self.children: list[Node] = []
        self.meta: dict[str, Any] = {"v": value, "tag": f"n{value}", "pair": (value, value + 1)}


def build(depth: int, fanout: int, parent: Node | None = None, start: int = 0) -> Node:
    node = Node(start, parent)
    if depth > 0:
        for i in range(fanout):
            node.children.append(build(depth - 1, fanout, node, start * fanout + i + 1))
    return node


def walk(node: Node) -> int:
    total = node.value + len(node.meta["tag"])
    for child in node.children:
        total += walk(child)
    return total


def records(n: int) -> list[tuple[int, str, list[int], dict[str, int]]]:
    return [(i, str(i), [i, i + 1], {"i": i}) for i in range(n)]


def unit() -> int:
    tree = build(depth=4, fanout=4)  # 341 nodes, each with a dict, a list, a tuple, strings
    total = walk(tree)
    rows = records(200)
    index = {r[1]: r for r in rows}
    total += len(index) + sum(r[2][1] for r in rows)
    return total


def main(units: int) -> None:
    before = [s["collections"] for s in gc.get_stats()]
    t0 = time.perf_counter()
    acc = 0
    for _ in range(units):
        acc += unit()
    dt = time.perf_counter() - t0
    after = [s["collections"] for s in gc.get_stats()]
    collections = " ".join(f"gen{g}={a - b}" for g, (a, b) in enumerate(zip(after, before, strict=True)))
    print(f"{dt:.6f}")
    print(f"collections {collections} checksum {acc}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2500)
