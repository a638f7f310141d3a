"""Change the overhead budget of an attached process, live.

    dyper budget PID 5% [--monitor ENDPOINT]

Goes through the standing monitor when it knows the process, otherwise
straight into the process. The agent never exceeds the ceiling given at start.
"""

from __future__ import annotations

import argparse

from dyper.agent import DEFAULT_MONITOR
from dyper.monitor.attach import set_budget
from dyper.monitor.commands import budget_arg, endpoint_arg, pid_arg, through_monitor_or_inside

NAME = "budget"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=pid_arg)
    parser.add_argument("budget", type=budget_arg, help="e.g. 5%%")
    parser.add_argument("--monitor", metavar="ENDPOINT", type=endpoint_arg, default=DEFAULT_MONITOR)


def run(args: argparse.Namespace) -> int:
    return through_monitor_or_inside(
        args.monitor,
        args.pid,
        lambda client: bool(client.call("budget", pid=args.pid, budget=args.budget)["configured"]),
        lambda: set_budget(args.pid, args.budget),
        f"budget of {args.pid} set to {100 * args.budget:g}%",
        f": dyper attach {args.pid} first",
    )
