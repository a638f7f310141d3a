"""Run a program with dyper's agent and show where its time goes, live.

    dyper run [--budget 1%] [--duration S] [-o FILE] -- python app.py [args...]

Works for any command that starts Python: a script, ``-m module``, or a
console script such as gunicorn. Without --monitor the CLI hosts the monitor
and shows the live view until the program exits, --duration passes (the
program is then stopped) or Ctrl-C. With --monitor the agent streams to that
standing monitor instead; one off loopback takes CURVE keys (`dyper keys`):
--monitor-key, the monitor's public certificate, and --key, the agent's secret
one (default $DYPER_MONITOR_KEY and $DYPER_KEY).

SIGHUP sent to dyper run is passed on to the program; SIGTERM and Ctrl-C
stop the program (after a moment to exit by itself) and show the summary.
If dyper run itself is killed (SIGKILL, the OOM killer) the program keeps
running, as it would without dyper, and its agent detaches within a second
or so: it never streams on to a monitor that is gone. With --monitor the
agent stays with the standing monitor as long as the program runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from dyper.monitor.commands import (
    CliError,
    add_output_arguments,
    add_proflets_argument,
    add_trigger_arguments,
    budget_arg,
    chosen_proflets,
    duration_arg,
    standing_monitor,
    trigger_specs,
)
from dyper.monitor.embedded import Options, finish_output, profile_target
from dyper.monitor.server import Monitor

if TYPE_CHECKING:
    from dyper.agent import CurveKeys

NAME = "run"
AUTOSTART_DIR = str(Path(__file__).resolve().parent.parent / "autostart")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", type=budget_arg, default=0.01, help="overhead budget, e.g. 1%% (default 1%%)")
    parser.add_argument(
        "--ceiling", type=budget_arg, help="no later budget change or boost (agent.boost) may exceed this"
    )
    parser.add_argument("--duration", type=duration_arg, help="stop after this many seconds")
    parser.add_argument("--monitor", metavar="ENDPOINT", help="stream to a standing monitor (dyper monitor)")
    add_proflets_argument(parser)
    add_session_arguments(parser)
    # dest "program": "command" is where the CLI keeps the subcommand's name for its error lines
    parser.add_argument("program", metavar="command", nargs=argparse.REMAINDER, help="the program to run, after --")


#: How often a program not yet known to be Python has its process tree looked at.
LOOK_EVERY_S = 0.5


class Child:
    """The program we started."""

    ends_with_agent = False

    def __init__(self, proc: asyncio.subprocess.Process, log: Path | None, python: bool = False) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.log = log
        #: a Python process was seen in it (the command itself, or one it started)
        self.python = python
        self._looked = -math.inf

    def done(self) -> bool:
        if not self.python and time.monotonic() - self._looked >= LOOK_EVERY_S:
            self._looked = time.monotonic()
            self.python = any(is_python(pid) for pid in (self.pid, *_descendants(self.pid)))
        return self.proc.returncode is not None

    def not_python(self) -> bool:
        return not self.python

    async def finish(self, monitor: Monitor | None, reason: str) -> None:
        if self.done():
            return
        if reason == "duration" and monitor is not None:
            from dyper.monitor.embedded import detach_via

            await detach_via(monitor, self.pid)
        # Ctrl-C already reached the child through the terminal; give it a moment.
        grace = 3.0 if reason == "interrupted" else 0.0
        for sig, wait in ((None, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if sig is not None and self.proc.returncode is None:
                self.proc.send_signal(sig)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=wait)
                return
            except TimeoutError:
                continue


def is_python(pid: int) -> bool:
    """Whether process ``pid`` runs a Python interpreter (python, pypy, or a program embedding libpython: uwsgi)."""
    try:
        name = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    if "python" in name or "pypy" in name:
        return True
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return b"libpython" in f.read()
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def runs_python(path: str) -> bool:
    """Whether the file ``path`` (a resolved command) is surely Python: an interpreter, or a script run by one.

    False means "not known": a shell script or a wrapper (``uv run``, ``timeout``) may start Python later.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    if head.startswith(b"#!"):
        return b"python" in head.split(b"\n", 1)[0]
    name = os.path.basename(os.path.realpath(path))
    return head.startswith(b"\x7fELF") and ("python" in name or "pypy" in name)


