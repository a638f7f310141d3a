"""Speed of the bottleneck-search profile interface on a million-node call tree.

Builds a synthetic call tree (deterministic seed) as collapsed text, times
loading it, then times every navigation operation of the profile interface and
the overlap computations on a set of probe summaries, and prints a table. The
target (SPEC section 9): search operations on a million-node tree under 100 ms.

The tree: a random tree whose nodes pick a function name from a vocabulary
with Zipf-like popularity, so a few functions occur at tens of thousands of
places (the expensive case for a summary: the most popular one is at 10% of
all nodes, nested under itself many times over) and recursion is common.
Parents are picked mostly among recently created nodes, which gives deep call
chains like a real service's (mean depth about 45), and sometimes anywhere,
which gives fan-out. The text is sorted, as dyper's collapsed export writes it.

The probes are the functions of popularity rank 1, 10, 100 and 1000, each also
extended at the top and at the bottom by its costliest extension, and a path of
length 4. For each operation the table shows the median over the probes, the
maximum and which probe it was, and the maximum in CPU time (on a shared
machine the wall time includes waiting for a core). Zooming is a composite:
every extension, its cum, and the overlap of every prefix of them, repeated at
each level it zooms through. Comparative operations run on the tree against a
copy of itself with other costs (same shape, costs drawn with another seed).

    python bench/search.py [--nodes 1000000] [--seed 1] [--repeat 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dyper.monitor.search import (
    CallTreeProfile,
    ComparativeProfile,
    ComparativeSummary,
    HighBase,
    HighBaseSpread,
    HighCum,
    ProfileInterface,
    cum_overlap,
    zoom,
)

S = TypeVar("S")

TARGET_MS = 100.0


def make_tree(nodes: int, functions: int, seed: int) -> tuple[list[int], list[int]]:
    """Parent and function index of each node (node 0 is the root, parents come first)."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) for rank in range(functions)]
    cumulative = []
    acc = 0.0
    for w in weights:
        acc += w
        cumulative.append(acc)
    parent = [-1]
    name = [0]
    taken: set[tuple[int, int]] = set()
    while len(parent) < nodes:
        n = len(parent)
        # Mostly a recent node (deep chains), sometimes any node (fan-out).
        p = rng.randrange(max(0, n - 8), n) if rng.random() < 0.75 else rng.randrange(n)
        f = rng.choices(range(functions), cum_weights=cumulative)[0]
        if (p, f) in taken:
            continue  # siblings have distinct names, as in a call tree
        taken.add((p, f))
        parent.append(p)
        name.append(f)
    return parent, name


def collapsed_text(parent: list[int], name: list[int], seed: int) -> str:
    """Folded stacks, one line per node with a cost (every leaf has one), sorted as dyper's export writes them."""
    rng = random.Random(seed)
    n = len(parent)
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[parent[i]].append(i)
    labels = [f"mod{f % 97}.func{f}" for f in range(max(name) + 1)]
    lines: list[str] = []
    path: list[str] = []
    stack: list[tuple[int, int]] = [(0, 0)]  # (node, depth)
    while stack:
        node, depth = stack.pop()
        del path[depth:]
        path.append(labels[name[node]])
        leaf = not children[node]
        cost = rng.randint(1, 100) if leaf else (rng.randint(1, 20) if rng.random() < 0.4 else 0)
        if cost:
            lines.append(f"{';'.join(path)} {cost}\n")
        stack.extend((c, depth + 1) for c in reversed(children[node]))
    lines.sort()
    return "".join(lines)


def timed(fn: Callable[[], object], repeat: int, reset: Callable[[], None] | None = None) -> tuple[float, float]:
    """Median wall time and median CPU time of ``fn``, in milliseconds.

    Both, because on a shared machine the wall time includes waiting for a core
    and the CPU time does not. ``reset`` (the profile's ``clear_caches``) runs
    before each call, untimed, so that every call is a cold one: a cache would
    otherwise answer all repeats but the first.
    """
    walls, cpus = [], []
    for _ in range(repeat):
        if reset is not None:
            reset()
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append((time.process_time() - cpu) * 1000)
        walls.append((time.perf_counter() - wall) * 1000)
    return statistics.median(walls), statistics.median(cpus)


