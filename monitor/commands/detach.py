"""Detach dyper's agent from a process, leaving the process as it was.

    dyper detach PID [--monitor ENDPOINT]

Asks the standing monitor to detach the agent; if no monitor knows the
process, stops the agent from inside the process directly.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from dyper.monitor.attach import detach
from dyper.monitor.commands import add_monitor_argument, pid_arg, through_monitor_or_inside

if TYPE_CHECKING:
    from dyper.monitor.client import MonitorClient

NAME = "detach"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=pid_arg)
    add_monitor_argument(parser)


def _via_monitor(client: MonitorClient, pid: int) -> bool:
    """The monitor passed the detach on and the agent has hung up (within 5 s)."""
    if not client.call("detach", pid=pid)["detached"]:
        return False
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not any(s["pid"] == pid and s["connected"] for s in client.call("sessions")):
            return True
        time.sleep(0.05)
    return False


def run(args: argparse.Namespace) -> int:
    return through_monitor_or_inside(
        args.monitor,
        args.pid,
        lambda client: _via_monitor(client, args.pid),
        lambda: detach(args.pid),
        f"detached from {args.pid}",
    )
