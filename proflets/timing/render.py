"""The timing proflet's rendering: its part of ``dyper report`` and its dashboard tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from dyper.proflets.display import TableSpec, column

#: The dashboard's tables (:mod:`dyper.proflets.display`), by the results' list each shows.
TABLES: Final[dict[str, TableSpec]] = {
    "threads": {
        "title": "threads",
        "columns": [
            column("name", "Name", "name"),
            column("ident", "Ident"),
            column("cpu_s", "Cpu (s)"),
        ],
    },
}


def terminal(console: Console, section: Mapping[str, Any], limit: int) -> None:
    """Active threads against the processors, the cores used, and each thread's CPU seconds."""
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
