"""List the trigger events of a process: transient problems the agent caught, each with a window of its own.

    dyper triggers PID [--json] [--monitor ENDPOINT]

Triggers are set when the agent starts (``dyper attach`` and ``dyper run``
take ``--trigger COND``, repeatable, and ``--triggers FILE``) or from inside
(``agent.trigger(...)``). The conditions, checked once a second:

    cpu > 80% [for 10s]      process CPU (all threads, % of one core) above 80% for 10 s (default 5 s)
    rss > 1.5GB [for 5s]     resident memory above a size
    rss + 50MB/s [for 5s]    resident memory growing faster than 50 MB/s over 5 s (the default)
    blocked > 5s             a thread waiting for a lock at one place longer than 5 s
    mark:NAME                agent.mark(NAME) was called (NAME may hold * and ?)

Options follow, comma-separated: ``before 20s`` and ``after 30s`` (the
event's window around the moment it fired; defaults 20 s and 30 s) and
``budget 10%`` (the budget while the event lasts; default the ``--ceiling``,
else ten times the budget, at most 10%). A file::

    # dyper attach PID --triggers triggers.toml
    before = "20s"          # defaults for the triggers below
    after = "30s"

    [[trigger]]
    when = "cpu > 80% for 10s"

    [[trigger]]
    when = "rss + 20MB/s"
    after = "60s"

When one fires, the agent splits its report at the "before", raises the
budget and details at once for the "after", and the monitor keeps the event.
Then, with its number N from this list:

    dyper export PID --trigger N -o event.speedscope.json       the event's window
    dyper export PID --trigger N --normal -o normal.json        as long, just before it
    dyper bottlenecks PID --trigger N                           what the event costs more than the normal window
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from dyper.monitor.commands import CliError, add_monitor_argument, pid_arg
from dyper.monitor.commands.report import clock_text
from dyper.monitor.windows import WindowSpec

NAME = "triggers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=pid_arg)
    parser.add_argument("--json", action="store_true", help="the events as a JSON list")
    add_monitor_argument(parser)


def fetch(monitor: str, pid: int) -> list[dict[str, Any]]:
    """The events the standing monitor keeps for ``pid``; raises :class:`CliError`."""
    from dyper.monitor.client import MonitorClient, MonitorRefused, MonitorUnreachable

    try:
        with MonitorClient(monitor, timeout=10.0) as client:
            events = client.call("triggers", pid=pid)
    except (MonitorUnreachable, MonitorRefused) as exc:
        raise CliError(str(exc)) from None
    return list(events)


def event_windows(monitor: str, pid: int, number: int) -> tuple[dict[str, Any], WindowSpec, WindowSpec]:
    """Trigger event ``number`` of ``pid``, its window and the normal window before it; raises :class:`CliError`."""
    events = fetch(monitor, pid)
    for event in events:
        if event["id"] == number:
            start, end = event["window"]
            normal_start, normal_end = event["normal"]
            return event, WindowSpec.between(start, end), WindowSpec.between(normal_start, normal_end)
    if not events:
        raise CliError(f"process {pid} has had no trigger events (set them with dyper attach --trigger)")
    raise CliError(f"process {pid} has no trigger event {number}: see dyper triggers {pid}")


def run(args: argparse.Namespace) -> int:
    events = fetch(args.monitor, args.pid)
    if args.json:
        print(json.dumps(events))
        return 0
    console = Console()
    if not events:
        console.print(f"process {args.pid}: no trigger events yet")
        return 0
    table = Table(title=f"trigger events of process {args.pid}", title_justify="left")
    for column in ("#", "fired", "trigger", "what it saw", "window", "budget"):
        table.add_column(column, justify="right" if column in ("#", "budget") else "left")
    for e in events:
        start, end = e["window"]
        table.add_row(
            str(e["id"]),
            clock_text(e["t"]),
            e["name"],
            e["why"],
            f"{clock_text(start)} to {clock_text(end)}",
            f"{100 * e['budget']:g}%",
        )
    console.print(table)
    console.print(
        f"[dim]dyper bottlenecks {args.pid} --trigger N: what event N costs more than the window before it; "
        f"dyper export {args.pid} --trigger N -o FILE: its profile[/]"
    )
    return 0
