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
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from dyper.monitor.commands import CliError, add_monitor_argument, duration_arg, standing_monitor

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


def _pct(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, int | float) else "-"


def _num(v: Any, fmt: str = "{:,.0f}") -> str:
    return fmt.format(v) if isinstance(v, int | float) else "-"


#: Marks the human report lists (the newest); --json gives all the profile carries.
MARKS_LISTED = 10


def clock_text(t: Any) -> str:
    """A wall time as the local time of day, to the tenth of a second."""
    import time

    if not isinstance(t, int | float):
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 10) % 10}"


def render(report: dict[str, Any], console: Console, limit: int = 20) -> None:
    p = report["process"]
    console.print(
        f"[bold]pid {p.get('pid')}[/] {' '.join(p.get('argv') or [])[:100]}  "
        f"python {p.get('python')}  {_num(p.get('duration_s'), '{:.1f}')} s  {_num(p.get('samples'))} samples  "
        f"overhead {_pct(p.get('overhead'))}% of budget {_pct(p.get('budget'))}%"
        + (
            f" ({_pct(p['allowed'])}% allowed over the run: boosts and trigger events raised it)"
            if isinstance(p.get("allowed"), int | float) and p["allowed"] > 1.02 * float(p.get("budget") or 0)
            else ""
        )
        + ("  [yellow]paused[/]" if p.get("paused") else "")
    )
    if p.get("tag") is not None:
        console.print(f"only the samples inside tag [bold]{p['tag']}[/] ({_num(p.get('tag_samples'))} samples)")
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
        console.print(f"[dim]{name}: off ({why})[/]")
    sections = report["proflets"]
    if "cpu" in sections:
        _cpu(console, sections["cpu"], limit)
    if "threads" in sections:
        _threads(console, sections["threads"], limit)
    if "timing" in sections:
        _timing(console, sections["timing"], limit)
    if "heap" in sections:
        _heap(console, sections["heap"], limit)
    if "io" in sections:
        _io(console, sections["io"], limit)
    for name in ("memory", "memory_stacks"):
        if name in sections:
            _memory(console, name, sections[name], limit)
    if sections.get("tasks"):
        _tasks(console, sections["tasks"], limit)
    for name, section in sections.items():
        if name not in ("cpu", "threads", "timing", "heap", "io", "memory", "memory_stacks", "tasks"):
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


def _tasks(console: Console, section: dict[str, Any], limit: int) -> None:
    """asyncio: each loop's health, where handlers spend their wall time, the longest blocks with their stacks."""
    from dyper.monitor.views import _short

    console.print(
        f"[bold]tasks (asyncio):[/] {section['passes']:,} passes, one every {section['interval_ms']:.0f} ms "
        f"({section['pass_us']:.0f} us each); blocks are callbacks of {section['block_threshold_ms']:.0f} ms or more"
    )
    loops = Table(header_style="bold", title="event loops")
    for col in ("thread", "tasks", "max", "busy %", "blocks", "blocked s", "lag p50 ms", "lag p99 ms", "lag max ms"):
        loops.add_column(col, justify="left" if col == "thread" else "right")
    for r in section.get("loops", []):
        loops.add_row(
            str(r["thread"]),
            f"{r['tasks_mean']:.0f}",
            str(r["tasks_max"]),
            f"{r['busy_pct']:.0f}",
            str(r["blocks"]),
            f"{r['blocked_s']:.2f}",
            f"{r['lag_ms_p50']:.1f}",
            f"{r['lag_ms_p99']:.1f}",
            f"{r['lag_ms_max']:.1f}",
        )
    console.print(loops)
    handlers = Table(header_style="bold", title="handlers: share of task wall time, and where they wait")
    for col in ("% tasks", "% running", "handler", "task", "awaiting (% of its wall time)"):
        handlers.add_column(col, justify="right" if col.startswith("%") else "left")
    for h in section.get("handlers", [])[:limit]:
        waits = "; ".join(
            f"{w['pct']:.0f}% {w['function']}" + (f" in {w['via']}" if w["via"] and w["via"] != w["function"] else "")
            for w in h["awaiting"][:3]
        )
        handlers.add_row(
            f"{h['share_pct']:.1f}",
            f"{h['running_pct']:.0f}",
            f"{h['handler']} ({_short(h['file'])}:{h['line']})",
            h["task"],
            waits,
        )
    console.print(handlers)
    for b in section.get("blocks", [])[:3]:
        console.print(
            f"  loop blocked {b['duration_ms']:.0f} ms at {clock_text(b['t'])}"
            + (f" in task {b['task']}" if b["task"] else "")
            + ": "
            + " > ".join(f"{w['function']} ({_short(w['file'])}:{w['line']})" for w in b["stack"][-4:])
        )


def _bytes(v: Any) -> str:
    if not isinstance(v, int | float):
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(v) < 1000 or unit == "GB":
            return f"{v:,.0f} {unit}" if unit == "B" else f"{v:,.1f} {unit}"
        v /= 1000.0
    return "-"


