"""One module per ``dyper`` subcommand.

Each module defines ``NAME``, ``add_arguments(parser)`` and ``run(args) -> int``;
its docstring is the help text. Errors meant for the user are raised as
:class:`CliError` with a one-line message and the exit code.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dyper.agent import CurveKeys
    from dyper.monitor.client import MonitorClient
    from dyper.monitor.windows import WindowSpec

from dyper.agent.protocol import parse_budget

#: How long a command waits for the standing monitor's ping: a missing monitor is told in seconds.
PING_TIMEOUT_S = 3.0


class CliError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def standing_monitor(
    endpoint: str,
    *,
    curve: CurveKeys | None = None,
    timeout_s: float = 3.0,
    ping_timeout_s: float = PING_TIMEOUT_S,
) -> Iterator[MonitorClient]:
    """A client of the standing monitor at ``endpoint`` that has answered a ping (a CliError if none does).

    Its later calls wait up to ``timeout_s``: a window read from a long
    history may take a while, a missing monitor should not.
    """
    from dyper.monitor.client import MonitorClient, MonitorUnreachable

    with MonitorClient(endpoint, timeout=ping_timeout_s, curve=curve) as client:
        try:
            client.call("ping")
        except MonitorUnreachable as exc:
            raise CliError(str(exc)) from None
        client.timeout = timeout_s
        yield client


def through_monitor_or_inside(
    endpoint: str,
    pid: int,
    ask: Callable[[MonitorClient], bool],
    inside: Callable[[], bool],
    done: str,
    missing: str = "",
) -> int:
    """Control the agent in ``pid``: through the standing monitor, else straight inside the process.

    ``ask`` asks the monitor (True: it reached the agent); when no monitor
    answers or none knows the process, ``inside`` tells the agent in the
    process directly (True: one was running). Prints ``done``; with no
    agent, a CliError ending in ``missing``.
    """
    from dyper.monitor.attach import AttachError
    from dyper.monitor.client import MonitorClient, MonitorRefused, MonitorUnreachable

    try:
        with MonitorClient(endpoint, timeout=1.0) as client:
            if ask(client):
                print(done)
                return 0
    except (MonitorUnreachable, MonitorRefused):
        pass  # no monitor, or one that does not know the process: ask inside it
    try:
        running = inside()
    except AttachError as exc:
        raise CliError(str(exc)) from None
    if not running:
        raise CliError(f"no dyper agent is running in process {pid}{missing}")
    print(done)
    return 0


def budget_arg(text: str) -> float:
    try:
        return parse_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def pid_arg(text: str) -> int:
    try:
        pid = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id") from None
    if pid <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id")
    return pid


def duration_arg(text: str) -> float:
    try:
        value = float(text.rstrip("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"duration {text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("duration must be positive")
    return value


def window_arg(text: str) -> WindowSpec:
    """``--window``: N (the last N seconds, e.g. 90, 15m) or START:END, any slice (see ``dyper export -h``)."""
    from dyper.monitor.windows import WindowSpec, parse_seconds

    try:
        if ":" in text:
            return WindowSpec.parse(text)
        return WindowSpec.last(parse_seconds(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def endpoint_arg(text: str) -> str:
    """``--monitor``: a ZeroMQ endpoint this command can connect to, checked before ZeroMQ sees it."""
    from urllib.parse import urlsplit

    fix = "use tcp://HOST:PORT or ipc://PATH, e.g. tcp://127.0.0.1:7341"
    if text.startswith("ipc://") and len(text) > len("ipc://"):
        return text
    if not text.startswith("tcp://"):
        raise argparse.ArgumentTypeError(f"monitor endpoint {text!r}: {fix}")
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or not 0 < port < 65536 or parts.path not in ("", "/"):
        raise argparse.ArgumentTypeError(f"monitor endpoint {text!r} needs a host and a port from 1 to 65535: {fix}")
    return text


def add_view_argument(parser: argparse.ArgumentParser) -> None:
    """``--view threads|tasks``: the threads' stacks, or asyncio tasks' await chains as stacks."""
    parser.add_argument(
        "--view",
        choices=("threads", "tasks"),
        default="threads",
        help="with a PID: tasks for the asyncio task view (each task's await chain is its stack, so time "
        "spent awaiting shows; counts are ms of task time), threads for the threads' stacks (default)",
    )


def add_monitor_argument(parser: argparse.ArgumentParser, what: str = "") -> None:
    """``--monitor ENDPOINT``: the standing monitor a command asks (default the agent's default)."""
    from dyper.agent import DEFAULT_MONITOR

    parser.add_argument(
        "--monitor",
        metavar="ENDPOINT",
        type=endpoint_arg,
        default=DEFAULT_MONITOR,
        help=f"the standing monitor{what} (default {DEFAULT_MONITOR})",
    )


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the profile when done; format by extension: .speedscope.json, .pb.gz (pprof), .html "
        "(flame graph), .collapsed, .json",
    )
    add_metric_arguments(parser)


