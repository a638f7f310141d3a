"""What the dashboard shows, as plain data: pure functions of sessions and profiles.

The web server (:mod:`monitor.web.server`) only moves these dicts to the
page; everything a test might want to check without a browser is here.

The proflets' lights, tables and findings are not made here: the summary
carries the report :func:`dyper.monitor.report.report_of` makes of the
window's profile (built with the proflets' sections), the same report
``dyper report --json`` prints. The page renders every list of dicts under
``proflets`` as a sortable table, so a new proflet shows up without a
dashboard change: with the columns, headings and formats its render module
describes (``TABLES``, :mod:`dyper.proflets.display`; the summary carries
them, :func:`table_descriptions`), or one column per key without one.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dyper.agent.budget import slowdown
from dyper.monitor.flame import flame_tree
from dyper.monitor.model.profile import Metric, Profile
from dyper.monitor.search.repl import short_name
from dyper.monitor.session import same_process
from dyper.proflets.display import TableSpec

# --- the proflets' tables ------------------------------------------------------------------


def table_descriptions(names: Iterable[str]) -> dict[str, dict[str, TableSpec]]:
    """Proflet name -> its tables' descriptions (its render module's ``TABLES``), for those that give any."""
    out: dict[str, dict[str, TableSpec]] = {}
    for name in names:
        tables = _tables_of(name)
        if tables:
            out[name] = tables
    return out


@functools.cache
def _tables_of(name: str) -> dict[str, TableSpec]:
    from dyper import proflets

    try:
        tables = getattr(proflets.load(name, None, "render"), "TABLES", None)
    except Exception:  # not installed here, or broken: the page shows its results generically
        return {}
    return dict(tables) if isinstance(tables, Mapping) else {}


# --- overhead over time --------------------------------------------------------------------


def overhead_points(timeline: dict[str, Any]) -> list[dict[str, float]]:
    """The ``timeline`` op's buckets as points: time, budget, and the overhead spent (see agent.budget.slowdown)."""
    points = []
    for start, passes, reports, spent_s, covered_s, budget in timeline.get("buckets", []):
        if covered_s <= 0:
            continue
        points.append(
            {
                "t": float(start),
                "spent": slowdown(float(spent_s), float(covered_s)),
                "budget": float(budget),
                "samples": int(passes),
                "reports": int(reports),
            }
        )
    return points


# --- findings in plain words ----------------------------------------------------------------

_KIND_WORDS = {
    "self": "in its own code",
    "diffuse": "spread over what it calls",
    "spread": "called from many places, none of which stands out",
}
_HYPOTHESIS_WORDS = {
    "cpu": "keeps the CPU busy",
    "io": "waits on I/O",
    "sync": "waits on a lock or another thread",
    "wait": "waits in a call that could not be named",
    "gc": "spends time in garbage collection",
    "samples": "holds the samples",
}


def _frame_file(frame_name: str) -> str:
    """The file of ``qualname (file)`` or ``qualname (file:line)``."""
    if frame_name.endswith(")") and " (" in frame_name:
        where = frame_name[:-1].rpartition(" (")[2]
        head, sep, tail = where.rpartition(":")
        return head if sep and tail.isdigit() else where
    return ""


