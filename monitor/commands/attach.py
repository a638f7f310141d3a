"""Attach dyper's agent to a running Python process: no restart, no code change.

    dyper attach PID [--budget 1%] [--duration S] [-o FILE]
    dyper attach PID --monitor tcp://127.0.0.1:7341
    dyper attach PID --monitor tcp://HOST:7341 --monitor-key monitor.key --key agent.key_secret
    dyper attach PID --children        # a pre-fork master and its running workers

Without --monitor the CLI hosts the monitor, shows the live view and, when
--duration passes, the process exits or you press Ctrl-C, detaches cleanly
and writes -o; a `dyper detach PID` from elsewhere ends it too (it says so).
If dyper attach itself is killed, the agent notices its monitor is gone and
detaches (not into another pid namespace: there it stays until `dyper
detach PID`). With --monitor the agent streams to that standing monitor and
stays until `dyper detach PID`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from typing import TYPE_CHECKING, Any

from rich.console import Console

from dyper.monitor.attach import Attached, AttachError, attach
from dyper.monitor.commands import (
    CliError,
    add_proflets_argument,
    budget_arg,
    chosen_proflets,
    duration_arg,
    pid_arg,
    standing_monitor,
    trigger_specs,
)
from dyper.monitor.commands.run import add_session_arguments, key_options
from dyper.monitor.embedded import Options, detach_via, finish_output, profile_target
from dyper.monitor.server import Monitor

if TYPE_CHECKING:
    from dyper.agent import CurveKeys

NAME = "attach"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=pid_arg, help="process id of a running CPython 3.11+ process")
    parser.add_argument("--budget", type=budget_arg, default=0.01, help="overhead budget, e.g. 1%% (default 1%%)")
    parser.add_argument("--ceiling", type=budget_arg, help="no later budget change may exceed this")
    add_proflets_argument(parser)
    parser.add_argument(
        "--children",
        action="store_true",
        help="also attach to PID's running child processes (a pre-fork server's workers); "
        "workers forked later get the agent from the master",
    )
    parser.add_argument("--duration", type=duration_arg, help="detach after this many seconds")
    parser.add_argument("--monitor", metavar="ENDPOINT", help="stream to a standing monitor and return")
    add_session_arguments(parser)


class AttachedProcess:
    ends_with_agent = True

    def __init__(self, pid: int, children: tuple[int, ...] = ()) -> None:
        self.pid = pid
        self.children = children

    def done(self) -> bool:
        return not os.path.exists(f"/proc/{self.pid}")

    def not_python(self) -> bool:
        return False  # attach checked that it is a CPython before it went in

    async def finish(self, monitor: Monitor | None, reason: str) -> None:
        if reason == "detached":
            pids: tuple[int, ...] = self.children  # the main agent is gone already: no debugger needed for it
        else:
            pids = (self.pid, *self.children)
        await asyncio.gather(*(self._detach(pid, monitor) for pid in pids))

    @staticmethod
    async def _detach(pid: int, monitor: Monitor | None) -> None:
        if not os.path.exists(f"/proc/{pid}"):
            return
        if monitor is not None and await detach_via(monitor, pid):
            return
        # The agent did not answer over the socket: stop it from inside.
        from dyper.monitor.attach import detach

        with contextlib.suppress(AttachError):
            await asyncio.to_thread(detach, pid)


def child_pids(pid: int) -> list[int]:
    """``pid``'s running descendants (a pre-fork master's workers and theirs), oldest first."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [c.pid for c in sorted(children, key=lambda c: c.pid)]


def _our_pid_for(pid: int) -> int | None:
    """This process's id as ``pid`` sees it, for the agent's tie to our monitor (agent.lifeline).

    None when ``pid`` is in another pid namespace (a container): there our
    number names another process, or none. Its agent then outlives a
    ``dyper attach`` killed with SIGKILL, as a standing monitor's would.
    """
    try:
        same = os.stat("/proc/self/ns/pid").st_ino == os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None
    return os.getpid() if same else None


