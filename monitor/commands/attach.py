"""Attach dyper's agent to a running Python process: no restart, no code change.

    dyper attach PID [--budget 1%] [--duration S] [-o FILE]
    dyper attach PID --monitor tcp://127.0.0.1:7341

Without --monitor the CLI hosts the monitor, shows the live view and, when
--duration passes, the process exits or you press Ctrl-C, detaches cleanly
and writes -o. With --monitor the agent streams to that standing monitor and
stays until `dyper detach PID`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from rich.console import Console

from monitor.attach import AttachError, attach
from monitor.commands import CliError, add_output_arguments, budget_arg, duration_arg, pid_arg
from monitor.embedded import Options, detach_via, finish_output, profile_target
from monitor.server import Monitor

NAME = "attach"


def _proflets(args: argparse.Namespace) -> tuple[str, ...] | None:
    if args.proflets is None:
        return None
    return tuple(p for p in str(args.proflets).replace(" ", "").split(",") if p)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=pid_arg, help="process id of a running CPython 3.11+ process")
    parser.add_argument("--budget", type=budget_arg, default=0.01, help="overhead budget, e.g. 1%% (default 1%%)")
    parser.add_argument("--ceiling", type=budget_arg, help="no later budget change may exceed this")
    parser.add_argument(
        "--proflets",
        metavar="LIST",
        default=os.environ.get("DYPER_PROFLETS"),
        help="proflets to run, e.g. cpu,threads,timing or all (default $DYPER_PROFLETS, else the agent's default)",
    )
    parser.add_argument("--duration", type=duration_arg, help="detach after this many seconds")
    parser.add_argument("--monitor", metavar="ENDPOINT", help="stream to a standing monitor and return")
    parser.add_argument("--window", type=duration_arg, help="live view over the last N seconds only")
    parser.add_argument("-q", "--quiet", action="store_true", help="no live view, only the final summary")
    add_output_arguments(parser)


class AttachedProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def done(self) -> bool:
        return not os.path.exists(f"/proc/{self.pid}")

    async def finish(self, monitor: Monitor | None, reason: str) -> None:
        if self.done():
            return
        if monitor is not None and await detach_via(monitor, self.pid):
            return
        # The agent did not answer over the socket: stop it from inside.
        from monitor.attach import detach

        await asyncio.to_thread(detach, self.pid)


def run(args: argparse.Namespace, *, beside: Any = None) -> int:
    """``beside``: see :func:`monitor.embedded.profile_target` (the demo's dashboard)."""
    console = Console()
    if args.monitor:
        return _attach_to_standing(args, console)

    async def start(endpoint: str) -> AttachedProcess:
        try:
            await asyncio.to_thread(attach, args.pid, endpoint, args.budget, ceiling=args.ceiling)
        except AttachError as exc:
            raise CliError(str(exc)) from None
        return AttachedProcess(args.pid)

    live = not args.quiet and console.is_terminal
    options = Options(args.duration, args.output, args.metric, args.libraries, live, args.window)
    target, profile = asyncio.run(profile_target(start, options, console, beside=beside))
    try:
        finish_output(profile, options, console, target.pid)
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    return 0


def _attach_to_standing(args: argparse.Namespace, console: Console) -> int:
    import time

    from agent import check_endpoint
    from monitor.client import MonitorClient, MonitorUnreachable

    try:
        check_endpoint(args.monitor)
    except ValueError as exc:
        raise CliError(str(exc), code=2) from None
    with MonitorClient(args.monitor) as client:
        try:
            client.call("ping")
        except MonitorUnreachable as exc:
            raise CliError(str(exc)) from None
        try:
            attached = attach(args.pid, args.monitor, args.budget, ceiling=args.ceiling, proflets=_proflets(args))
        except AttachError as exc:
            raise CliError(str(exc)) from None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            sessions = client.call("sessions")
            if any(s["pid"] == args.pid and s["connected"] for s in sessions):
                break
            time.sleep(0.1)
        else:
            raise CliError(f"agent started in {args.pid} but the monitor at {args.monitor} has not heard from it")
    console.print(
        f"attached to {args.pid} (Python {attached.python}), streaming to {args.monitor} "
        f"at {100 * args.budget:g}% budget; `dyper top {args.pid}` to watch, `dyper detach {args.pid}` to stop"
    )
    return 0
