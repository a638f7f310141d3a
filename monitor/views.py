"""Terminal views: the live top-functions table and the final summary.

:func:`top_view` turns a session into plain data (what ``dyper top`` receives
from a standing monitor over the wire); :func:`render_top` turns that data
into a rich table. The embedded monitor of ``run``/``attach`` calls both
in-process.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from dyper.agent.budget import slowdown_by
from dyper.monitor.model.profile import FLOOR_PCT, Profile
from dyper.monitor.profile import build_profile, proflets_off
from dyper.monitor.session import Session
from dyper.monitor.windows import WindowSpec

if TYPE_CHECKING:
    from dyper.monitor.services import Service

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
        "paused": session.paused,
        "sampler": session.sampler(),
        "samples": session.samples,
        "reports": session.reports,
        "budget": session.budget(),
        "overhead": session.overhead(),
        # the raw ledger (seconds by line, and the seconds they were spent in), for tools that difference it
        "spent_s": dict(session.costs),
        "duration_s": session.duration_s(),
        "first_report": session.first_report_t,
        "last_report": session.last_report_t,
        "errors": list(session.errors)[-5:],
        "spending": spending(session),
        # what agents counted but could not keep or send (monitor away or slow), as they last reported
        "dropped": dropped(session),
    }


def dropped(session: Session) -> dict[str, int]:
    """Samples, reports and messages the session's agents dropped, summed over its agents."""
    total: dict[str, int] = {}
    for a in session.agents.values():
        for k, v in a.dropped.items():
            total[k] = total.get(k, 0) + v
    return total


def spending(session: Session) -> dict[str, Any]:
    """Spent vs budget: over the whole run and now, by category; who schedules; the plan in force."""
    elapsed = session.duration_s()
    live = [a for a in session.agents.values() if a.connected] or list(session.agents.values())
    agent = live[-1] if live else None
    delays = agent.delays if agent is not None else {}
    return {
        "budget": session.budget(),
        "whole_run": slowdown_by(session.costs, elapsed) if elapsed > 0 else {},
        "now": session.spent_now(RATE_WINDOW_S),
        "history": [[t, b, o] for t, b, o in list(session.overhead_history)[-120:]],
        "scheduler": agent.mode if agent is not None else "",
        "delays_s": {k: v for k, v in delays.items() if isinstance(v, int | float)},
        "proflets": agent.proflets if agent is not None else {},
        "bursts": len(session.bursts),
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
    session: Session,
    window_s: float | None = None,
    *,
    limit: int = 15,
    charge_libraries: bool = False,
    profile: Profile | None = None,
) -> dict[str, Any]:
    """The live view of a session over the last ``window_s`` (None: whole run), or over ``profile``'s window."""
    if profile is None:
        profile = build_profile(session, WindowSpec.last(window_s) if window_s else None)
    tasks = profile.process.get("view") == "tasks"
    # The task view is mostly waiting: its functions are ranked by all task time, with the running part beside.
    first, second = ("wall", "cpu") if tasks else ("cpu", "wall")
    rows = profile.functions(first, charge_libraries=charge_libraries, floor_pct=FLOOR_PCT)
    other = {(r["file"], r["name"], r["line"]): r for r in profile.functions(second, charge_libraries=charge_libraries)}
    rates = session.calls_per_s()
    for r in rows:
        key = (r["file"], r["name"], r["line"])
        w = other.get(key)
        r["running_self_pct" if tasks else "wall_self_pct"] = w["self_pct"] if w else 0.0
        if key in rates:
            r["calls_per_s"] = rates[key]
    return {
        "session": session_info(session),
        "view": profile.process.get("view", "threads"),
        "asyncio": asyncio_summary(session, window_s),
        "samples_per_s": samples_per_s(session),
        "cpu_samples": profile.total("cpu"),
        "wall_samples": profile.total("wall"),
        "functions": rows[:limit],
        "by_total": sorted(rows, key=lambda r: -r["total"])[:limit],
        "dropped": profile.process.get("dropped", {}),
        "off": proflets_off(session),
    }


