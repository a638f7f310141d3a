"""Detach dyper's agent from a process, leaving the process as it was.

    dyper detach PID [--monitor ENDPOINT]

Asks the standing monitor to detach the agent; if no monitor knows the
process, stops the agent from inside the process directly.
"""

from __future__ import annotations

import argparse
import time

from dyper.monitor.attach import AttachError, detach
from dyper.monitor.client import MonitorClient, MonitorRefused, MonitorUnreachable
from dyper.monitor.commands import CliError, add_monitor_argument, pid_arg

NAME = "detach"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=pid_arg)
    add_monitor_argument(parser)


def _via_monitor(endpoint: str, pid: int) -> bool:
    try:
        with MonitorClient(endpoint, timeout=1.0) as client:
            if not client.call("detach", pid=pid)["detached"]:
                return False
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if not any(s["pid"] == pid and s["connected"] for s in client.call("sessions")):
                    return True
                time.sleep(0.05)
    except (MonitorUnreachable, MonitorRefused):
        return False
    return False


def run(args: argparse.Namespace) -> int:
    if _via_monitor(args.monitor, args.pid):
        print(f"detached from {args.pid}")
        return 0
    try:
        was_running = detach(args.pid)
    except AttachError as exc:
        raise CliError(str(exc)) from None
    if not was_running:
        raise CliError(f"no dyper agent is running in process {args.pid}")
    print(f"detached from {args.pid}")
    return 0
