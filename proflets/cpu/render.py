"""The cpu proflet's rendering: its part of ``dyper report`` and its dashboard tables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from dyper.proflets.display import TableSpec, column, num, pct

#: The dashboard's tables (:mod:`dyper.proflets.display`), by the results' list each shows.
TABLES: Final[dict[str, TableSpec]] = {
    "functions": {
        "title": "CPU by function",
        "columns": [
            column("name", "Name", "name"),
            column("self_s", "Base time (s)"),
            column("self_pct", "Base %", "pct"),
            column("total_s", "Total time (s)"),
            column("total_pct", "Total %", "pct"),
            column("calls", "Calls"),
            column("calls_per_s", "Calls/s"),
            column("s_per_call", "Time/call (s)"),
        ],
    },
    "lines": {
        "title": "CPU by line",
        "columns": [
            column("name", "Name", "name"),
            column("self", "Base samples"),
            column("total", "Total samples"),
            column("self_pct", "Base %", "pct"),
            column("total_pct", "Total %", "pct"),
        ],
    },
}


def terminal(console: Console, section: Mapping[str, Any], limit: int) -> None:
    """Functions by self and total share of the CPU samples, and the C calls inside the hottest (native time)."""
    table = Table(title="cpu: functions (self and total share of CPU samples)", header_style="bold")
    for col in ("self %", "total %", "calls", "calls/s", "function", "where"):
        table.add_column(col, justify="right" if col[0] in "stc" and col != "function" else "left")
    for r in section.get("functions", [])[:limit]:
        table.add_row(
            pct(r.get("self_pct")),
            pct(r.get("total_pct")),
            num(r.get("calls")),
            num(r.get("calls_per_s"), "{:,.1f}"),
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
                pct(r.get("pct_of_function")),
                num(r.get("seconds"), "{:.3f}"),
                num(r.get("calls")),
                str(r.get("callee")),
                f"{r.get('function')} ({os.path.basename(str(r.get('file')))}:{r.get('line')})",
            )
        console.print(table)
