"""Pause sampling and detailing in an attached process; the agent stays attached and costs nothing.

    dyper pause PID [--monitor ENDPOINT]
    dyper resume PID

Goes through the standing monitor when it knows the process, otherwise
straight into the process. ``dyper reset PID`` starts its statistics afresh.
"""

from __future__ import annotations

import argparse

from dyper.monitor.attach import AttachError, control
from dyper.monitor.client import MonitorClient, MonitorRefused, MonitorUnreachable
from dyper.monitor.commands import CliError, add_monitor_argument, pid_arg

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
    try:
        with MonitorClient(args.monitor, timeout=1.0) as client:
            if client.call(op, pid=args.pid)["configured"]:
                print(DONE[op].format(pid=args.pid))
                return 0
    except (MonitorUnreachable, MonitorRefused):
        pass  # no monitor, or one that does not know the process: ask inside it
    try:
        running = control(args.pid, op)
    except AttachError as exc:
        raise CliError(str(exc)) from None
    if not running:
        raise CliError(f"no dyper agent is running in process {args.pid}: dyper attach {args.pid} first")
    print(DONE[op].format(pid=args.pid))
    return 0


def run(args: argparse.Namespace) -> int:
    return send(args, "pause")