def add_session_arguments(parser: argparse.ArgumentParser) -> None:
    """What run and attach both take: triggers, CURVE keys, the live view and the profile written at the end."""
    add_trigger_arguments(parser)
    add_key_arguments(parser)
    parser.add_argument("--window", type=duration_arg, help="live view over the last N seconds only")
    parser.add_argument("-q", "--quiet", action="store_true", help="no live view, only the final summary")
    add_output_arguments(parser)


def add_key_arguments(parser: argparse.ArgumentParser) -> None:
    """``--monitor-key`` and ``--key``: CURVE for a standing monitor (also ``dyper attach``'s)."""
    parser.add_argument(
        "--monitor-key",
        metavar="FILE",
        help="with --monitor: the monitor's public certificate (from `dyper keys`; default $DYPER_MONITOR_KEY)",
    )
    parser.add_argument(
        "--key",
        metavar="FILE",
        help="with --monitor: the agent's secret certificate (from `dyper keys`; default $DYPER_KEY)",
    )


def key_options(args: argparse.Namespace) -> tuple[CurveKeys | None, str | None, str | None]:
    """The CURVE keys for ``--monitor`` (``--monitor-key``/``--key``, else the environment) and their absolute paths.

    Checks the endpoint too: off loopback it needs them. Errors are CliErrors.
    """
    from dyper.agent import check_endpoint, load_keys

    given_monitor_key, given_key = getattr(args, "monitor_key", None), getattr(args, "key", None)
    if not args.monitor:
        if given_monitor_key or given_key:
            raise CliError("--monitor-key and --key go with --monitor (a standing monitor)", code=2)
        return None, None, None
    monitor_key = given_monitor_key or os.environ.get("DYPER_MONITOR_KEY") or None
    key = given_key or os.environ.get("DYPER_KEY") or None
    try:
        curve = load_keys(monitor_key, key)
        check_endpoint(args.monitor, curve=curve is not None)
    except ValueError as exc:
        raise CliError(str(exc), code=2) from None
    if curve is None:
        return None, None, None
    assert monitor_key is not None and key is not None
    return curve, os.path.abspath(os.path.expanduser(monitor_key)), os.path.abspath(os.path.expanduser(key))


def child_env(
    endpoint: str,
    budget: float,
    errfile: str | None = None,
    *,
    monitor_key: str | None = None,
    key: str | None = None,
    ceiling: float | None = None,
    triggers: list[dict[str, Any]] | None = None,
    monitor_pid: int | None = None,
    proflets: tuple[str, ...] | None = None,
) -> dict[str, str]:
    """The program's environment: what the agent's autostart reads (``monitor_pid``: a run-scoped monitor's)."""
    from dyper.agent.lifeline import ENV as MONITOR_PID

    env = dict(os.environ)
    env["DYPER_MONITOR"] = endpoint
    env["DYPER_BUDGET"] = repr(budget)
    if ceiling is not None:
        env["DYPER_CEILING"] = repr(ceiling)
    env.pop("DYPER_TRIGGERS", None)
    if triggers:
        env["DYPER_TRIGGERS"] = json.dumps(triggers)
    # Keys from our environment must not reach an agent meant to go without them.
    env.pop("DYPER_MONITOR_KEY", None)
    env.pop("DYPER_KEY", None)
    if monitor_key and key:
        env["DYPER_MONITOR_KEY"] = monitor_key
        env["DYPER_KEY"] = key
    env["PYTHONPATH"] = os.pathsep.join(p for p in (AUTOSTART_DIR, env.get("PYTHONPATH", "")) if p)
    if errfile:
        env["DYPER_ERRFILE"] = errfile
    if proflets is not None:
        env["DYPER_PROFLETS"] = ",".join(proflets)  # else $DYPER_PROFLETS as we found it
    # Ours only: an outer dyper run's tie must not make this agent leave with that one.
    env.pop(MONITOR_PID, None)
    if monitor_pid is not None:
        env[MONITOR_PID] = str(monitor_pid)
    return env


def _command(args: argparse.Namespace) -> list[str]:
    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError("give the program to run after --, e.g. dyper run -- python app.py", code=2)
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        raise CliError(f"{command[0]}: command not found", code=2)
    return command