def findings(
    diagnosis: dict[str, Any] | None,
    session_view: dict[str, Any],
    is_library: Callable[[str], bool] | None = None,
    limit: int = 5,
) -> list[dict[str, Any]]:
    """Noteworthy things about a process, each ``{"level": "bad"|"warn"|"info", "text": ...}``.

    The top bottlenecks of the automated diagnosis first, named by the
    innermost application function on their path (where a fix would go),
    then the overhead spent against the budget.
    """
    out: list[dict[str, Any]] = []
    if diagnosis is not None:
        # Bottlenecks that read the same in words (one function waiting in the same
        # call along two paths) are one finding, their shares added.
        merged: dict[str, dict[str, Any]] = {}
        for b in diagnosis.get("bottlenecks", []):
            path = list(b.get("path") or [])
            hypothesis = str(b.get("hypothesis", ""))
            what = _HYPOTHESIS_WORDS.get(hypothesis, hypothesis)
            if not path:
                head, tail = f"The whole program {what}", ""
            else:
                app = [f for f in path if is_library is None or not is_library(_frame_file(f))]
                who = app[-1] if app else path[-1]
                head = f"{short_name(who)} {what}"
                if who != path[-1]:
                    head += f" in {short_name(path[-1])}"
                kind = str(b.get("kind", ""))
                tail = f", {_KIND_WORDS.get(kind, kind)}" if kind != "self" or hypothesis == "cpu" else ""
            item = merged.setdefault(head + tail, {"head": head, "tail": tail, "share": 0.0, "path": path})
            item["share"] += float(b.get("share_pct") or 0.0)
        for item in sorted(merged.values(), key=lambda i: -i["share"])[:limit]:
            share = item["share"]
            text = f"{item['head']}: {share:.0f}% of the busy time{item['tail']}."
            out.append({"level": "bad" if share >= 20 else "warn", "text": text, "path": item["path"]})
        if not diagnosis.get("bottlenecks") and diagnosis.get("total_samples"):
            out.append(
                {
                    "level": "info",
                    "text": f"Nothing reaches the {diagnosis.get('threshold_pct', 5):g}% threshold: "
                    "no single bottleneck stands out.",
                }
            )
    spending = session_view.get("spending") or {}
    budget = float(session_view.get("budget") or 0.0)
    now = sum((spending.get("now") or {}).values())
    if budget > 0 and now > budget * 1.05:
        out.append({"level": "warn", "text": f"Overhead now is {100 * now:.2f}%, above the {100 * budget:g}% budget."})
    return out


# --- processes --------------------------------------------------------------------------------


def process_rows(host_rows: list[dict[str, Any]], sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """The processes view: every Python process on the host, and sessions the monitor keeps of ended ones."""
    by_pid: dict[int, dict[str, Any]] = {}
    for s in sessions:
        # the newest session of a pid (connected first) describes the running process
        prev = by_pid.get(s["pid"])
        if prev is None or (s["connected"], s["start_time"]) > (prev["connected"], prev["start_time"]):
            by_pid[s["pid"]] = s
    running = []
    live_pids = set()
    for r in sorted(host_rows, key=lambda r: r["pid"]):
        live_pids.add(r["pid"])
        known = by_pid.get(r["pid"])
        row = {
            "pid": r["pid"],
            "command": " ".join(r["argv"]),
            "attached": bool(r["attached"]),
            "monitored": bool(r["monitored"]),
            "known": known is not None,
        }
        if known is not None:
            row.update(
                budget=known["budget"], overhead=known["overhead"], samples=known["samples"], python=known["python"]
            )
        running.append(row)
    ended = [
        {
            "pid": s["pid"],
            "command": " ".join(s["argv"]),
            "start_time": s["start_time"],
            "samples": s["samples"],
            "last_report": s["last_report"],
            "python": s["python"],
        }
        for s in sorted(sessions, key=lambda s: -(s["last_report"] or 0.0))
        if s["pid"] not in live_pids or same_process(s["pid"], float(s["start_time"])) is not True
    ]
    return {"processes": running, "ended": ended, "host": os.uname().nodename}


# --- flame graph ------------------------------------------------------------------------------

#: Nodes sent to the page at most; smaller frames go first.
MAX_FLAME_NODES = 20_000


def flame_data(
    profile: Profile,
    metric: Metric = "cpu",
    base: Profile | None = None,
    *,
    charge_libraries: bool = False,
) -> dict[str, Any]:
    """A flame graph of ``profile`` (threads first under the root, by name), and, with ``base``, the difference.

    The tree is :func:`monitor.flame.flame_tree`'s, as the exported HTML flame
    graph's. With ``base`` the boxes keep ``profile``'s widths and carry the
    base window's total of the same call path, so the page colours each by
    how its share changed. Threads are keyed by name, so a differential view
    lines up the same thread across windows.
    """
    flame = flame_tree(profile, metric, base=base, charge_libraries=charge_libraries, max_nodes=MAX_FLAME_NODES)
    window = (profile.process.get("window") or {}).get("description") or "whole run"
    out: dict[str, Any] = {
        "unit": f"{metric} samples",
        "window": window,
        "frames": flame.frames,
        "tree": flame.tree,
        "floor": flame.floor,
    }
    if base is not None:
        out["base_window"] = (base.process.get("window") or {}).get("description") or "whole run"
        out["base_total"] = flame.base_total
    return out
