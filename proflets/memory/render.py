"""The memory proflet's rendering: its part of ``dyper report`` and its dashboard tables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from dyper.proflets.display import TableSpec, bytes_text, column, num, pct

#: The dashboard's tables (:mod:`dyper.proflets.display`), by the results' list each shows.
TABLES: Final[dict[str, TableSpec]] = {
    "sites": {
        "title": "sites",
        "columns": [
            column("file", "File", "text"),
            column("line", "Line"),
            column("function", "Function", "text"),
            column("count_per_s", "Count per (s)"),
            column("bytes_per_s", "Bytes per (s)"),
            column("count", "Count"),
            column("bytes", "Bytes"),
            column("bytes_pct", "Bytes %", "pct"),
        ],
    },
}


def sites(console: Console, name: str, section: Mapping[str, Any], limit: int) -> None:
    """GC pauses by the line that triggered them; allocation sites (memory_stacks: with their callers)."""

    def where(r: dict[str, Any]) -> str:
        return f"{os.path.basename(str(r['file']))}:{r['line']}" if r.get("file") else ""

    gc = section.get("gc")
    if gc is not None:
        n = gc.get("collections") or [0, 0, 0]
        console.print(
            f"[bold]memory:[/] RSS {bytes_text(section.get('rss_bytes'))}; collections {n[0]:,} / {n[1]:,} / {n[2]:,}"
            f" (generations 0 / 1 / 2); GC paused {num(gc.get('pause_total_s'), '{:.3f}')} s,"
            f" {pct(gc.get('pause_pct'))}% of the time"
        )
        watched = gc.get("watched_pct")
        if watched is not None and watched < 99.5:
            console.print(
                f"[dim]the GC callback watched {pct(watched)}% of the time, to keep within the budget;"
                " pauses and their lines are extrapolated from what it saw (collections are counted exactly)[/]"
            )
        table = Table(title="memory: GC pauses by the line that triggered them", header_style="bold")
        for col in ("pause s", "pause %", "gen 0/1/2", "function", "where"):
            table.add_column(col, justify="left" if col in ("function", "where") else "right")
        for r in (gc.get("pauses_by_site") or [])[:limit]:
            gens = "/".join(num(x) for x in r.get("generations") or ())
            table.add_row(
                num(r.get("pause_s"), "{:.3f}"), pct(r.get("pause_pct")), gens, str(r.get("function")), where(r)
            )
        console.print(table)
    sites = section.get("sites") or []
    if not sites:
        console.print(f"[dim]{name}: no allocation sites yet (no detailing burst)[/]")
        return
    table = Table(
        title=(
            f"{name}: allocation sites (allocated during {section.get('bursts')} bursts,"
            f" {num(section.get('burst_s'), '{:.1f}')} s sampled)"
            if section.get("sampled")
            else f"{name}: allocation sites (blocks alive at the end of {section.get('bursts')} bursts,"
            f" {num(section.get('burst_s'), '{:.1f}')} s traced)"
        ),
        header_style="bold",
    )
    for col in ("bytes/s", "blocks/s", "bytes %", "function", "where", *(("called from",) if name != "memory" else ())):
        table.add_column(col, justify="left" if col in ("function", "where", "called from") else "right")
    for r in sites[:limit]:
        callers = " < ".join(f"{c['function'] or '?'} ({where(c)})" for c in (r.get("stack") or [])[:3])
        table.add_row(
            bytes_text(r.get("bytes_per_s")), num(r.get("count_per_s")), pct(r.get("bytes_pct")),
            str(r.get("function") or "?"), where(r), *((callers,) if name != "memory" else ()),
        )  # fmt: skip
    console.print(table)


def terminal(console: Console, section: Mapping[str, Any], limit: int) -> None:
    """GC pauses by the line that triggered them; allocation sites."""
    sites(console, "memory", section, limit)