def _heap(console: Console, section: dict[str, Any], limit: int) -> None:
    """The last census: objects by type, largest first, suspects marked."""
    if not section.get("censuses"):
        console.print(f"[bold]heap:[/] {section.get('skip_reason') or section.get('note') or 'no census'}")
        return
    console.print(
        f"[bold]heap:[/] {_num(section.get('objects'))} objects, {_bytes(section.get('bytes'))} in "
        f"{_num(section.get('types_seen'))} types at the last of {section['censuses']} censuses "
        f"(census {_num(section.get('scan_ms'), '{:.0f}')} ms, worst {_num(section.get('worst_scan_ms'), '{:.0f}')}"
        f" ms; maximum pause {_num(section.get('max_pause_ms'), '{:.0f}')} ms)"
    )
    if section.get("skip_reason"):
        console.print(f"  {section['skip_reason']}")
    table = Table(title="heap: live objects by type (tracked by the GC)", header_style="bold")
    for col in ("type", "count", "bytes", "growth/min", "leak?"):
        table.add_column(col, justify="left" if col in ("type", "leak?") else "right")
    rows = section.get("types", [])
    shown = rows[:limit] + [r for r in rows[limit:] if r.get("suspect_leak")]
    for r in shown:
        table.add_row(
            str(r["type"]),
            _num(r.get("count")),
            _bytes(r.get("bytes")),
            _num(r.get("growth_per_min"), "{:+,.0f}"),
            f"[red]leak? ({r.get('censuses_growing')} censuses)[/]" if r.get("suspect_leak") else "",
        )
    console.print(table)


def _kb_per_s(v: Any) -> str:
    return _num(v / 1000.0 if isinstance(v, int | float) else None, "{:,.1f}") + " kB/s"


def _io(console: Console, section: dict[str, Any], limit: int) -> None:
    console.print(
        f"[bold]io:[/] {_pct(section.get('io_pct'))}% of the threads' time in I/O; read "
        f"{_kb_per_s(section.get('read_bytes_per_s'))}, written {_kb_per_s(section.get('write_bytes_per_s'))}"
        " (by read/write calls: files, pipes; not a socket's recv/send)"
    )
    if section.get("note"):
        console.print(f"  {section['note']}")
    title = "io: routines (% of all threads' time) and the application routine calling them"
    table = Table(title=title, header_style="bold")
    for col in ("%", "routine", "caller", "where", "threads", "calls/s", "ms/call"):
        table.add_column(col, justify="right" if col in ("%", "calls/s", "ms/call") else "left")
    for r in section.get("routines", [])[:limit]:
        per_call = r.get("s_per_call")
        table.add_row(
            _pct(r.get("pct")),
            str(r.get("routine")),
            str(r.get("caller")),
            f"{os.path.basename(str(r.get('caller_file')))}:{r.get('caller_line')}",
            ", ".join(r.get("threads") or [])[:40],
            _num(r.get("calls_per_s"), "{:,.1f}"),
            _num(per_call * 1000.0 if isinstance(per_call, int | float) else None, "{:,.2f}"),
        )
    console.print(table)
    table = Table(title="io: per thread (% of its time)", header_style="bold")
    for col in ("thread", "io %", "busiest routine", "caller", "read", "written"):
        table.add_column(col, justify="right" if col in ("io %", "read", "written") else "left")
    for r in section.get("threads", [])[:limit]:
        table.add_row(
            str(r.get("name")),
            _pct(r.get("io_pct")),
            str(r.get("routine") or ""),
            str(r.get("caller") or ""),
            _kb_per_s(r.get("read_bytes_per_s")),
            _kb_per_s(r.get("write_bytes_per_s")),
        )
    console.print(table)


def _memory(console: Console, name: str, section: dict[str, Any], limit: int) -> None:
    """GC pauses by the line that triggered them; allocation sites (memory_stacks: with their callers)."""

    def where(r: dict[str, Any]) -> str:
        return f"{os.path.basename(str(r['file']))}:{r['line']}" if r.get("file") else ""

    gc = section.get("gc")
    if gc is not None:
        n = gc.get("collections") or [0, 0, 0]
        console.print(
            f"[bold]memory:[/] RSS {_bytes(section.get('rss_bytes'))}; collections {n[0]:,} / {n[1]:,} / {n[2]:,}"
            f" (generations 0 / 1 / 2); GC paused {_num(gc.get('pause_total_s'), '{:.3f}')} s,"
            f" {_pct(gc.get('pause_pct'))}% of the time"
        )
        watched = gc.get("watched_pct")
        if watched is not None and watched < 99.5:
            console.print(
                f"[dim]the GC callback watched {_pct(watched)}% of the time, to keep within the budget;"
                " pauses and their lines are extrapolated from what it saw (collections are counted exactly)[/]"
            )
        table = Table(title="memory: GC pauses by the line that triggered them", header_style="bold")
        for col in ("pause s", "pause %", "gen 0/1/2", "function", "where"):
            table.add_column(col, justify="left" if col in ("function", "where") else "right")
        for r in (gc.get("pauses_by_site") or [])[:limit]:
            gens = "/".join(_num(x) for x in r.get("generations") or ())
            table.add_row(
                _num(r.get("pause_s"), "{:.3f}"), _pct(r.get("pause_pct")), gens, str(r.get("function")), where(r)
            )
        console.print(table)
    sites = section.get("sites") or []
    if not sites:
        console.print(f"[dim]{name}: no allocation sites yet (no detailing burst)[/]")
        return
    table = Table(
        title=f"{name}: allocation sites (blocks alive at the end of {section.get('bursts')} bursts,"
        f" {_num(section.get('burst_s'), '{:.1f}')} s traced)",
        header_style="bold",
    )
    for col in ("bytes/s", "blocks/s", "bytes %", "function", "where", *(("called from",) if name != "memory" else ())):
        table.add_column(col, justify="left" if col in ("function", "where", "called from") else "right")
    for r in sites[:limit]:
        callers = " < ".join(f"{c['function'] or '?'} ({where(c)})" for c in (r.get("stack") or [])[:3])
        table.add_row(
            _bytes(r.get("bytes_per_s")), _num(r.get("count_per_s")), _pct(r.get("bytes_pct")),
            str(r.get("function") or "?"), where(r), *((callers,) if name != "memory" else ()),
        )  # fmt: skip
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