def probes(profile: ProfileInterface[S], ranked_paths: list[tuple[str, ...]]) -> list[S]:
    """The probe summaries: each path, and its costliest top and bottom extension, and a 4-long path."""
    picked: list[S] = []
    for path in ranked_paths:
        s = profile.summary(path)
        if s is None:
            continue
        picked.append(s)
        for extend in (profile.top_extension_summaries, profile.bottom_extension_summaries):
            extensions = extend(s)
            if extensions:
                picked.append(max(extensions, key=profile.cum_of))
    longest = picked[0]
    for _ in range(3):
        extensions = profile.bottom_extension_summaries(longest)
        if not extensions:
            break
        longest = max(extensions, key=profile.cum_of)
    picked.append(longest)
    return picked


def navigation_ops(profile: ProfileInterface[S]) -> dict[str, Callable[[S], object]]:
    def extend_top(s: S) -> object:
        names = profile.top_extensions(s)
        return profile.extend_top(s, names[0]) if names else None

    def extend_bottom(s: S) -> object:
        names = profile.bottom_extensions(s)
        return profile.extend_bottom(s, names[0]) if names else None

    return {
        "summary(path)": lambda s: profile.summary(profile.path_of(s)),
        "top_extensions": profile.top_extensions,
        "bottom_extensions": profile.bottom_extensions,
        "extend_top (+ top_extensions)": extend_top,
        "extend_bottom (+ bottom_extensions)": extend_bottom,
        "top_extension_summaries": profile.top_extension_summaries,
        "bottom_extension_summaries": profile.bottom_extension_summaries,
        "trim_top": profile.trim_top,
        "trim_bottom": profile.trim_bottom,
        "base_of": profile.base_of,
        "cum_of": profile.cum_of,
        "zoom top": lambda s: zoom(profile, s, "top"),
        "zoom bottom": lambda s: zoom(profile, s, "bottom"),
    }


def measure(profile: ProfileInterface[S], picked: list[S], repeat: int, prefix: str) -> list[dict[str, Any]]:
    """Cold timings (caches cleared before each call) of every operation on every probe.

    The "warm" figure of a row is the median over the probes of the same call
    repeated without clearing: what the search tool sees when it asks again
    (a selection's cum after zooming, the labels' total after the last select).
    """
    rows: list[dict[str, Any]] = []
    reset: Callable[[], None] | None = getattr(profile, "clear_caches", None)
    for op, fn in navigation_ops(profile).items():
        per_probe = [timed(functools.partial(fn, s), repeat, reset) for s in picked]
        warm = [timed(functools.partial(fn, s), repeat) for s in picked] if reset is not None else per_probe
        rows.append(_row(prefix + op, per_probe, warm))
    # Overlap: three labelled summaries, as the search tool shows for each selection.
    sets = [picked[i : i + 3] for i in range(0, len(picked) - 2, 3)]
    overlaps: dict[str, Callable[[list[S]], object]] = {
        "total_base_of (3 summaries)": profile.total_base_of,
        "total_cum_of (3 summaries)": profile.total_cum_of,
        "cum_overlap (1 vs 2 labels)": lambda group: cum_overlap(profile, group[0], group[1:]),
    }
    for op, overlap in overlaps.items():
        per_group = [timed(functools.partial(overlap, group), repeat, reset) for group in sets]
        warm = [timed(functools.partial(overlap, group), repeat) for group in sets] if reset is not None else per_group
        rows.append(_row(prefix + op, per_group, warm))
    return rows


