"""Start the bundled demo service and attach dyper to it, with the live view.

    dyper demo [--budget 1%] [--duration S] [--http 127.0.0.1:8341] [--no-browser]

The service (monitor/demo/service.py) has a CPU, a lock and an I/O hot spot
and drives itself with a load generator. dyper attaches to the running
process exactly as `dyper attach PID` would, shows the live view in the
terminal and serves the web dashboard at the URL it prints (opened in a
browser when there is a display). Ctrl-C ends the demo and stops the service.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from dyper.monitor.commands import CliError, budget_arg, duration_arg
from dyper.monitor.commands import attach as attach_cmd

if TYPE_CHECKING:
    from dyper.monitor.server import Monitor

NAME = "demo"
#: where the demo's dashboard listens; any free port when this one is taken
DEFAULT_HTTP = "127.0.0.1:8341"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", type=budget_arg, default=0.01, help="overhead budget (default 1%%)")
    parser.add_argument("--duration", type=duration_arg, help="end the demo after this many seconds")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the profile at the end")
    parser.add_argument(
        "--http", metavar="HOST:PORT", default=DEFAULT_HTTP, help=f"serve the dashboard here (default {DEFAULT_HTTP})"
    )
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser on the dashboard")


def dashboard_beside(http: str, open_browser: bool) -> object:
    """The dashboard on the demo's own monitor, for as long as the demo runs."""
    from dyper.monitor.web.server import Dashboard, parse_http

    try:
        host, port = parse_http(http)
    except ValueError as exc:
        raise CliError(str(exc), code=2) from None

    @contextlib.asynccontextmanager
    async def serve(monitor: Monitor) -> AsyncIterator[object]:
        dashboard = Dashboard(monitor, host, port)
        try:
            url = await dashboard.start()
        except OSError:  # the usual port is taken (another demo?): any free one
            dashboard = Dashboard(monitor, host, 0)
            url = await dashboard.start()
        print(f"dashboard: {url}", flush=True)
        if open_browser and (
            os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or sys.platform == "darwin"
        ):
            import webbrowser

            webbrowser.open(url)
        try:
            yield dashboard
        finally:
            await dashboard.close()

    return serve


def run(args: argparse.Namespace) -> int:
    service = subprocess.Popen(
        [sys.executable, "-m", "dyper.monitor.demo.service"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert service.stdout is not None
        line = service.stdout.readline()
        if not line:
            raise CliError("the demo service did not start")
        print(line.strip())
        time.sleep(0.5)  # let the load generator warm up
        print(f"attaching dyper to pid {service.pid} at {100 * args.budget:g}% budget ...")
        # `dyper attach PID` with its own defaults, so options added to attach later reach the demo too
        attach_parser = argparse.ArgumentParser(add_help=False)
        attach_cmd.add_arguments(attach_parser)
        attach_args = attach_parser.parse_args([str(service.pid)])
        attach_args.budget = args.budget
        attach_args.duration = args.duration
        attach_args.window = 10.0
        attach_args.output = args.output
        return attach_cmd.run(attach_args, beside=dashboard_beside(args.http, not args.no_browser))
    finally:
        service.terminate()
        try:
            service.wait(5)
        except subprocess.TimeoutExpired:
            service.kill()