def asyncio_summary(session: Session, window_s: float | None = None) -> dict[str, Any] | None:
    """The tasks proflet's loops and busiest handlers over the window, for the live views (None: no asyncio seen)."""
    analyzer = session.analyzers.get("tasks")
    if analyzer is None:
        return None
    start = None if window_s is None or not session.windows else session.windows[-1].t - window_s
    try:
        r = analyzer.results(start, None)
    except Exception:  # the live view goes on without it
        return None
    if not r:
        return None
    return {"loops": r["loops"], "handlers": r["handlers"][:3], "blocks": r["blocks"][:1]}


def service_top_view(
    service: Service, window_s: float | None = None, *, limit: int = 15, charge_libraries: bool = False
) -> dict[str, Any]:
    """The live view of a whole service: its members' counts merged, one line per process."""
    profile = build_profile(service, WindowSpec.last(window_s) if window_s else None)
    view = top_view(service.root, window_s, limit=limit, charge_libraries=charge_libraries, profile=profile)
    info = view["session"]
    info.update(
        samples=sum(m.samples for m in service.members),
        overhead=profile.process["overhead"],
        connected=any(m.connected for m in service.members),
        errors=[e for m in service.members for e in list(m.errors)[-2:]][-5:],
    )
    view["samples_per_s"] = sum(samples_per_s(m) for m in service.members)
    view["service"] = {
        **service.info(),
        "members": [
            {
                "pid": m.pid,
                "argv": list(m.hello.get("argv", [])),
                "connected": m.connected,
                "samples": m.samples,
                "samples_per_s": samples_per_s(m),
                "overhead": m.overhead(),
            }
            for m in service.members
        ],
    }
    return view


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
        if info.get("paused"):
            state += " [yellow]paused[/] (dyper resume PID)"
    service = view.get("service")
    who = f" service [bold]{service['name']}[/]," if service and service["processes"] > 1 else ""
    if service and service["processes"] > 1:
        live = "" if info.get("ended") else f"{service['connected']}/"
        state += f" {live}{service['processes']} processes"
    header = Text.from_markup(
        f"[bold]dyper[/]{who} pid {info['pid']} {state}  [dim]{argv[:80]}[/]\n"
        f"samples {info['samples']:,}  ({view['samples_per_s']:.0f}/s)   "
        f"overhead [bold]{100 * info['overhead']:.2f}%[/] of budget {100 * info['budget']:.2f}%   "
        f"cpu samples {view['cpu_samples']:,} / wall {view['wall_samples']:,}   "
        f"sampler {(info.get('sampler') or {}).get('name', 'unknown')}"
    )
    spend = info.get("spending")
    if spend:
        now = spend.get("now") or {}
        parts_now = "  ".join(f"{k} {100 * v:.2f}%" for k, v in sorted(now.items()) if v > 0)
        delays = spend.get("delays_s") or {}
        detail = "  ".join(
            f"{k.split('.', 1)[1]} detail every {v:.1f}s" for k, v in sorted(delays.items()) if k.startswith("detail.")
        )
        header.append_text(
            Text.from_markup(
                f"\nspent now [bold]{100 * sum(now.values()):.2f}%[/] ({parts_now or 'nothing yet'})   "
                f"scheduled by {'the monitor' if spend.get('scheduler') == 'monitor' else 'the agent'}   "
                f"sample every {1000 * delays.get('sample', 0.0):.1f} ms  {detail}"
            )
        )
    table = Table(title=title, expand=False, show_edge=False, header_style="bold")
    table.add_column("self %", justify="right")
    table.add_column("total %", justify="right")
    has_wall = any("wall_self_pct" in row for row in view["functions"])
    if has_wall:
        table.add_column("wall self %", justify="right", style="dim")
    has_running = any("running_self_pct" in row for row in view["functions"])
    if has_running:
        table.add_column("running self %", justify="right", style="dim")
    has_calls = any("calls_per_s" in row for row in view["functions"])
    if has_calls:
        table.add_column("calls/s", justify="right")
    table.add_column("function")
    table.add_column("where", style="dim")
    for row in view["functions"]:
        rate = row.get("calls_per_s")
        table.add_row(
            f"{row['self_pct']:5.1f}",
            f"{row['total_pct']:5.1f}",
            *([f"{row.get('wall_self_pct', 0.0):5.1f}"] if has_wall else []),
            *([f"{row.get('running_self_pct', 0.0):5.1f}"] if has_running else []),
            *([f"{rate:,.0f}" if rate is not None else ""] if has_calls else []),
            row["name"],
            f"{_short(row['file'])}:{row['line']}",
        )
    if view.get("view") == "tasks":
        table.title = (title + "   " if title else "") + "task view: % of all tasks' time, waiting included"
    parts: list[Any] = [header, table]
    aio = view.get("asyncio")
    if aio:
        parts.append(render_asyncio(aio))
    if service and service["processes"] > 1:
        rows = "   ".join(
            f"{m['pid']}{'' if m['connected'] or info.get('ended') else ' (gone)'} "
            + (f"{m['samples_per_s']:.0f}/s" if "samples_per_s" in m else f"{m['samples']:,} samples")
            + f" {100 * m['overhead']:.2f}%"
            for m in service["members"][:12]
        )
        more = f"  and {service['processes'] - 12} more" if service["processes"] > 12 else ""
        parts.insert(1, Text(f"processes: {rows}{more}", style="dim"))
    off = view.get("off") or {}
    if off:
        # a proflet off or not yet run is said, never left to look like zeros
        parts.append(Text("   ".join(f"{name}: {why}" for name, why in sorted(off.items())), style="dim"))
    dropped = {k: v for k, v in view.get("dropped", {}).items() if v}
    if dropped:
        parts.append(Text(f"dropped while the monitor was away: {dropped}", style="yellow"))
    for message in info.get("errors", []):
        parts.append(Text(f"agent: {message}", style="red"))
    return Group(*parts)


