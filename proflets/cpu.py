"""The cpu proflet: where the program executes (DYPER section 5.1).

Basic analysis, from stack samples: the share of samples per function and
per line, self (the leaf) and total (anywhere on the stack, once per stack
however deep the recursion), only above a floor (0.5% by default, as DYPER
does: below that a sampling profile is noise), and optionally with time in
the standard library and installed packages charged to the application line
that called it.

The agent half is the sampler itself (``agent.core``); this module is the
monitor half. Detailing (exact call counts of the candidates) comes with the
proflet framework.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monitor.profile import Metric, Profile
    from monitor.session import Frame

#: Show only what takes at least this share of the samples.
FLOOR_PCT = 0.5

Key = tuple[str, str, int]


def function_table(
    profile: Profile, metric: Metric = "cpu", *, charge_libraries: bool = False, floor_pct: float = 0.0
) -> list[dict[str, Any]]:
    """Per function (file, qualname, first line): self and total, sorted by self."""
    return _table(profile, metric, charge_libraries, floor_pct, lambda f: f.function)


def line_table(
    profile: Profile, metric: Metric = "cpu", *, charge_libraries: bool = False, floor_pct: float = 0.0
) -> list[dict[str, Any]]:
    """Per line (file, qualname, line): self and total, sorted by self."""
    return _table(profile, metric, charge_libraries, floor_pct, lambda f: (f.file, f.name, f.line))


def _table(
    profile: Profile,
    metric: Metric,
    charge_libraries: bool,
    floor_pct: float,
    key_of: Callable[[Frame], Key],
) -> list[dict[str, Any]]:
    keys = [key_of(f) for f in profile.frames]
    self_counts: dict[Key, int] = {}
    total_counts: dict[Key, int] = {}
    grand = 0
    for s, frames in profile.charged_stacks(charge_libraries):
        n = s.cpu if metric == "cpu" else s.wall
        if n == 0 or not frames:
            continue
        grand += n
        leaf = keys[frames[-1]]
        self_counts[leaf] = self_counts.get(leaf, 0) + n
        # A recursive function is counted once per stack, not once per frame.
        for k in {keys[i] for i in frames}:
            total_counts[k] = total_counts.get(k, 0) + n
    rows: list[dict[str, Any]] = []
    for k, total in total_counts.items():
        own = self_counts.get(k, 0)
        total_pct = 100.0 * total / grand if grand else 0.0
        if total_pct < floor_pct:
            continue
        rows.append(
            {
                "name": k[1],
                "file": k[0],
                "line": k[2],
                "self": own,
                "total": total,
                "self_pct": 100.0 * own / grand if grand else 0.0,
                "total_pct": total_pct,
            }
        )
    rows.sort(key=lambda r: (-r["self"], -r["total"], r["name"]))
    return rows
