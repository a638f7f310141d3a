"""Every proflet's results for a process: lights, findings and tables.

    dyper report SOURCE [--proflet NAME] [--json] [--last N] [--monitor ENDPOINT]

SOURCE is a saved dyper profile (.json, as `dyper run -o prof.json` writes
it), or the PID of a process a standing monitor knows. Human tables by
default; --json prints the machine-readable report (keys in docs/report.md,
"dyper report"). --proflet shows one proflet only. --last N: with a PID,
the last N seconds only (e.g. 30, 5m).
"""

from __future__ import annotations

import argparse
import colorsys
import json
import os
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from dyper.monitor.commands import CliError, add_monitor_argument, duration_arg, standing_monitor
from dyper.proflets.display import clock_text as clock_text  # also the triggers command's
from dyper.proflets.display import num, pct

NAME = "report"

QUERY_TIMEOUT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", help="a saved dyper profile (.json) or a PID")
    parser.add_argument("--proflet", metavar="NAME", help="only this proflet (cpu, threads, timing, ...)")
    parser.add_argument("--json", action="store_true", help="the machine-readable report")
    parser.add_argument("--last", type=duration_arg, metavar="N", help="with a PID: the last N seconds only")
    parser.add_argument("--limit", type=int, default=20, help="rows per table (default 20)")
    parser.add_argument(
        "--tag", metavar="NAME", help="only the samples taken inside functions tagged NAME (agent.tag): cpu tables"
    )
    add_monitor_argument(parser, ", for PIDs")


def load_report(args: argparse.Namespace) -> dict[str, Any]:
    from dyper.monitor.model.profile import Profile
    from dyper.monitor.report import report_of

    source = args.source
    saved = os.path.exists(source)
    if saved and args.last is not None:
        raise CliError("a saved profile has no time line: --last needs a PID", code=2)
    if not saved and not (source.isdigit() and int(source) > 0):
        raise CliError(f"{source}: no such file, and not a PID", code=2)
    try:
        if args.tag is None:
            # From a live process the monitor's analyzers answer (the report op); from a file, what it carries.
            return report_of(Profile.load(source)) if saved else dict(_ask_monitor(args, "report"))
        # The samples inside one tag: the cpu tables over them (the other proflets do not split by tag).
        profile = Profile.load(source) if saved else Profile.from_json(_ask_monitor(args, "profile"), f"pid {source}")
        return report_of(profile.with_tag(args.tag))
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _ask_monitor(args: argparse.Namespace, op: str) -> Any:
    """``op`` (report or profile) of the process ``args.source`` from the standing monitor, over ``--last``."""
    from dyper.monitor.client import MonitorRefused, MonitorUnreachable

    call: dict[str, object] = {"pid": int(args.source)}
    if args.last is not None:
        call["window_s"] = args.last
    try:
        with standing_monitor(args.monitor, timeout_s=QUERY_TIMEOUT_S) as client:
            return client.call(op, **call)
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


#: Marks the human report lists (the newest); --json gives all the profile carries.
MARKS_LISTED = 10


def render(report: dict[str, Any], console: Console, limit: int = 20) -> None:
    p = report["process"]
    console.print(
        f"[bold]pid {p.get('pid')}[/] {' '.join(p.get('argv') or [])[:100]}  "
        f"python {p.get('python')}  {num(p.get('duration_s'), '{:.1f}')} s  {num(p.get('samples'))} samples  "
        f"overhead {pct(p.get('overhead'))}% of budget {pct(p.get('budget'))}%"
        + (
            f" ({pct(p['allowed'])}% allowed over the run: boosts and trigger events raised it)"
            if isinstance(p.get("allowed"), int | float) and p["allowed"] > 1.02 * float(p.get("budget") or 0)
            else ""
        )
        + ("  [yellow]paused[/]" if p.get("paused") else "")
    )
    sampler = p.get("sampler") or {}
    console.print(
        f"[dim]stacks sampled by the {sampler.get('name', 'unknown')} sampler"
        + (f" ({sampler['why']})" if sampler.get("why") else "")
        + "[/]"
    )
    if p.get("tag") is not None:
        console.print(f"only the samples inside tag [bold]{p['tag']}[/] ({num(p.get('tag_samples'))} samples)")
    if p.get("reset_t") is not None:
        console.print(f"[dim]statistics since the reset at {clock_text(p['reset_t'])}[/]")
    marks = p.get("marks") or []
    if marks:
        shown = marks[-MARKS_LISTED:]
        more = f" (the last {len(shown)} of {len(marks)})" if len(marks) > len(shown) else ""
        console.print(f"marks{more}: " + ", ".join(f"{clock_text(m['t'])} {m['name']}" for m in shown))
    events = p.get("triggers") or []
    for e in events[-MARKS_LISTED:]:
        console.print(
            f"[magenta]trigger {e['id']}[/] {clock_text(e['t'])} {e['name']}: {e['why']}  "
            f"[dim](dyper bottlenecks {p.get('pid')} --trigger {e['id']})[/]"
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
        console.print(f"[dim]{name}: {why}[/]")
    sections = report["proflets"]
    for name in _in_order(sections):
        show = terminal_renderer(name)
        if show is not None:
            try:
                show(console, sections[name], limit)
                continue
            except Exception as exc:  # a plug-in's renderer must not cost the rest of the report
                console.print(f"[dim]{name}: its renderer failed ({type(exc).__name__}: {exc}); shown as it is[/]")
        generic(console, name, sections[name], limit)


def _in_order(sections: dict[str, Any]) -> list[str]:
    """The built-ins in their registry's order, then the rest as the report has them."""
    from dyper import proflets

    return [n for n in proflets.BUILTINS if n in sections] + [n for n in sections if n not in proflets.BUILTINS]


def terminal_renderer(name: str) -> Callable[[Console, Any, int], None] | None:
    """The ``terminal`` of proflet ``name``'s render module, or None: not installed here, or it has none."""
    from dyper import proflets

    try:
        module = proflets.load(name, None, "render")
    except Exception:  # not installed where the report is read (a saved profile), or broken: the generic one shows it
        return None
    show = getattr(module, "terminal", None)
    return show if callable(show) else None


def generic(console: Console, name: str, section: Any, limit: int) -> None:
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