def _row(
    op: str, per_probe: list[tuple[float, float]], warm: list[tuple[float, float]] | None = None
) -> dict[str, Any]:
    walls = [wall for wall, _ in per_probe]
    cpus = [cpu for _, cpu in per_probe]
    return {
        "op": op,
        "median_ms": statistics.median(walls),
        "warm_median_ms": statistics.median(wall for wall, _ in (warm or per_probe)),
        "warm_max_ms": max(wall for wall, _ in (warm or per_probe)),
        "max_ms": max(walls),
        "median_cpu_ms": statistics.median(cpus),
        "max_cpu_ms": max(cpus),
        "per_probe_ms": walls,
        "probes": len(per_probe),
        "under_target": max(walls) < TARGET_MS,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--functions", type=int, default=5000, help="size of the function-name vocabulary")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5, help="timings per operation and probe (median taken)")
    parser.add_argument("--load-repeat", type=int, default=3, help="timings of the load (median taken)")
    parser.add_argument("--no-comparative", action="store_true", help="skip the comparative profile")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()

    start = time.perf_counter()
    parent, name = make_tree(args.nodes, args.functions, args.seed)
    text = collapsed_text(parent, name, args.seed)
    generate_s = time.perf_counter() - start
    lines = text.count("\n")
    print(f"synthetic tree: {args.nodes} nodes, {lines} collapsed lines ({len(text) / 1e6:.0f} MB), {generate_s:.0f} s")

    load_times: list[tuple[float, float]] = []
    profile: CallTreeProfile | None = None
    for _ in range(args.load_repeat):
        profile = None
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        profile = CallTreeProfile.from_collapsed(text)
        load_times.append((time.perf_counter() - wall, time.process_time() - cpu))
    assert profile is not None
    load_s = statistics.median(wall for wall, _ in load_times)
    load_cpu_s = statistics.median(cpu for _, cpu in load_times)
    depths = _depths(parent)
    print(
        f"loaded: {profile.node_count} nodes, {len(profile.names)} functions, "
        f"mean depth {statistics.fmean(depths):.1f}, max depth {max(depths)}"
    )

    by_count = sorted(profile.initial_summaries(), key=lambda s: -len(s))
    ranked_paths = [by_count[r].path for r in (0, 9, 99, 999) if r < len(by_count)]
    picked = probes(profile, ranked_paths)
    print("probes (the functions of popularity rank 1, 10, 100, 1000, their costliest extensions, a 4-long path):")
    for i, s in enumerate(picked):
        print(f"  #{i:<3} {len(s):>7} occurrences  {' ; '.join(s.path)}")

    rows = measure(profile, picked, args.repeat, "")
    rows.append(_row("initial_summaries", [timed(profile.initial_summaries, args.repeat)]))
    bulk = [
        _row("suggest HighCum (all functions)", [timed(lambda: HighCum().suggest(profile), 1, profile.clear_caches)]),
        _row("suggest HighBase (all functions)", [timed(lambda: HighBase().suggest(profile), 1, profile.clear_caches)]),
        _row("suggest HighBaseSpread", [timed(lambda: HighBaseSpread().suggest(profile), 1, profile.clear_caches)]),
    ]

    comparative_rows: list[dict[str, Any]] = []
    if not args.no_comparative:
        other = CallTreeProfile.from_collapsed(collapsed_text(parent, name, args.seed + 1))
        both = ComparativeProfile(profile, other)
        both_picked: list[ComparativeSummary] = probes(both, ranked_paths)
        comparative_rows = measure(both, both_picked, args.repeat, "comparative ")

    print()
    print("cold: caches cleared before each call; warm: the same call again, caches kept")
    print(f"{'operation':<46} {'median ms':>10} {'max ms':>9} {'(probe)':>8} {'max cpu ms':>11} {'warm max':>9}")
    for row in [*rows, *comparative_rows]:
        worst = max(range(row["probes"]), key=row["per_probe_ms"].__getitem__)
        flag = "" if row["under_target"] else f"  over {TARGET_MS:.0f} ms"
        print(
            f"{row['op']:<46} {row['median_ms']:>10.2f} {row['max_ms']:>9.1f} {'#' + str(worst):>8}"
            f" {row['max_cpu_ms']:>11.1f} {row['warm_max_ms']:>9.1f}{flag}"
        )
    print()
    for row in bulk:
        print(f"{row['op']:<46} {row['median_ms']:>10.0f} ms  (once, over every function)")
    print(f"{'load (from_collapsed)':<46} {load_s:>10.1f} s   (median of {args.load_repeat}; cpu {load_cpu_s:.1f} s)")
    load_after = os.getloadavg()
    print(f"load average of the machine: {load_before[0]:.2f} before, {load_after[0]:.2f} after")

    if args.json:
        result = {
            "bench": "search",
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load_average": [load_before[0], load_after[0]],
            "nodes": profile.node_count,
            "functions": len(profile.names),
            "collapsed_lines": lines,
            "collapsed_bytes": len(text),
            "mean_depth": statistics.fmean(depths),
            "max_depth": max(depths),
            "seed": args.seed,
            "load_s": load_s,
            "load_cpu_s": load_cpu_s,
            "load_runs_s": [wall for wall, _ in load_times],
            "probes": [{"path": list(s.path), "occurrences": len(s)} for s in picked],
            "target_ms": TARGET_MS,
            "operations": rows + comparative_rows,
            "bulk": bulk,
            "all_under_target": all(r["under_target"] for r in rows + comparative_rows),
        }
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _depths(parent: list[int]) -> list[int]:
    depth = [0] * len(parent)
    for i in range(1, len(parent)):
        depth[i] = depth[parent[i]] + 1
    return depth


if __name__ == "__main__":
    sys.exit(main())
