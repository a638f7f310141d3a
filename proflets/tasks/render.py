"""The tasks proflet's rendering: its part of ``dyper report`` and its dashboard tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from dyper.proflets.display import TableSpec, clock_text, column

#: The dashboard's tables (:mod:`dyper.proflets.display`), by the results' list each shows.
TABLES: Final[dict[str, TableSpec]] = {
    "loops": {
        "title": "loops",
        "columns": [
            column("thread", "Thread", "text"),
            column("ident", "Ident"),
            column("tasks_mean", "Tasks mean"),
            column("tasks_max", "Tasks max"),
            column("busy_pct", "Busy %", "pct"),
            column("lag_ms_p50", "Lag ms p50"),
            column("lag_ms_p99", "Lag ms p99"),
            column("lag_ms_max", "Lag ms max"),
            column("lag_probes", "Lag probes"),
            column("blocks", "Blocks"),
            column("blocked_s", "Blocked (s)"),
            column("blocked_pct", "Blocked %", "pct"),
            column("passes", "Passes"),
            column("seconds", "Seconds"),
        ],
    },
    "handlers": {
        "title": "handlers",
        "columns": [
            column("handler", "Handler", "text"),
            column("file", "File", "text"),
            column("line", "Line"),
            column("task", "Task", "text"),
            column("app", "App", "yesno"),
            column("wall_s", "Wall (s)"),
            column("share_pct", "Share %", "pct"),
            column("running_pct", "Running %", "pct"),
        ],
    },
    "blocks": {
        "title": "blocks",
        "columns": [
            column("t", "T"),
            column("thread", "Thread", "text"),
            column("task", "Task", "text"),
            column("duration_ms", "Duration (ms)"),
        ],
    },
}


def terminal(console: Console, section: Mapping[str, Any], limit: int) -> None:
    """asyncio: each loop's health, where handlers spend their wall time, the longest blocks with their stacks."""
    from dyper.monitor.views import _short

    if not section:
        return
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
