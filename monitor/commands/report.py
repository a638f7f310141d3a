"""Every proflet's results for a process: lights, findings and tables.

    dyper report SOURCE [--proflet NAME] [--json] [--last N] [--monitor ENDPOINT]

SOURCE is a saved dyper profile (.json, as `dyper run -o prof.json` writes
it), or the PID of a process a standing monitor knows. Human tables by
default; --json prints the machine-readable report (keys in the README,
"dyper report"). --proflet shows one proflet only. --last N: with a PID,
the last N seconds only (e.g. 30, 5m).
"""

from __future__ import annotations

import argparse
import colorsys
import json
import os
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from monitor.commands import CliError, add_monitor_argument, duration_arg

NAME = "report"

PING_TIMEOUT_S = 3.0
QUERY_TIMEOUT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", help="a saved dyper profile (.json) or a PID")
    parser.add_argument("--proflet", metavar="NAME", help="only this proflet (cpu, threads, timing, ...)")
    parser.add_argument("--json", action="store_true", help="the machine-readable report")
    parser.add_argument("--last", type=duration_arg, metavar="N", help="with a PID: the last N seconds only")
    parser.add_argument("--limit", type=int, default=20, help="rows per table (default 20)")
    add_monitor_argument(parser, ", for PIDs")


def load_report(args: argparse.Namespace) -> dict[str, Any]:
    source = args.source
    if os.path.exists(source):
        if args.last is not None:
            raise CliError("a saved profile has no time line: --last needs a PID", code=2)
        from monitor.profile import Profile
        from monitor.report import report_of

        try:
            return report_of(Profile.load(source))
        except ValueError as exc:
            raise CliError(str(exc)) from None
    if not (source.isdigit() and int(source) > 0):
        raise CliError(f"{source}: no such file, and not a PID", code=2)
    from monitor.client import MonitorClient, MonitorRefused, MonitorUnreachable

    call: dict[str, object] = {"pid": int(source)}
    if args.last is not None:
        call["window_s"] = args.last
    try:
        with MonitorClient(args.monitor, timeout=PING_TIMEOUT_S) as client:
            client.call("ping")
            client.timeout = QUERY_TIMEOUT_S
            report: dict[str, Any] = client.call("report", **call)
            return report
    except (MonitorUnreachable, MonitorRefused) as exc:
        raise CliError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    report = load_report(args)
    if args.proflet is not None:
        if args.proflet not in report["proflets"]:
            known = ", ".join(sorted(report["proflets"])) or "none"
            why = report.get("off", {}).get(args.proflet)
            raise CliError(
                f"no results of proflet {args.proflet!r}" + (f" ({why})" if why else "") + f"; there are: {known}"
            )
        report = dict(
            report,
            proflets={args.proflet: report["proflets"][args.proflet]},
            status={k: v for k, v in report["status"].items() if k == args.proflet},
        )
    if args.json:
        print(json.dumps(report))
        return 0
    render(report, Console(), args.limit)
    return 0


def light(problem: float, confidence: float) -> Text:
    """DYPER's light: hue from green (no problem) to red (a problem), brightness from how sure."""
    hue = (1.0 - max(0.0, min(1.0, problem))) / 3.0  # 1/3 is green, 0 is red
    r, g, b = colorsys.hsv_to_rgb(hue, 0.9, 0.25 + 0.75 * max(0.0, min(1.0, confidence)))
    return Text("●", style=f"rgb({int(r * 255)},{int(g * 255)},{int(b * 255)})")


def _pct(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, int | float) else "-"


def _num(v: Any, fmt: str = "{:,.0f}") -> str:
    return fmt.format(v) if isinstance(v, int | float) else "-"


def render(report: dict[str, Any], console: Console, limit: int = 20) -> None:
    p = report["process"]
    console.print(
        f"[bold]pid {p.get('pid')}[/] {' '.join(p.get('argv') or [])[:100]}  "
        f"python {p.get('python')}  {_num(p.get('duration_s'), '{:.1f}')} s  {_num(p.get('samples'))} samples  "
        f"overhead {_pct(p.get('overhead'))}% of budget {_pct(p.get('budget'))}%"
    )
    if report["status"]:
        line = Text()
        for name, st in sorted(report["status"].items()):
            line.append_text(light(st["problem"], st["confidence"]))
            line.append(f" {name} (problem {st['problem']:.2f}, sure {st['confidence']:.2f})   ")
        console.print(line)
    for text in report.get("findings") or ():
        console.print(f"[yellow]finding:[/] {text}")
    for name, why in sorted((report.get("off") or {}).items()):
        console.print(f"[dim]{name}: off ({why})[/]")
    sections = report["proflets"]
    if "cpu" in sections:
        _cpu(console, sections["cpu"], limit)
    if "threads" in sections:
        _threads(console, sections["threads"], limit)
    if "timing" in sections:
        _timing(console, sections["timing"], limit)
    for name, section in sections.items():
        if name not in ("cpu", "threads", "timing"):
            _generic(console, name, section, limit)


