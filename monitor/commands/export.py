"""Write a profile for another tool: speedscope, pprof, collapsed stacks, an HTML flame graph, or dyper's JSON.

    dyper export SOURCE -o FILE [--format FORMAT] [--last N | --window START:END]
                 [--metric cpu|wall] [--view threads|tasks] [--libraries] [--monitor ENDPOINT]

SOURCE is a saved dyper profile (.json), or (a number that is not a file)
the id of a process a standing monitor knows: running now, or one it kept
in its history (the newest session of that pid). For a process, --last N
takes the N seconds before its latest report, and --window START:END any
slice, each side one of (empty: the first / latest report)

    -N[s|m|h|d]            N before the latest report     --window=-10m:-5m
    N[s|m|h|d]             N after the first report       --window :30s
    @UNIX                  seconds since the epoch        --window @1730450000:
    YYYY-MM-DDTHH:MM[:SS]  local time                     --window 2026-11-01T10:00:2026-11-01T10:05

(Write --window=START:END with "=" when START begins with "-".) Windows
older than the monitor's last 10 minutes come from its history.

FORMAT (default: from FILE's name):
    speedscope  .speedscope.json  https://www.speedscope.app (drop the file on it), one profile per thread
    pprof       .pb.gz            gzipped protobuf: go tool pprof, pprof.me, Pyroscope
    collapsed   .collapsed        folded stacks: flamegraph.pl, inferno, speedscope, dyper bottlenecks
    html        .html             a flame graph in one file: open it in a browser, offline
    json        .json             dyper's own profile, which every dyper command reads
-o - writes to standard output.

--view tasks gives the asyncio task view (each task's await chain is its
stack; counts are ms of task time) of a PID, or of a profile saved by
`dyper run -o`, which carries it when the program showed asyncio tasks. It
is read with --metric wall unless told otherwise: waiting handlers are what
it is for, and cpu would show only the running task.
"""

from __future__ import annotations

import argparse
import os
import sys

from dyper.monitor.commands import (
    PING_TIMEOUT_S,
    CliError,
    add_metric_arguments,
    add_monitor_argument,
    add_view_argument,
    standing_monitor,
)
from dyper.monitor.exports import FORMATS, Exporter, exporter_for, exporter_named
from dyper.monitor.model.profile import Profile
from dyper.monitor.windows import WindowSpec, parse_seconds

NAME = "export"

#: How long reading the profile may take once the monitor answered (a window from a long history takes a while).
QUERY_TIMEOUT_S = 120.0


def _window_arg(text: str) -> WindowSpec:
    try:
        return WindowSpec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds_arg(text: str) -> float:
    try:
        seconds = parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("--last must be positive")
    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", help="a saved dyper profile (.json) or a PID")
    parser.add_argument("-o", "--output", metavar="FILE", required=True, help="where to write; - for stdout")
    parser.add_argument("-f", "--format", choices=FORMATS, help="default: from FILE's name")
    span = parser.add_mutually_exclusive_group()
    span.add_argument(
        "--last", type=_seconds_arg, metavar="N", help="with a PID: the last N seconds, e.g. 60, 5m or 2h"
    )
    span.add_argument(
        "--window", type=_window_arg, metavar="START:END", help="with a PID: a slice of its reports (see above)"
    )
    span.add_argument(
        "--trigger", type=int, metavar="N", help="with a PID: the window of its trigger event N (dyper triggers PID)"
    )
    parser.add_argument(
        "--normal", action="store_true", help="with --trigger: the window as long just before the event instead"
    )
    add_metric_arguments(parser, note=" (pprof and json carry both)")
    parser.add_argument("--tag", metavar="NAME", help="only the samples inside functions tagged NAME (agent.tag)")
    add_view_argument(parser)
    # Unset, the metric follows the view: cpu for threads, wall for tasks (see run).
    parser.set_defaults(metric=None)
    parser.add_argument(
        "--service",
        action="store_true",
        help="with a PID: the whole service it belongs to (a pre-fork master and its workers), merged; "
        "whole run or --last",
    )
    add_monitor_argument(parser, ", for PIDs")


def _spec(args: argparse.Namespace) -> WindowSpec | None:
    if args.window is not None:
        spec: WindowSpec = args.window
        return spec
    if args.last is not None:
        return WindowSpec.last(args.last)
    return None


