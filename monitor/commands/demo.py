"""Start the bundled demo service and attach dyper to it, with the live view.

    dyper demo [--budget 1%] [--duration S]

The service (monitor/demo/service.py) has a CPU, a lock and an I/O hot spot
and drives itself with a load generator. dyper attaches to the running
process exactly as `dyper attach PID` would. Ctrl-C ends the demo and stops
the service.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from monitor.commands import CliError, budget_arg, duration_arg
from monitor.commands import attach as attach_cmd

NAME = "demo"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", type=budget_arg, default=0.01, help="overhead budget (default 1%%)")
    parser.add_argument("--duration", type=duration_arg, help="end the demo after this many seconds")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the profile at the end")


def run(args: argparse.Namespace) -> int:
    service = subprocess.Popen(
        [sys.executable, "-m", "monitor.demo.service"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert service.stdout is not None
        line = service.stdout.readline()
        if not line:
            raise CliError("the demo service did not start")
        print(line.strip())
        time.sleep(0.5)  # let the load generator warm up
        print(f"attaching dyper to pid {service.pid} at {100 * args.budget:g}% budget ...")
        attach_args = argparse.Namespace(
            pid=service.pid,
            budget=args.budget,
            ceiling=None,
            duration=args.duration,
            monitor=None,
            window=10.0,
            quiet=False,
            output=args.output,
            metric="cpu",
            libraries=False,
        )
        return attach_cmd.run(attach_args)
    finally:
        service.terminate()
        try:
            service.wait(5)
        except subprocess.TimeoutExpired:
            service.kill()
