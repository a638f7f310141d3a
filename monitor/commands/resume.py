"""Resume sampling and detailing in a process paused with `dyper pause`.

dyper resume PID [--monitor ENDPOINT]
"""

from __future__ import annotations

import argparse

from dyper.monitor.commands.pause import add_arguments, send

NAME = "resume"

__all__ = ["NAME", "add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    return send(args, "resume")