def render_waiting(what: str, since: float) -> Text:
    return Text(f"dyper: {what} ({time.monotonic() - since:.0f}s)", style="dim")


def render_asyncio(aio: dict[str, Any]) -> Text:
    """One line per event loop (tasks, busy, blocks, lag) and per busiest handler (what it awaits)."""
    text = Text()
    for loop in aio.get("loops") or ():
        blocked = (
            f"[red]blocked {loop['blocks']}x, {loop['blocked_s']:.2f} s[/]"
            if loop["blocks"]
            else "[green]never blocked[/]"
        )
        text.append_text(
            Text.from_markup(
                f"asyncio loop in {loop['thread']}: {loop['tasks_mean']:.0f} tasks (max {loop['tasks_max']}), "
                f"busy {loop['busy_pct']:.0f}%, {blocked}, lag p99 {loop['lag_ms_p99']:.1f} ms\n"
            )
        )
    for b in aio.get("blocks") or ():
        leaf: dict[str, Any] = b["stack"][-1] if b["stack"] else {"function": "?", "file": "?", "line": 0}
        text.append(
            f"  longest block {b['duration_ms']:.0f} ms in {leaf['function']} ({_short(leaf['file'])}:{leaf['line']})"
            + (f", task {b['task']}" if b["task"] else "")
            + "\n"
        )
    for h in aio.get("handlers") or ():
        top = h["awaiting"][0] if h["awaiting"] else None
        waits = ""
        if top:
            what = top["function"] if top["file"] == "<asyncio>" else f"awaiting {top['function']}"
            via = f" in {top['via']}" if top["via"] and top["via"] != top["function"] else ""
            waits = f", {top['pct']:.0f}% {what}{via}"
        text.append(f"  {h['handler']}: {h['share_pct']:.0f}% of task time, {h['running_pct']:.0f}% running{waits}\n")
    return text
