"""Pause sampling and detailing in an attached process; the agent stays attached and costs nothing.

    dyper pause PID [--monitor ENDPOINT]
    dyper resume PID

Goes through the standing monitor when it knows the process, otherwise
straight into the process. ``dyper reset PID`` starts its statistics afresh.
"""

from __future__ import annotations

import argparse

from dyper.monitor.attach import control
from dyper.monitor.commands import add_monitor_argument, pid_arg, through_monitor_or_inside

NAME = "pause"

#: What each control prints when it is done.
DONE = {
    "pause": "paused {pid}: no sampling, no detailing until `dyper resume {pid}`",
    "resume": "resumed {pid}",
    "reset": "reset {pid}: its whole-run statistics start now (history keeps what came before)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=pid_arg)
    add_monitor_argument(parser)


def send(args: argparse.Namespace, op: str) -> int:
    """Ask the monitor that knows ``args.pid`` to pass ``op`` on; else tell the agent inside the process."""
    return through_monitor_or_inside(
        args.monitor,
        args.pid,
        lambda client: bool(client.call(op, pid=args.pid)["configured"]),
        lambda: control(args.pid, op),
        DONE[op].format(pid=args.pid),
        f": dyper attach {args.pid} first",
    )


def run(args: argparse.Namespace) -> int:
    return send(args, "pause")
