"""Live top-functions view of a process streaming to a standing monitor.

    dyper top [PID] [--monitor ENDPOINT] [--window S] [--once]

Without PID: the only process the monitor knows, or a list to choose from.
Ends on Ctrl-C or SIGTERM; outside a terminal (piped, under a supervisor)
it then writes the last view it showed.
"""

from __future__ import annotations

import argparse
import signal
import time
from types import FrameType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from dyper.monitor.client import MonitorClient, MonitorRefused, MonitorUnreachable
from dyper.monitor.commands import (
    CliError,
    add_metric_arguments,
    add_monitor_argument,
    add_view_argument,
    duration_arg,
    pid_arg,
)
from dyper.monitor.views import render_top

NAME = "top"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=pid_arg, nargs="?")
    parser.add_argument(
        "--service",
        action="store_true",
        help="the whole service PID belongs to: a pre-fork master and its workers, merged",
    )
    add_monitor_argument(parser)
    parser.add_argument("--window", type=duration_arg, help="the last N seconds only (default: whole run)")
    add_metric_arguments(parser, metric=False)
    add_view_argument(parser)
    parser.add_argument("--once", action="store_true", help="print the view once and exit")
    parser.add_argument("--json", action="store_true", help="print the view once as JSON and exit")


def _sessions_table(sessions: list[dict[str, Any]]) -> Table:
    table = Table(title="processes known to the monitor: dyper top PID to watch one", header_style="bold")
    for col in ("pid", "state", "samples", "overhead", "budget", "command"):
        table.add_column(col)
    for s in sessions:
        table.add_row(
            str(s["pid"]),
            ("paused" if s.get("paused") else "attached") if s["connected"] else "gone",
            f"{s['samples']:,}",
            f"{100 * s['overhead']:.2f}%",
            f"{100 * s['budget']:.2f}%",
            " ".join(s["argv"])[:80],
        )
    return table


def _interrupt(_sig: int, _frame: FrameType | None) -> None:
    # As Ctrl-C does: the live view stops and, outside a terminal, writes its last frame.
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    console = Console()
    signal.signal(signal.SIGTERM, _interrupt)
    with MonitorClient(args.monitor) as client:
        try:
            pid = args.pid
            if pid is None:
                sessions = client.call("sessions")
                live = [s for s in sessions if s["connected"]]
                if len(live) == 1:
                    pid = live[0]["pid"]
                else:
                    console.print(_sessions_table(sessions))
                    return 0 if sessions else 1
            view_args = {"pid": pid, "libraries": args.libraries, "service": args.service}
            if args.window:
                view_args["window_s"] = args.window
            if args.view == "tasks":
                if args.service:
                    raise CliError("--view tasks shows one process: leave out --service", code=2)
                view_args["view"] = "tasks"
            if args.json or args.once:
                view = client.call("top", **view_args)
                if args.json:
                    import json

                    print(json.dumps(view))
                else:
                    console.print(render_top(view))
                return 0
            with Live(console=console, refresh_per_second=2, screen=False) as live_view:
                while True:
                    live_view.update(render_top(client.call("top", **view_args), title="Ctrl-C to quit"))
                    time.sleep(1.0)
        except MonitorUnreachable as exc:
            raise CliError(str(exc)) from None
        except MonitorRefused as exc:
            raise CliError(str(exc)) from None
        except KeyboardInterrupt:
            return 0