def run(args: argparse.Namespace) -> int:
    command = _command(args)
    keys = key_options(args)  # before anything starts: a bad key or endpoint is a one-line error
    trigger_specs(args)  # so is a trigger it cannot read
    chosen_proflets(args)  # and a bad $DYPER_PROFLETS
    console = Console()
    if args.monitor:
        return _run_with_standing_monitor(args, command, console, keys)
    live = not args.quiet and console.is_terminal
    workdir = Path(tempfile.mkdtemp(prefix="dyper-run-"))
    errfile = str(workdir / "agent-errors.log")
    log = workdir / "output.log" if live else None

    async def start(endpoint: str) -> Child:
        out = open(log, "wb") if log is not None else None  # noqa: SIM115  closed with the child
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                env=child_env(
                    endpoint,
                    args.budget,
                    errfile,
                    ceiling=args.ceiling,
                    triggers=trigger_specs(args),
                    monitor_pid=os.getpid(),
                    proflets=chosen_proflets(args),
                ),
                stdout=out,
                stderr=out,
            )
        finally:
            if out is not None:
                out.close()
        # The loop's handlers go with the loop when asyncio.run ends.
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _pass_on, proc.pid, signal.SIGHUP)
        return Child(proc, log, python=runs_python(shutil.which(command[0]) or command[0]))

    options = Options(args.duration, args.output, args.metric, args.libraries, live, args.window)
    try:
        child, profile = asyncio.run(profile_target(start, options, console))
    except OSError as exc:
        raise CliError(f"cannot start {command[0]}: {exc}") from None
    assert isinstance(child, Child)
    if log is not None and log.exists():
        tail = log.read_bytes()[-4000:].decode(errors="replace")
        if tail.strip():
            console.print(f"[dim]program output (last lines; all of it in {log}):[/]")
            sys.stdout.write(tail if tail.endswith("\n") else tail + "\n")
    errors = Path(errfile).read_text() if os.path.exists(errfile) else ""
    if errors:
        sys.stderr.write(errors)
    if profile is None and child.not_python():
        if log is None:
            shutil.rmtree(workdir, ignore_errors=True)
        raise CliError(
            f"{command[0]} is not a Python program: no Python process started under it "
            "(dyper run profiles Python programs)",
            code=2,
        )
    try:
        finish_output(profile, options, console, child.pid)
    except RuntimeError as exc:
        raise CliError(str(exc)) from None
    if log is None:
        shutil.rmtree(workdir, ignore_errors=True)
    code = child.proc.returncode
    return 0 if code is None or code < 0 else code


def _pass_on(pid: int, sig: int) -> None:
    """Send ``sig`` to the program (a reload request, a hang-up): it is the program's to act on, not ours."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _run_with_standing_monitor(
    args: argparse.Namespace,
    command: list[str],
    console: Console,
    keys: tuple[CurveKeys | None, str | None, str | None],
) -> int:
    from dyper.monitor.client import MonitorRefused, MonitorUnreachable

    curve, monitor_key, key = keys
    with standing_monitor(args.monitor, curve=curve) as client:
        env = child_env(
            args.monitor,
            args.budget,
            monitor_key=monitor_key,
            key=key,
            ceiling=args.ceiling,
            triggers=trigger_specs(args),
            proflets=chosen_proflets(args),
        )
        proc = subprocess.Popen(command, env=env)
        signal.signal(signal.SIGHUP, lambda _sig, _frame: _pass_on(proc.pid, signal.SIGHUP))
        try:
            proc.wait(timeout=args.duration)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait()
        except KeyboardInterrupt:
            proc.wait()
        if args.output:
            from dyper.monitor.exports import exporter_for
            from dyper.monitor.model.profile import Profile

            try:
                data = client.call("profile", pid=proc.pid)
            except (MonitorRefused, MonitorUnreachable) as exc:
                raise CliError(f"cannot fetch the profile: {exc}") from None
            profile = Profile.from_json(data, f"monitor's profile of {proc.pid}")
            exporter_for(args.output, args.metric, args.libraries).write(profile, args.output)
            console.print(f"profile written to [bold]{args.output}[/]")
    return 0 if proc.returncode is None or proc.returncode < 0 else proc.returncode