def _from_monitor(args: argparse.Namespace, pid: int, spec: WindowSpec | None) -> Profile:
    from dyper.monitor.client import MonitorRefused, MonitorUnreachable

    call: dict[str, object] = {"pid": pid}
    if args.service:
        if args.window is not None:
            raise CliError("--service takes the whole run or --last N, not --window", code=2)
        call["service"] = True
        if args.last is not None:
            call["window_s"] = args.last
    elif spec is not None:
        call["window"] = spec.to_json()
    if args.view == "tasks":
        if args.service:
            raise CliError("--view tasks is of one process: leave out --service", code=2)
        call["view"] = "tasks"
    try:
        with standing_monitor(args.monitor, timeout_s=QUERY_TIMEOUT_S, ping_timeout_s=PING_TIMEOUT_S) as client:
            return Profile.from_json(client.call("profile", **call), f"pid {pid}")
    except (MonitorUnreachable, MonitorRefused, ValueError) as exc:
        raise CliError(str(exc)) from None


def _exporter(args: argparse.Namespace) -> Exporter:
    try:
        if args.format:
            return exporter_named(args.format, args.metric, args.libraries)
        if args.output == "-":
            raise CliError("give --format when writing to standard output", code=2)
        return exporter_for(args.output, args.metric, args.libraries)
    except ValueError as exc:
        raise CliError(f"{exc}, or give --format", code=2) from None


def saved_task_view(profile: Profile, source: str) -> Profile:
    """The task view a saved profile carries (``dyper run -o`` writes it when the program showed asyncio tasks).

    Raises :class:`CliError` when it has none.
    """
    from dyper.monitor.embedded import TASK_VIEW

    data = profile.proflets.get(TASK_VIEW)
    if not isinstance(data, dict):
        raise CliError(
            f"{source} carries no task view: the program showed no asyncio task, or the profile was written "
            "by an older dyper (or exported from a PID: export that PID with --view tasks)",
            code=2,
        )
    try:
        return Profile.from_json(data, f"{source} (task view)")
    except ValueError as exc:
        raise CliError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    if args.metric is None:
        # Tasks that wait are what the task view shows: with cpu, only the running one would.
        args.metric = "wall" if args.view == "tasks" else "cpu"
    exporter = _exporter(args)
    spec = _spec(args)
    source = args.source
    if args.normal and args.trigger is None:
        raise CliError("--normal goes with --trigger N", code=2)
    event = None
    if args.trigger is not None:
        if not (source.isdigit() and int(source) > 0) or args.service:
            raise CliError("--trigger N needs a PID (and not --service)", code=2)
        from dyper.monitor.commands.triggers import event_windows

        event, during, normal = event_windows(args.monitor, int(source), args.trigger)
        spec = normal if args.normal else during
    if os.path.exists(source):
        if spec is not None:
            raise CliError(
                "a saved profile has no time line: --last and --window need a PID (and, for old windows, "
                "a monitor with history)",
                code=2,
            )
        try:
            profile = Profile.load(source)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        what = source
        if args.view == "tasks":
            profile = saved_task_view(profile, source)
            what += ", task view (counts: ms of task time)"
    elif source.isdigit() and int(source) > 0:
        profile = _from_monitor(args, int(source), spec)
        what = ("the service of " if args.service else "") + f"pid {source}, "
        if event is not None:
            what += f"{'the window before ' if args.normal else ''}trigger event {event['id']} ({event['name']}), "
        what += spec.describe() if spec is not None else "whole run"
        if args.view == "tasks":
            what += ", task view (counts: ms of task time)"
    else:
        raise CliError(f"no such file: {source}")
    if args.tag is not None:
        try:
            profile = profile.with_tag(args.tag)
        except ValueError as exc:
            raise CliError(f"{exc} ({what})") from None
        what += f", tag {args.tag}"
    samples = profile.total(args.metric)
    if samples == 0:
        raise CliError(f"no {args.metric} samples in {what}: nothing written")
    data = exporter.encode(profile)
    if args.output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        try:
            with open(args.output, "wb") as f:
                f.write(data)
        except OSError as exc:
            raise CliError(f"cannot write {args.output}: {exc.strerror}") from None
        print(
            f"dyper export: wrote {args.output} ({exporter.format}, {samples:,} {args.metric} samples; {what})",
            file=sys.stderr,
        )
    return 0
