"""Terminal views: the live top-functions table and the final summary.

:func:`top_view` turns a session into plain data (what ``dyper top`` receives
from a standing monitor over the wire); :func:`render_top` turns that data
into a rich table. The embedded monitor of ``run``/``attach`` calls both
in-process.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from monitor.profile import DEFAULT_FLOOR_PCT, Profile
from monitor.session import Session

#: Samples per second are measured over the last this many seconds.
RATE_WINDOW_S = 10.0


def session_info(session: Session) -> dict[str, Any]:
    return {
        "pid": session.pid,
        "host": session.key[0],
        "start_time": session.key[2],
        "argv": list(session.hello.get("argv", [])),
        "python": session.hello.get("python", ""),
        "connected": session.connected,
        "samples": session.samples,
        "budget": session.budget(),
        "overhead": session.overhead(),
        "last_report": session.last_report_t,
        "errors": list(session.errors)[-5:],
    }


def samples_per_s(session: Session) -> float:
    if not session.windows:
        return 0.0
    since = session.windows[-1].t - RATE_WINDOW_S
    recent = [w for w in session.windows if w.t > since]
    if len(recent) < 2:
        return 0.0
    span = recent[-1].t - recent[0].t
    return sum(w.samples for w in recent[1:]) / span if span > 0 else 0.0


def top_view(
    session: Session, window_s: float | None = None, *, limit: int = 15, charge_libraries: bool = False
) -> dict[str, Any]:
    profile = Profile.from_session(session, window_s)
    rows = profile.functions("cpu", charge_libraries=charge_libraries, floor_pct=DEFAULT_FLOOR_PCT)
    wall = {(r["file"], r["name"], r["line"]): r for r in profile.functions("wall", charge_libraries=charge_libraries)}
    for r in rows:
        w = wall.get((r["file"], r["name"], r["line"]))
        r["wall_self_pct"] = w["self_pct"] if w else 0.0
    return {
        "session": session_info(session),
        "samples_per_s": samples_per_s(session),
        "cpu_samples": profile.total("cpu"),
        "wall_samples": profile.total("wall"),
        "functions": rows[:limit],
        "by_total": sorted(rows, key=lambda r: -r["total"])[:limit],
        "dropped": profile.process.get("dropped", {}),
    }


def _short(path: str) -> str:
    """A path short enough for a table: relative when below the cwd, else its last parts."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        rel = path
    if not rel.startswith(".."):
        return rel
    parts = path.split(os.sep)
    return os.sep.join(parts[-2:]) if len(parts) > 2 else path


def render_top(view: dict[str, Any], title: str | None = None) -> Group:
    info = view["session"]
    argv = " ".join(info["argv"]) or "?"
    if info.get("ended"):
        state = "[dim]finished[/]"
    else:
        state = "[green]attached[/]" if info["connected"] else "[red]not connected[/]"
    header = Text.from_markup(
        f"[bold]dyper[/] pid {info['pid']} {state}  [dim]{argv[:80]}[/]\n"
        f"samples {info['samples']:,}  ({view['samples_per_s']:.0f}/s)   "
        f"overhead [bold]{100 * info['overhead']:.2f}%[/] of budget {100 * info['budget']:.2f}%   "
        f"cpu samples {view['cpu_samples']:,} / wall {view['wall_samples']:,}"
    )
    table = Table(title=title, expand=False, show_edge=False, header_style="bold")
    table.add_column("self %", justify="right")
    table.add_column("total %", justify="right")
    has_wall = any("wall_self_pct" in row for row in view["functions"])
    if has_wall:
        table.add_column("wall self %", justify="right", style="dim")
    table.add_column("function")
    table.add_column("where", style="dim")
    for row in view["functions"]:
        table.add_row(
            f"{row['self_pct']:5.1f}",
            f"{row['total_pct']:5.1f}",
            *([f"{row.get('wall_self_pct', 0.0):5.1f}"] if has_wall else []),
            row["name"],
            f"{_short(row['file'])}:{row['line']}",
        )
    parts: list[Any] = [header, table]
    dropped = {k: v for k, v in view.get("dropped", {}).items() if v}
    if dropped:
        parts.append(Text(f"dropped while the monitor was away: {dropped}", style="yellow"))
    for message in info.get("errors", []):
        parts.append(Text(f"agent: {message}", style="red"))
    return Group(*parts)


def render_waiting(what: str, since: float) -> Text:
    return Text(f"dyper: {what} ({time.monotonic() - since:.0f}s)", style="dim")
