"""Change the overhead budget of an attached process, live.

    dyper budget PID 5% [--monitor ENDPOINT]

Goes through the standing monitor when it knows the process, otherwise
straight into the process. The agent never exceeds the ceiling given at start.
"""

from __future__ import annotations

import argparse

from dyper.agent import DEFAULT_MONITOR
from dyper.monitor.attach import AttachError, set_budget
from dyper.monitor.client import MonitorClient, MonitorRefused, MonitorUnreachable
from dyper.monitor.commands import CliError, budget_arg, endpoint_arg, pid_arg

NAME = "budget"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=pid_arg)
    parser.add_argument("budget", type=budget_arg, help="e.g. 5%%")
    parser.add_argument("--monitor", metavar="ENDPOINT", type=endpoint_arg, default=DEFAULT_MONITOR)


def run(args: argparse.Namespace) -> int:
    try:
        with MonitorClient(args.monitor, timeout=1.0) as client:
            if client.call("budget", pid=args.pid, budget=args.budget)["configured"]:
                print(f"budget of {args.pid} set to {100 * args.budget:g}%")
                return 0
    except (MonitorUnreachable, MonitorRefused):
        pass
    try:
        running = set_budget(args.pid, args.budget)
    except AttachError as exc:
        raise CliError(str(exc)) from None
    if not running:
        raise CliError(f"no dyper agent is running in process {args.pid}: dyper attach {args.pid} first")
    print(f"budget of {args.pid} set to {100 * args.budget:g}%")
    return 0
