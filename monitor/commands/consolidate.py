"""Consolidate many profiles: what is hot in some runs, windows or processes, not just on average.

    dyper consolidate SOURCE SOURCE... [--threshold 5%] [--total] [--lines] [--json]
    dyper consolidate PID --windows 6x10s [--monitor ENDPOINT]
    dyper consolidate PID PID... [--window S] [--monitor ENDPOINT]

A SOURCE is a saved dyper profile (.json), a collapsed-stack file (dyper's,
py-spy's or Austin's `a;b;c 42` lines, root first), or (a number that is not
a file) the id of a process a standing monitor knows: its whole run (or the last --window seconds), or,
with --windows COUNTxSECONDS, that many consecutive windows of it, each the
difference of two whole-run profiles taken SECONDS apart. The agent reports
every 1-30 s depending on its budget, so make windows several times longer.

Per function (and per line with --lines), over the sources, as in
multi-execution bottleneck detection: min, max and avg share of each
source's samples (avg over the sources where it appears), frequency (the
share of sources where it appears), significance = frequency x avg, range =
max - min, and occurrence (the share of sources where it reaches the
threshold). Shares are self % (the leaf), or inclusive % with --total.
Flagged rows (reaching the threshold in at least one source; with --rule
paper, significance and range both reaching it) come first, then by
significance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from dyper.monitor.commands import CliError, add_metric_arguments, add_monitor_argument, duration_arg
from dyper.monitor.consolidate import (
    DEFAULT_THRESHOLD_PCT,
    SourceShares,
    collect_windows,
    from_profile,
    load_source,
    parse_threshold,
    parse_windows,
    report,
)
from dyper.monitor.model.profile import Profile

NAME = "consolidate"

#: The per-source column is shown for up to this many sources, in terminals at least 110 wide.
MAX_SOURCE_COLUMN = 10


def _threshold_arg(text: str) -> float:
    try:
        return parse_threshold(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _windows_arg(text: str) -> tuple[int, float]:
    try:
        return parse_windows(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", nargs="+", metavar="SOURCE", help="profile files (.json, collapsed) or PIDs")
    parser.add_argument(
        "--threshold",
        type=_threshold_arg,
        default=DEFAULT_THRESHOLD_PCT,
        help="share of a source's samples that counts as a bottleneck, e.g. 5%% (default 5%%)",
    )
    parser.add_argument("--total", action="store_true", help="use inclusive (total) shares instead of self shares")
    parser.add_argument("--lines", action="store_true", help="also consolidate per line")
    parser.add_argument(
        "--rule",
        choices=("occurrence", "paper"),
        default="occurrence",
        help="flag what reaches the threshold in any source (default), or, as the paper does, "
        "what has significance and range both at or above it",
    )
    add_metric_arguments(parser, note="; collapsed files carry one count")
    parser.add_argument(
        "--windows",
        type=_windows_arg,
        metavar="COUNTxSECONDS",
        help="with one PID: that many consecutive windows of the live process, e.g. 6x10s",
    )
    parser.add_argument("--window", type=duration_arg, help="with PIDs: the last N seconds of each (default whole run)")
    add_monitor_argument(parser)
    parser.add_argument("--limit", type=int, default=30, help="rows per table in the terminal (default 30, 0: all)")
    parser.add_argument("--json", action="store_true", help="print the whole consolidation as JSON")


def _split_sources(args: list[str]) -> tuple[list[str], list[int]]:
    files: list[str] = []
    pids: list[int] = []
    for a in args:
        if os.path.exists(a):
            files.append(a)
        elif a.isdigit() and int(a) > 0:
            pids.append(int(a))
        else:
            raise CliError(f"no such file: {a}")
    return files, pids


def _note(message: str) -> None:
    print(f"dyper consolidate: {message}", file=sys.stderr, flush=True)


def _from_monitor(args: argparse.Namespace, pids: list[int]) -> list[SourceShares]:
    from dyper.monitor.client import MonitorClient, MonitorRefused, MonitorUnreachable

    def shares(profile: Profile, label: str, kind: str) -> SourceShares:
        return from_profile(profile, label, kind, metric=args.metric, charge_libraries=args.libraries)

    try:
        with MonitorClient(args.monitor, timeout=10.0) as client:
            if not args.windows:
                out = []
                for pid in pids:
                    call_args: dict[str, Any] = {"pid": pid}
                    if args.window:
                        call_args["window_s"] = args.window
                    profile = Profile.from_json(client.call("profile", **call_args), f"pid {pid}")
                    out.append(shares(profile, f"pid {pid}", "process"))
                return out
            pid = pids[0]
            count, seconds = args.windows
            _note(
                f"taking {count} windows of {seconds:g}s of pid {pid} (each the difference of two whole-run "
                f"profiles {seconds:g}s apart), about {count * seconds:g}s; Ctrl-C to stop early"
            )
            got: list[Profile] = []

            def progress(i: int, window: Profile) -> None:
                got.append(window)
                _note(f"window {i}/{count}: {window.total(args.metric):,} {args.metric} samples")

            def fetch() -> Profile:
                return Profile.from_json(client.call("profile", pid=pid), f"pid {pid}")

            try:
                collect_windows(fetch, count, seconds, clock=time.monotonic, sleep=time.sleep, progress=progress)
            except KeyboardInterrupt:
                if len(got) < 2:
                    raise
                _note(f"stopped: consolidating the {len(got)} windows taken")
            return [shares(w, f"pid {pid} window {i}", "window") for i, w in enumerate(got, 1)]
    except (MonitorUnreachable, MonitorRefused) as exc:
        raise CliError(str(exc)) from None
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _table(rows: list[dict[str, Any]], data: dict[str, Any], title: str, limit: int, width: int) -> Table:
    from dyper.monitor.views import _short

    per_source = len(data["sources"]) <= MAX_SOURCE_COLUMN and width >= 110
    basis = "self" if data["basis"] == "self_pct" else "total"
    table = Table(
        title=f"{title}: % of each source's {basis} samples",
        box=box.SIMPLE_HEAD,
        expand=False,
        show_edge=False,
        pad_edge=False,
        header_style="bold",
    )
    table.add_column("", width=1)
    for col in ("occur", "signif", "avg", "min", "max", "range"):
        table.add_column(col, justify="right")
    if per_source:
        table.add_column("per source", style="dim")
    table.add_column("function", overflow="fold")
    table.add_column("where", style="dim", overflow="fold")
    # Rows that never cost anything on this basis (callers, under self %) are left to --json.
    rows = [r for r in rows if r["max_pct"] > 0]
    shown = rows if limit <= 0 else rows[:limit]
    for r in shown:
        where = _short(r["file"]) + (f":{r['line']}" if r["line"] is not None else "")
        table.add_row(
            Text("!", style="bold red") if r["flagged"] else "",
            f"{r['occurrence']:.2f}",
            f"{r['significance']:.1f}",
            f"{r['avg_pct']:.1f}",
            f"{r['min_pct']:.1f}",
            f"{r['max_pct']:.1f}",
            f"{r['range_pct']:.1f}",
            *([" ".join(f"{v:.0f}" for v in r["values_pct"])] if per_source else []),
            Text(r["name"], style="bold" if r["flagged"] else ""),
            where,
        )
    if len(shown) < len(rows):
        table.caption = f"{len(rows) - len(shown)} more rows: --limit 0 or --json for all"
    return table


def render(data: dict[str, Any], limit: int = 30, width: int = 120) -> Group:
    basis = "self" if data["basis"] == "self_pct" else "total"
    lines = [
        f"[bold]dyper consolidate[/]: {len(data['sources'])} sources, threshold "
        f"[bold]{data['threshold_pct']:g}%[/] of each source's {data['metric']} samples ({basis} shares), "
        f"rule {data['rule']}"
    ]
    for i, s in enumerate(data["sources"], 1):
        lines.append(f"  [dim]{i:>2}[/] {s['label']}  [dim]({s['kind']}, {s['samples']:,} samples)[/]")
    flagged = sum(1 for r in data["functions"] if r["flagged"])
    lines.append(f"[bold]{flagged}[/] function(s) flagged")
    parts: list[Any] = [Text.from_markup("\n".join(lines))]
    parts.append(_table(data["functions"], data, "functions", limit, width))
    if data["lines"]:
        parts.append(_table(data["lines"], data, "lines", limit, width))
    return Group(*parts)


def run(args: argparse.Namespace) -> int:
    files, pids = _split_sources(args.sources)
    if args.windows and (files or len(pids) != 1):
        raise CliError("--windows takes exactly one PID and no files")
    sources: list[SourceShares] = []
    for f in files:
        try:
            sources.append(load_source(f, metric=args.metric, charge_libraries=args.libraries))
        except ValueError as exc:
            raise CliError(str(exc)) from None
    if pids:
        sources.extend(_from_monitor(args, pids))
    kept = []
    for s in sources:
        if s.samples > 0:
            kept.append(s)
        else:
            why = " (no agent report arrived in it: use windows longer than the report interval)"
            _note(f"leaving out {s.label}: no {args.metric} samples" + (why if s.kind == "window" else ""))
    if len(kept) < 2:
        raise CliError(f"consolidation needs at least 2 sources with samples, got {len(kept)}")
    data = report(
        kept,
        args.threshold,
        lines=args.lines,
        basis="total" if args.total else "self",
        rule=args.rule,
        metric=args.metric,
    )
    if args.json:
        print(json.dumps(data))
    else:
        console = Console()
        console.print(render(data, args.limit, console.width))
    return 0
