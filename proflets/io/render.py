"""The io proflet's rendering: its part of ``dyper report`` and its dashboard tables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from dyper.proflets.display import TableSpec, column, num, pct

#: The dashboard's tables (:mod:`dyper.proflets.display`), by the results' list each shows.
TABLES: Final[dict[str, TableSpec]] = {
    "routines": {
        "title": "routines",
        "columns": [
            column("routine", "Routine", "text"),
            column("kind", "Kind", "text"),
            column("caller", "Caller", "text"),
            column("caller_file", "Caller file", "text"),
            column("caller_line", "Caller line"),
            column("pct", "Pct"),
            column("samples", "Samples"),
            column("seconds", "Seconds"),
            column("calls_per_s", "Calls/s"),
            column("calls", "Calls"),
            column("s_per_call", "Time/call (s)"),
            column("s_per_call_measured", "S per call measured", "yesno"),
        ],
    },
    "threads": {
        "title": "threads",
        "columns": [
            column("name", "Name", "name"),
            column("ident", "Ident"),
            column("io_pct", "Io %", "pct"),
            column("samples", "Samples"),
            column("routine", "Routine", "text"),
            column("caller", "Caller", "text"),
            column("read_bytes_per_s", "Read bytes per (s)"),
            column("write_bytes_per_s", "Write bytes per (s)"),
        ],
    },
}


def kb_per_s(v: Any) -> str:
    return num(v / 1000.0 if isinstance(v, int | float) else None, "{:,.1f}") + " kB/s"


def terminal(console: Console, section: Mapping[str, Any], limit: int) -> None:
    """The threads' share of time in I/O and the bytes moved; the I/O routines with their callers; per thread."""
    console.print(
        f"[bold]io:[/] {pct(section.get('io_pct'))}% of the threads' time in I/O; read "
        f"{kb_per_s(section.get('read_bytes_per_s'))}, written {kb_per_s(section.get('write_bytes_per_s'))}"
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
            pct(r.get("pct")),
            str(r.get("routine")),
            str(r.get("caller")),
            f"{os.path.basename(str(r.get('caller_file')))}:{r.get('caller_line')}",
            ", ".join(r.get("threads") or [])[:40],
            num(r.get("calls_per_s"), "{:,.1f}"),
            num(per_call * 1000.0 if isinstance(per_call, int | float) else None, "{:,.2f}"),
        )
    console.print(table)
    table = Table(title="io: per thread (% of its time)", header_style="bold")
    for col in ("thread", "io %", "busiest routine", "caller", "read", "written"):
        table.add_column(col, justify="right" if col in ("io %", "read", "written") else "left")
    for r in section.get("threads", [])[:limit]:
        table.add_row(
            str(r.get("name")),
            pct(r.get("io_pct")),
            str(r.get("routine") or ""),
            str(r.get("caller") or ""),
            kb_per_s(r.get("read_bytes_per_s")),
            kb_per_s(r.get("write_bytes_per_s")),
        )
    console.print(table)
