"""The heap proflet's rendering: its part of ``dyper report`` and its dashboard tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from dyper.proflets.display import TableSpec, bytes_text, column, num

#: The dashboard's tables (:mod:`dyper.proflets.display`), by the results' list each shows.
TABLES: Final[dict[str, TableSpec]] = {
    "types": {
        "title": "types",
        "columns": [
            column("type", "Type", "text"),
            column("count", "Count"),
            column("bytes", "Bytes"),
            column("growth_per_min", "Growth per min"),
            column("suspect_leak", "Suspect leak", "yesno"),
            column("censuses_growing", "Censuses growing"),
        ],
    },
}


def terminal(console: Console, section: Mapping[str, Any], limit: int) -> None:
    """The last census: objects by type, largest first, suspects marked."""
    if not section.get("censuses"):
        console.print(f"[bold]heap:[/] {section.get('skip_reason') or section.get('note') or 'no census'}")
        return
    console.print(
        f"[bold]heap:[/] {num(section.get('objects'))} objects, {bytes_text(section.get('bytes'))} in "
        f"{num(section.get('types_seen'))} types at the last of {section['censuses']} censuses "
        f"(census {num(section.get('scan_ms'), '{:.0f}')} ms, worst {num(section.get('worst_scan_ms'), '{:.0f}')}"
        f" ms; maximum pause {num(section.get('max_pause_ms'), '{:.0f}')} ms)"
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
            num(r.get("count")),
            bytes_text(r.get("bytes")),
            num(r.get("growth_per_min"), "{:+,.0f}"),
            f"[red]leak? ({r.get('censuses_growing')} censuses)[/]" if r.get("suspect_leak") else "",
        )
    console.print(table)