def add_metric_arguments(parser: argparse.ArgumentParser, *, metric: bool = True, note: str = "") -> None:
    """``--metric cpu|wall`` (``metric``; ``note`` ends its help) and ``--libraries``: how a profile is read."""
    if metric:
        parser.add_argument(
            "--metric",
            choices=("cpu", "wall"),
            default="cpu",
            help="cpu leaves out samples of threads blocked in sleep/lock/I/O calls (default); wall keeps them" + note,
        )
    parser.add_argument(
        "--libraries",
        action="store_true",
        help="charge time inside the standard library and installed packages to the calling application line",
    )


def proflets_arg(text: str) -> tuple[str, ...]:
    """``--proflets``: the entries (names, all, -NAME, +NAME); see :func:`proflets.parse_selection`."""
    from dyper.proflets import parse_selection

    try:
        return parse_selection(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: Options whose value may begin with "-" (``--proflets -heap``), which argparse would take for an option.
DASH_VALUED = ("--proflets",)


def glue_leading_dash(words: list[str]) -> list[str]:
    """``--proflets -heap`` as ``--proflets=-heap``, before ``--`` only (what follows is the program's)."""
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return out + words[i:]
        if word in DASH_VALUED and i + 1 < len(words) and words[i + 1].startswith("-") and words[i + 1] != "--":
            out.append(f"{word}={words[i + 1]}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def add_proflets_argument(parser: argparse.ArgumentParser, what: str = "the proflets to run") -> None:
    """``--proflets LIST``, the one way ``run``, ``attach`` and ``monitor`` choose proflets (see chosen_proflets)."""
    from dyper.proflets import BUILTINS, SELECTION_HELP

    parser.add_argument(
        "--proflets",
        metavar="LIST",
        type=proflets_arg,
        help=f"{what}: {SELECTION_HELP} (default $DYPER_PROFLETS, which takes the same; else the default set: "
        f"every built-in proflet, {', '.join(BUILTINS)}, the budget choosing which details when)",
    )


def chosen_proflets(args: argparse.Namespace) -> tuple[str, ...] | None:
    """The proflets ``--proflets`` or else ``$DYPER_PROFLETS`` choose, as entries; None: the agent's default set.

    Bad syntax in ``$DYPER_PROFLETS`` is a CliError, as in ``--proflets`` an
    argparse error: before anything starts. A name no proflet installed here
    has gets a warning, not an error: the target's interpreter may have
    plug-ins this one lacks (its agent reports one it lacks too, as off).
    """
    import os
    import sys

    from dyper.proflets import ENV, available, unknown

    entries: tuple[str, ...] | None = getattr(args, "proflets", None)
    if entries is None and ENV in os.environ:
        try:
            entries = proflets_arg(os.environ[ENV])
        except argparse.ArgumentTypeError as exc:
            raise CliError(f"${ENV}: {exc}", code=2) from None
    if entries is None:
        return None
    missing = unknown(entries)
    if missing and not getattr(args, "_warned_proflets", False):
        args._warned_proflets = True
        print(
            f"dyper: no proflet called {', '.join(missing)} is installed here (there are "
            f"{', '.join(available(None))}); the agent will say whether the target has one",
            file=sys.stderr,
        )
    return tuple(entries)


def add_trigger_arguments(parser: argparse.ArgumentParser) -> None:
    """--trigger (repeatable) and --triggers FILE: conditions that catch transient problems (agent.triggers)."""
    parser.add_argument(
        "--trigger",
        action="append",
        metavar="COND",
        help="catch a transient: e.g. 'cpu > 80%% for 10s', 'rss > 2GB', 'rss + 50MB/s', 'blocked > 5s', "
        "'mark:NAME', with options ', before 20s, after 30s, budget 10%%' (repeatable; see dyper triggers -h)",
    )
    parser.add_argument("--triggers", metavar="FILE", help="triggers from a TOML file (see dyper triggers -h)")


def trigger_specs(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """The triggers --trigger and --triggers give, as plain data for the agent; None without any.

    Raises :class:`CliError` (one line) for one it cannot read, before anything is attached.
    """
    from dyper.agent.triggers import MAX_TRIGGERS, load_file, parse_trigger

    specs = []
    try:
        if getattr(args, "triggers", None):
            specs.extend(load_file(args.triggers))
        specs.extend(parse_trigger(text) for text in getattr(args, "trigger", None) or ())
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if len(specs) > MAX_TRIGGERS:
        raise CliError(f"{len(specs)} triggers: at most {MAX_TRIGGERS}")
    return [s.to_json() for s in specs] or None