def attach_all(
    pids: list[int],
    endpoint: str,
    args: argparse.Namespace,
    console: Console,
    keys: tuple[str | None, str | None] = (None, None),
    *,
    scoped: bool = False,
) -> tuple[list[Attached], list[str]]:
    """Attach to each of ``pids`` at once (each attach waits on its own debugger); the errors, one per pid.

    ``scoped``: the monitor is this process's own (run-scoped), the agents leave when it ends.
    """
    from concurrent.futures import ThreadPoolExecutor

    def one(pid: int) -> Attached | str:
        try:
            return attach(
                pid,
                endpoint,
                args.budget,
                ceiling=args.ceiling,
                proflets=chosen_proflets(args),
                monitor_key=keys[0],
                key=keys[1],
                triggers=trigger_specs(args),
                monitor_pid=_our_pid_for(pid) if scoped else None,
            )
        except AttachError as exc:
            return f"child {pid}: {exc}"

    with ThreadPoolExecutor(max_workers=min(8, len(pids) or 1)) as pool:
        results = list(pool.map(one, pids))
    attached = [r for r in results if isinstance(r, Attached)]
    errors = [r for r in results if isinstance(r, str)]
    return attached, errors


def run(args: argparse.Namespace, *, beside: Any = None) -> int:
    """``beside``: see :func:`monitor.embedded.profile_target` (the demo's dashboard)."""
    keys = key_options(args)
    trigger_specs(args)  # a trigger it cannot read is an error before anything is attached
    chosen_proflets(args)  # so is a bad $DYPER_PROFLETS
    console = Console()
    if args.monitor:
        return _attach_to_standing(args, console, keys)

    async def start(endpoint: str) -> AttachedProcess:
        try:
            await asyncio.to_thread(
                attach,
                args.pid,
                endpoint,
                args.budget,
                ceiling=args.ceiling,
                proflets=chosen_proflets(args),
                triggers=trigger_specs(args),
                monitor_pid=_our_pid_for(args.pid),
            )
        except AttachError as exc:
            raise CliError(str(exc)) from None
        if not args.children:
            return AttachedProcess(args.pid)
        attached, errors = await asyncio.to_thread(
            attach_all, child_pids(args.pid), endpoint, args, console, scoped=True
        )
        _say_children(console, args.pid, attached, errors)
        return AttachedProcess(args.pid, tuple(a.pid for a in attached))

    live = not args.quiet and console.is_terminal
    options = Options(args.duration, args.output, args.metric, args.libraries, live, args.window)
    target, profile = asyncio.run(profile_target(start, options, console, beside=beside))
    try:
        finish_output(profile, options, console, target.pid)
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    return 0


def _say_children(console: Console, pid: int, attached: list[Attached], errors: list[str]) -> None:
    if attached or errors:
        console.print(f"attached to {len(attached)} of {len(attached) + len(errors)} child processes of {pid}")
    else:
        console.print(f"process {pid} has no child processes: attached to it alone")
    for line in errors:
        console.print(f"[yellow]{line}[/]")


def _attach_to_standing(
    args: argparse.Namespace, console: Console, keys: tuple[CurveKeys | None, str | None, str | None]
) -> int:
    import time

    curve, monitor_key, key = keys
    with standing_monitor(args.monitor, curve=curve) as client:
        try:
            attached = attach(
                args.pid,
                args.monitor,
                args.budget,
                ceiling=args.ceiling,
                proflets=chosen_proflets(args),
                monitor_key=monitor_key,
                key=key,
                triggers=trigger_specs(args),
            )
        except AttachError as exc:
            raise CliError(str(exc)) from None
        children: list[Attached] = []
        if args.children:
            children, errors = attach_all(child_pids(args.pid), args.monitor, args, console, (monitor_key, key))
            _say_children(console, args.pid, children, errors)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            sessions = client.call("sessions")
            if any(s["pid"] == args.pid and s["connected"] for s in sessions):
                break
            time.sleep(0.1)
        else:
            raise CliError(f"agent started in {args.pid} but the monitor at {args.monitor} has not heard from it")
    if children:
        console.print(f"`dyper top --service {args.pid}` shows the master and its workers merged")
    console.print(
        f"attached to {args.pid} (Python {attached.python}), streaming to {args.monitor} "
        f"at {100 * args.budget:g}% budget; `dyper top {args.pid}` to watch, `dyper detach {args.pid}` to stop"
    )
    return 0