def _cpu(console: Console, section: dict[str, Any], limit: int) -> None:
    table = Table(title="cpu: functions (self and total share of CPU samples)", header_style="bold")
    for col in ("self %", "total %", "calls", "calls/s", "function", "where"):
        table.add_column(col, justify="right" if col[0] in "stc" and col != "function" else "left")
    for r in section.get("functions", [])[:limit]:
        table.add_row(
            _pct(r.get("self_pct")),
            _pct(r.get("total_pct")),
            _num(r.get("calls")),
            _num(r.get("calls_per_s"), "{:,.1f}"),
            str(r.get("name")),
            f"{os.path.basename(str(r.get('file')))}:{r.get('line')}",
        )
    console.print(table)
    native = section.get("native") or []
    if native:
        table = Table(title="cpu: C calls inside the hottest functions (native time, measured)", header_style="bold")
        for col in ("% of function", "seconds", "calls", "C call", "inside"):
            table.add_column(col, justify="right" if col[0] in "%sc" and col != "C call" else "left")
        for r in native[:limit]:
            table.add_row(
                _pct(r.get("pct_of_function")),
                _num(r.get("seconds"), "{:.3f}"),
                _num(r.get("calls")),
                str(r.get("callee")),
                f"{r.get('function')} ({os.path.basename(str(r.get('file')))}:{r.get('line')})",
            )
        console.print(table)


def _threads(console: Console, section: dict[str, Any], limit: int) -> None:
    table = Table(title="threads: where each thread's time goes (% of its time)", header_style="bold")
    cols = ("thread", "run", "gil", "block", "wait", "io", "sleep", "blocked by", "run s", "waits")
    for col in cols:
        table.add_column(col, justify="left" if col in ("thread", "blocked by") else "right")
    for r in section.get("threads", [])[:limit]:
        table.add_row(
            str(r["name"]),
            _pct(r["run_pct"]),
            _pct(r["gil_pct"]),
            _pct(r["block_pct"]),
            _pct(r["wait_pct"]),
            _pct(r["io_pct"]),
            _pct(r["sleep_pct"]),
            str(r.get("blocked_by") or ""),
            _num(r.get("run_s"), "{:.2f}"),
            _num(r.get("waits")),
        )
    console.print(table)


def _timing(console: Console, section: dict[str, Any], limit: int) -> None:
    console.print(
        f"[bold]timing:[/] active threads {section['active_threads_mean']:.2f} ± {section['active_threads_std']:.2f}"
        f" on {section['cpus']} processors; cores used {section['cores_used']:.2f}"
    )
    if section.get("finding"):
        console.print(f"  {section['finding']}")
    table = Table(header_style="bold")
    table.add_column("thread")
    table.add_column("CPU s", justify="right")
    for r in section.get("threads", [])[:limit]:
        table.add_row(str(r["name"]), f"{r['cpu_s']:.2f}")
    console.print(table)


def _generic(console: Console, name: str, section: Any, limit: int) -> None:
    """A plug-in proflet's results: its lists of rows as tables, the rest as values."""
    if not isinstance(section, dict):
        console.print(f"[bold]{name}:[/] {section}")
        return
    scalars = {k: v for k, v in section.items() if not isinstance(v, list | dict)}
    if scalars:
        console.print(f"[bold]{name}:[/] " + ", ".join(f"{k} {v}" for k, v in scalars.items()))
    for key, rows in section.items():
        if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
            table = Table(title=f"{name}: {key}", header_style="bold")
            cols = list(rows[0])
            for c in cols:
                table.add_column(str(c))
            for r in rows[:limit]:
                table.add_row(*(str(r.get(c, "")) for c in cols))
            console.print(table)
