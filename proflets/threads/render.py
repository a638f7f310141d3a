"""The threads proflet's rendering: its part of ``dyper report`` and its dashboard tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from dyper.proflets.display import TableSpec, column, num, pct

#: The dashboard's tables (:mod:`dyper.proflets.display`), by the results' list each shows.
TABLES: Final[dict[str, TableSpec]] = {
    "threads": {
        "title": "threads",
        "columns": [
            column("name", "Name", "name"),
            column("ident", "Ident"),
            column("run_pct", "Run %", "pct"),
            column("gil_pct", "Gil %", "pct"),
            column("block_pct", "Block %", "pct"),
            column("wait_pct", "Wait %", "pct"),
            column("io_pct", "Io %", "pct"),
            column("sleep_pct", "Sleep %", "pct"),
            column("blocked_by", "Blocked by", "text"),
            column("run_s", "Run (s)"),
            column("block_s", "Block (s)"),
            column("wait_s", "Wait (s)"),
            column("io_s", "Io (s)"),
            column("seconds", "Seconds"),
            column("samples", "Samples"),
            column("switches_per_s", "Switches per (s)"),
            column("waits", "Waits"),
            column("runqueue_pct", "Runqueue %", "pct"),
        ],
    },
}


def terminal(console: Console, section: Mapping[str, Any], limit: int) -> None:
    """Where each thread's time goes: running, the GIL, blocked, waiting, I/O, sleeping; who blocks it."""
    table = Table(title="threads: where each thread's time goes (% of its time)", header_style="bold")
    cols = ("thread", "run", "gil", "block", "wait", "io", "sleep", "blocked by", "run s", "waits")
    for col in cols:
        table.add_column(col, justify="left" if col in ("thread", "blocked by") else "right")
    for r in section.get("threads", [])[:limit]:
        table.add_row(
            str(r["name"]),
            pct(r["run_pct"]),
            pct(r["gil_pct"]),
            pct(r["block_pct"]),
            pct(r["wait_pct"]),
            pct(r["io_pct"]),
            pct(r["sleep_pct"]),
            str(r.get("blocked_by") or ""),
            num(r.get("run_s"), "{:.2f}"),
            num(r.get("waits")),
        )
    console.print(table)
