"""What the proflets' render modules share: the dashboard's table description and the terminal's number formats.

A proflet's ``render`` module (monitor side only, never loaded in the target)
gives:

- ``terminal(console, section, limit)``: its part of ``dyper report``, drawn
  with rich from its analyzer's results (``section``), at most ``limit``
  rows a table;
- ``TABLES``: for each list of rows in its results, the dashboard's table,
  as data (:class:`TableSpec`): the page draws any proflet's table from it,
  so a new proflet needs no change to the dashboard's script.

A proflet without a render module, or a list without a description, is
shown by the generic renderers: every list of flat rows as a table with a
column per key.
"""

from __future__ import annotations

import time
from typing import Any, Final, Literal, TypedDict

#: How the dashboard shows a column's values: ``name`` a function name with its
#: file:line under it (from the row's file and line), ``pct`` a percentage with
#: a bar, ``num`` a number, ``text`` as it is, ``yesno`` a boolean.
Format = Literal["name", "pct", "num", "text", "yesno"]
FORMATS: Final = ("name", "pct", "num", "text", "yesno")


class Column(TypedDict):
    """One column of a dashboard table: the row's key, its heading, how its values look."""

    key: str
    title: str
    format: Format


class TableSpec(TypedDict):
    """A dashboard table over one list of a proflet's results."""

    title: str
    columns: list[Column]


def column(key: str, title: str, format: Format = "num") -> Column:
    """A :class:`Column` (``format`` one of :data:`FORMATS`)."""
    if format not in FORMATS:
        raise ValueError(f"{format!r} is not a column format ({', '.join(FORMATS)})")
    return {"key": key, "title": title, "format": format}


# --- the terminal's formats -----------------------------------------------------------------


def pct(v: Any) -> str:
    """A percentage to a tenth, or "-" when there is none."""
    return f"{v:.1f}" if isinstance(v, int | float) else "-"


def num(v: Any, fmt: str = "{:,.0f}") -> str:
    """A number in ``fmt``, or "-" when there is none."""
    return fmt.format(v) if isinstance(v, int | float) else "-"


def bytes_text(v: Any) -> str:
    """A size in B, kB, MB or GB (powers of 1000)."""
    if not isinstance(v, int | float):
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(v) < 1000 or unit == "GB":
            return f"{v:,.0f} {unit}" if unit == "B" else f"{v:,.1f} {unit}"
        v /= 1000.0
    return "-"


def clock_text(t: Any) -> str:
    """A wall time as the local time of day, to the tenth of a second."""
    if not isinstance(t, int | float):
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 10) % 10}"
