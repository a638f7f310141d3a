"""List the Python processes on this host: attached? monitored?

    dyper ps [--monitor ENDPOINT] [--json]

attached: dyper's sampler thread runs in the process. monitored: the
standing monitor at ENDPOINT is receiving its reports.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from dyper.agent import DEFAULT_MONITOR
from dyper.agent.core import THREAD_NAME
from dyper.monitor.client import MonitorClient, MonitorUnreachable
from dyper.monitor.commands import CliError, endpoint_arg

NAME = "ps"
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?[a-z]*$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--monitor",
        metavar="ENDPOINT",
        type=endpoint_arg,
        help=f"the standing monitor to ask about monitored processes (default {DEFAULT_MONITOR}; "
        "given, it must answer)",
    )
    parser.add_argument("--json", action="store_true", help='[{"pid", "argv", "attached", "monitored"}]')


def is_python(proc: psutil.Process) -> bool:
    try:
        exe = os.path.basename(proc.exe())
    except (psutil.Error, OSError):
        exe = ""
    if _PYTHON.match(exe):
        return True
    try:
        cmdline = proc.cmdline()
    except psutil.Error:
        return False
    return bool(cmdline) and bool(_PYTHON.match(os.path.basename(cmdline[0])))


def has_agent(pid: int) -> bool:
    """True if a thread of ``pid`` carries the sampler's OS-level name."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() == THREAD_NAME:
                    return True
    except OSError:
        pass
    return False


def python_processes(monitored: set[int]) -> list[dict[str, Any]]:
    rows = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me or not is_python(proc):
            continue
        try:
            argv = proc.cmdline()
        except psutil.Error:
            continue
        rows.append(
            {"pid": proc.pid, "argv": argv, "attached": has_agent(proc.pid), "monitored": proc.pid in monitored}
        )
    return rows


def run(args: argparse.Namespace) -> int:
    monitored: set[int] = set()
    reachable = True
    endpoint = args.monitor or DEFAULT_MONITOR
    try:
        with MonitorClient(endpoint, timeout=1.0) as client:
            monitored = {s["pid"] for s in client.call("sessions") if s["connected"]}
    except MonitorUnreachable:
        reachable = False
    rows = python_processes(monitored)
    # The list is printed either way; a monitor the user named and that does not answer is an error.
    unknown = f"no dyper monitor answers at {endpoint}: 'monitored' is unknown; start one with `dyper monitor`"
    if args.monitor:
        unknown += " or leave out --monitor"
    if args.json:
        print(json.dumps(rows))
        if not reachable and args.monitor:
            raise CliError(unknown)
        return 0
    console = Console()
    table = Table(header_style="bold", title="Python processes on this host")
    for col in ("pid", "attached", "monitored", "command"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            str(r["pid"]),
            "yes" if r["attached"] else "no",
            "yes" if r["monitored"] else "no",
            " ".join(r["argv"])[:100],
        )
    console.print(table)
    if not reachable:
        if args.monitor:
            raise CliError(unknown)
        console.print(f"[dim]{unknown}[/]")
    return 0
