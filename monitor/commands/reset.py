"""Start the statistics of an attached process afresh: its whole-run profile begins now.

    dyper reset PID [--monitor ENDPOINT]

What came before stays in the monitor's windows and history (`dyper export
--since`, the dashboard's time slices), and the reset is a mark on the
timeline (`dyper report` lists it).
"""

from __future__ import annotations

import argparse

from dyper.monitor.commands.pause import add_arguments, send

NAME = "reset"

__all__ = ["NAME", "add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    return send(args, "reset")
