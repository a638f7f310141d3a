"""Find bottlenecks automatically: hypotheses tested against a threshold, refined down the call graph.

    dyper diagnose SOURCE [--threshold 5%] [--json] [--window S] [--monitor ENDPOINT]

In the line of Paradyn's Performance Consultant: CPU-bound, blocking the
event loop, blocked on I/O, waiting on synchronisation and GC-bound are each
tested on the whole program (as a share of the busy samples: every thread's
samples, less those that wait by design: asleep in sleep(), an event loop idle
in its selector, a thread joining others); a hypothesis that reaches the
threshold is refined from the entry points down the call graph while a callee
still reaches it. Bottom-up, each hot function is refined up its callers to
what a person would change: the caller that holds most of it, or the routine
many callers share, found once with its callers listed (BOTTLENECKS' path
summaries). The answer is a ranked list of bottlenecks, each place once, each
with one sentence of evidence, and the search history: which hypotheses were
tested where, passed, failed or covered by a bottleneck ranked before.

A SOURCE is a saved dyper profile (.json), a collapsed-stack file (its counts
do not tell running from waiting: only where the samples are is tested), or
(a number that is not a file) the id of a process a standing monitor knows.
I/O is told from synchronisation by the call on the blocked line, read from
the source files when they are at hand, else by the frames' names.

--json prints {"bottlenecks": [{"path", "hypothesis", "share_pct", "kind",
"evidence", "callers": [{"name", "share_pct"}], "tree_path"}], "history":
[{"step", "hypothesis", "path", "share_pct", "verdict", "parent", "note"}],
"threshold_pct", "total_samples", "shares_pct", "notes"}; paths are frames,
outermost first; tree_path is the heaviest path from a root of the call tree
to the bottleneck.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import linecache
import os
import time
from collections import defaultdict
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from dyper.monitor.client import MonitorClient, MonitorRefused, MonitorUnreachable
from dyper.monitor.commands import CliError, add_metric_arguments, add_monitor_argument, window_arg
from dyper.monitor.commands.bottlenecks import read_source
from dyper.monitor.consolidate import parse_threshold
from dyper.monitor.search.diagnose import DESCRIPTIONS, Diagnosis, diagnose, diagnose_tree
from dyper.monitor.search.repl import short_name
from dyper.monitor.windows import WindowSpec

NAME = "diagnose"

#: Failed callees shown under each step in the terminal; --json has them all.
SHOWN_FAILED = 3


def _threshold_arg(text: str) -> float:
    try:
        return parse_threshold(text) / 100.0
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", help="a profile file (.json, collapsed) or a PID")
    parser.add_argument(
        "--threshold",
        type=_threshold_arg,
        default=0.05,
        help="share of the busy samples that makes a bottleneck, e.g. 5%% (default 5%%, the paper's)",
    )
    parser.add_argument("--json", action="store_true", help="print the bottlenecks and the search history as JSON")
    add_metric_arguments(parser, metric=False)
    parser.add_argument(
        "--window",
        type=window_arg,
        help="with a PID: the last N seconds (e.g. 90, 15m), or START:END, any slice its monitor kept "
        "(see dyper export -h)",
    )
    parser.add_argument(
        "--detail-wait",
        type=float,
        default=6.0,
        metavar="S",
        help="with a PID: how long to wait for cpu detailing's call counts of CPU-bound bottlenecks (0: do not ask)",
    )
    add_monitor_argument(parser, ", for PIDs")


def _detail_cpu_bottlenecks(result: Diagnosis, pid: int, monitor: str, wait_s: float) -> None:
    """Ask the scheduler for cpu detailing where the search found CPU-bound code, and add the call rates.

    Detailing is asked for only when a CPU-bound bottleneck was found: counting
    calls is how a hot function is told from one that is merely slow per call.
    """
    wanted = [b for b in result.bottlenecks if b.hypothesis == "cpu" and b.path]
    if not wanted or wait_s <= 0:
        return
    try:
        with MonitorClient(monitor) as client:
            asked = client.call("detail", pid=pid, proflet="cpu").get("asked", 0)
            if not asked:
                result.notes.append("cpu detailing is not available in this process (3.11 without yappi asked for?)")
                return
            deadline = time.monotonic() + wait_s
            rates: dict[str, float] = {}
            while time.monotonic() < deadline and len(rates) < len(wanted):
                time.sleep(0.5)
                rows = client.call("top", pid=pid).get("functions", [])
                for b in wanted:
                    leaf = b.path[-1]
                    for row in rows:
                        if "calls_per_s" in row and leaf.startswith(f"{row['name']} (") and row["file"] in leaf:
                            rates[leaf] = float(row["calls_per_s"])
    except (MonitorUnreachable, MonitorRefused) as exc:
        result.notes.append(f"no detailing: {exc}")
        return
    for i, b in enumerate(result.bottlenecks):
        rate = rates.get(b.path[-1]) if b in wanted else None
        if rate is not None:
            result.bottlenecks[i] = dataclasses.replace(
                b, evidence=f"{b.evidence}; {rate:,.0f} calls/s counted by cpu detailing"
            )
    result.notes.append(
        f"asked the scheduler for cpu detailing of {len(wanted)} CPU-bound bottleneck(s); "
        f"call rates arrived for {len(rates)}"
    )


def _proflet_sections(pid: int, monitor: str, window: WindowSpec | None) -> dict[str, Any]:
    """The proflets' sections of a live process over the window (what a saved profile carries), or {}.

    The diagnosis reads the tasks proflet's loop blocks and the memory
    proflet's GC pauses from them; the monitor's report has them.
    """
    call: dict[str, Any] = {"pid": pid}
    if window is not None:
        call["window"] = window.to_json()
    try:
        with MonitorClient(monitor, timeout=30.0) as client:
            report = client.call("report", **call)
    except (MonitorUnreachable, MonitorRefused):
        return {}
    if not isinstance(report, dict):
        return {}
    return {k: report.get(v) or {} for k, v in (("status", "status"), ("results", "proflets"), ("off", "off"))}


def _source_line(file: str, line: int) -> str:
    return linecache.getline(file, line)


def run(args: argparse.Namespace) -> int:
    if args.window and os.path.exists(args.source):
        raise CliError("--window applies to a PID source")
    source = read_source(args.source, monitor=args.monitor, window=args.window)
    if source.kind == "pid" and source.profile is not None and not source.profile.proflets:
        source.profile.proflets = _proflet_sections(int(args.source), args.monitor, args.window)
    if source.profile is not None:
        result = diagnose(source.profile, args.threshold, line_text=_source_line, charge_libraries=args.libraries)
    else:
        assert source.collapsed is not None
        result = diagnose_tree(source.collapsed, args.threshold)
    if source.kind == "pid":
        _detail_cpu_bottlenecks(result, int(args.source), args.monitor, args.detail_wait)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        Console().print(render(result, source.label))
    return 0


def _path(path: list[str] | tuple[str, ...]) -> str:
    return " > ".join(short_name(p) for p in path) if path else "whole program"


def render(result: Diagnosis, label: str) -> RenderableType:
    data = result.to_json()
    head = Text.from_markup(
        f"[bold]dyper diagnose[/]: {label}, {data['total_samples']:,} busy samples, "
        f"threshold [bold]{data['threshold_pct']:g}%[/]"
    )
    parts: list[RenderableType] = [head]
    if data["bottlenecks"]:
        table = Table(title="bottlenecks, ranked", box=box.SIMPLE_HEAD, show_edge=False, header_style="bold")
        for col in ("#", "share", "hypothesis", "kind", "path (outermost first)", "evidence"):
            table.add_column(col, justify="right" if col in ("#", "share") else "left", overflow="fold")
        for i, b in enumerate(data["bottlenecks"], 1):
            table.add_row(
                str(i),
                f"{b['share_pct']:.1f}%",
                DESCRIPTIONS.get(b["hypothesis"], b["hypothesis"]),
                b["kind"],
                Text(_path(b["path"]), style="bold" if i == 1 else ""),
                Text(b["evidence"], style="dim"),
            )
        parts.append(table)
    else:
        parts.append(Text("no bottleneck reaches the threshold", style="bold green"))
    parts.append(_history_tree(data["history"]))
    parts.extend(Text(f"note: {n}", style="dim") for n in data["notes"])
    return Group(*parts)


_VERDICT_STYLE = {
    "passed": "bold red",
    "failed": "green",
    "untestable": "yellow",
    "ignored": "dim",
    "covered": "dim",
}


def _history_tree(history: list[dict[str, Any]]) -> Tree:
    """The search history as the Performance Consultant draws it: hypotheses, then foci refining them."""
    root = Tree(Text("search history", style="bold"))
    children: dict[int | None, list[dict[str, Any]]] = defaultdict(list)
    for step in history:
        children[step["parent"]].append(step)

    def label(step: dict[str, Any]) -> Text:
        share = "" if step["share_pct"] is None else f" {step['share_pct']:.1f}%"
        text = Text(f"[{step['step']}] ")
        name = DESCRIPTIONS.get(step["hypothesis"], step["hypothesis"])
        text.append(name if not step["path"] else _path(step["path"][-1:]), style="bold" if not step["path"] else "")
        text.append(share)
        text.append(f" {step['verdict']}", style=_VERDICT_STYLE.get(step["verdict"], ""))
        if step["note"]:
            text.append(f"  {step['note']}", style="dim")
        return text

    def add(node: Tree, parent: int | None) -> None:
        steps = children.get(parent, [])
        failed = [s for s in steps if s["verdict"] == "failed" and s["parent"] is not None]
        shown_failed = {s["step"] for s in failed[:SHOWN_FAILED]}
        for s in steps:
            if s["verdict"] == "failed" and s["parent"] is not None and s["step"] not in shown_failed:
                continue
            add(node.add(label(s)), s["step"])
        if len(failed) > SHOWN_FAILED:
            node.add(Text(f"... {len(failed) - SHOWN_FAILED} more below the threshold", style="dim"))

    add(root, None)
    return root
