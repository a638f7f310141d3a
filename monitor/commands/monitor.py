"""Run a standing monitor (DYMON) that many agents stream to.

    dyper monitor [--listen tcp://127.0.0.1:7341]

Agents started with --monitor, DYPER_MONITOR or `dyper attach --monitor`
connect to it; `dyper top`, `dyper ps` and `dyper detach` query it. It
listens on loopback by default; profiles never leave the host unencrypted.
Stops on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from typing import Any

from rich.console import Console

from agent import DEFAULT_MONITOR, check_endpoint
from monitor.commands import CliError
from monitor.server import Monitor

NAME = "monitor"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        metavar="ENDPOINT",
        default=DEFAULT_MONITOR,
        help=f"where agents and clients connect (default {DEFAULT_MONITOR})",
    )


def run(args: argparse.Namespace) -> int:
    try:
        check_endpoint(args.listen)
    except ValueError as exc:
        raise CliError(str(exc).replace("monitor endpoint", "listen endpoint"), code=2) from None
    console = Console(stderr=True)

    def on_event(kind: str, data: dict[str, Any]) -> None:
        stamp = time.strftime("%H:%M:%S")
        if kind == "session":
            console.print(f"{stamp} new process {data['pid']}: {' '.join(data['argv'])[:100]}")
        elif kind == "hello":
            console.print(f"{stamp} agent connected in {data['pid']}")
        elif kind == "bye":
            console.print(f"{stamp} agent in {data['pid']} left ({data['reason']})")
        elif kind in ("agent_error", "internal_error"):
            console.print(f"{stamp} [red]{kind}[/]: {data['message']}")

    monitor = Monitor(args.listen, on_event=on_event)
    try:
        endpoint = monitor.bind()
    except OSError as exc:
        raise CliError(f"{exc}: is another monitor running? (dyper ps --monitor {args.listen})") from None
    console.print(f"dyper monitor listening on {endpoint}; Ctrl-C to stop")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await monitor.serve(stop)

    try:
        asyncio.run(main())
    finally:
        monitor.close()
    return 0
