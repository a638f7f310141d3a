"""Search a profile for bottlenecks by hand, with suggesters, zooming, labels and overlap (BOTTLENECKS).

    dyper bottlenecks SOURCE [--compare BASE] [--metric cpu|wall] [--window N|START:END]
    dyper bottlenecks SOURCE -c 'suggest; select 0; label hot' [--json]

A SOURCE (and BASE) is a saved dyper profile (.json), a collapsed-stack file
(dyper's, py-spy's or Austin's `a;b;c 42` lines, root first), or (a number that
is not a file) the id of a process a standing monitor knows: its whole run, or
a --window of it: the last N seconds, or START:END, older parts read from the
monitor's history (see `dyper export -h`). With --compare the search runs on SOURCE minus BASE:
what costs more in SOURCE than in BASE, normalised by total samples (BASE's
counts scaled to SOURCE's total, so that each percentage is SOURCE's share
less BASE's share, as pprof's -normalize does); --raw subtracts the counts as
they are.

Without -c, an interactive prompt (type help); with -c the commands, separated
by `;`, run in order and the command exits (1 if one of them failed). With
--json each command's result is one JSON object in a list printed at the end;
the keys are documented in monitor/search/repl.py. Names are functions,
`qualname (file)`; with --lines, lines, `qualname (file:line)`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Literal

from rich.console import Console

from dyper.monitor.commands import CliError, add_metric_arguments, add_monitor_argument, add_view_argument, window_arg
from dyper.monitor.model.profile import Profile
from dyper.monitor.search.calltree import CallTreeProfile
from dyper.monitor.search.comparative import ComparativeProfile
from dyper.monitor.search.interface import ProfileInterface
from dyper.monitor.search.repl import Result, SearchSession, prompt_loop, render
from dyper.monitor.windows import WindowSpec

NAME = "bottlenecks"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", help="a profile file (.json, collapsed) or a PID")
    parser.add_argument("--compare", metavar="BASE", help="search SOURCE minus BASE (a file or a PID)")
    parser.add_argument(
        "--raw",
        action="store_true",
        help="with --compare: subtract raw counts instead of normalising by total samples",
    )
    parser.add_argument("-c", "--commands", metavar="CMDS", help="run these commands (separated by ;) and exit")
    parser.add_argument("--json", action="store_true", help="print the commands' results as one JSON list")
    add_metric_arguments(parser, note="; collapsed files carry one count")
    parser.add_argument("--lines", action="store_true", help="one name per line instead of per function")
    parser.add_argument(
        "--trigger",
        type=int,
        metavar="N",
        help="with a PID: the window of its trigger event N, against (unless --compare) the window as long "
        "just before it (dyper triggers PID)",
    )
    parser.add_argument(
        "--window",
        type=window_arg,
        help="with a PID: the last N seconds (e.g. 90, 15m), or START:END, any slice its monitor kept "
        "(see dyper export -h)",
    )
    add_view_argument(parser)
    # Unset, the metric follows the view: cpu for threads, wall for tasks (waiting tasks are its point).
    parser.set_defaults(metric=None)
    add_monitor_argument(parser, ", for PIDs")


@dataclass
class Source:
    """A profile as read: dyper's own (with wall and cpu counts) or a collapsed file's call tree."""

    label: str
    kind: Literal["pid", "profile", "collapsed"]
    profile: Profile | None = None
    collapsed: CallTreeProfile | None = None

    #: multiplies the counts (a window sampled at another rate than the one it is compared with)
    scale: float = 1.0
    #: brought to the sampling rate of what it is compared with (a trigger's window before the event)
    per_second: bool = False

    def call_tree(
        self, metric: Literal["cpu", "wall"], *, lines: bool = False, libraries: bool = False
    ) -> CallTreeProfile:
        if self.collapsed is not None:
            return self.collapsed
        assert self.profile is not None
        return CallTreeProfile.from_profile(
            self.profile,
            metric,
            frame_key="frame" if lines else "function",
            charge_libraries=libraries,
            scale=self.scale,
        )


def read_source(
    text: str, *, monitor: str, window: WindowSpec | None = None, lines: bool = False, view: str = "threads"
) -> Source:
    """A file (dyper JSON or collapsed, told apart by content) or a PID asked of the standing monitor.

    Raises :class:`CliError` with a one-line message.
    """
    if os.path.exists(text):
        try:
            with open(text, encoding="utf-8") as f:
                content = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read {text}: {getattr(exc, 'strerror', None) or exc}") from None
        if text.endswith(".json") or content.lstrip().startswith("{"):
            try:
                data = json.loads(content)
            except ValueError as exc:
                raise CliError(f"{text} is not JSON: {exc}") from None
            try:
                profile = Profile.from_json(data, text)
            except ValueError as exc:
                raise CliError(str(exc)) from None
            if view == "tasks":
                from dyper.monitor.commands.export import saved_task_view

                return Source(f"{text} (task view)", "profile", profile=saved_task_view(profile, text))
            return Source(text, "profile", profile=profile)
        tree = CallTreeProfile.from_collapsed(content, frame_key="frame" if lines else "function")
        stats = tree.collapsed_stats
        if stats is not None and stats.malformed:
            print(
                f"dyper: {text}: skipped {stats.malformed} malformed line(s), e.g. {stats.malformed_examples[0]!r}",
                file=sys.stderr,
            )
        if tree.total() == 0:
            raise CliError(f"{text} has no samples (expected collapsed stacks: `a;b;c 42` lines)")
        return Source(text, "collapsed", collapsed=tree)
    if text.isdigit() and int(text) > 0:
        from dyper.monitor.client import MonitorClient, MonitorRefused, MonitorUnreachable

        call_args: dict[str, Any] = {"pid": int(text)}
        if window is not None:
            call_args["window"] = window.to_json()
        if view == "tasks":
            call_args["view"] = "tasks"
        try:
            with MonitorClient(monitor, timeout=10.0) as client:
                data = client.call("profile", **call_args)
        except (MonitorUnreachable, MonitorRefused) as exc:
            raise CliError(str(exc)) from None
        try:
            return Source(f"pid {text}", "pid", profile=Profile.from_json(data, f"pid {text}"))
        except ValueError as exc:
            raise CliError(str(exc)) from None
    raise CliError(f"no such file: {text}")


def run(args: argparse.Namespace) -> int:
    if args.metric is None:
        args.metric = "wall" if args.view == "tasks" else "cpu"
    pids = [s for s in (args.source, args.compare) if s is not None and not os.path.exists(s)]
    if args.window and not pids:
        raise CliError("--window applies to a PID source")
    if args.trigger is not None:
        if args.window is not None or not (args.source.isdigit() and not os.path.exists(args.source)):
            raise CliError("--trigger N needs a PID source, and no --window")
        from dyper.monitor.commands.triggers import event_windows

        _, args.window, normal = event_windows(args.monitor, int(args.source), args.trigger)
        if args.compare is None:
            # The event against the normal window just before it: what the transient costs.
            source = read_source(
                args.source, monitor=args.monitor, window=args.window, lines=args.lines, view=args.view
            )
            base = read_source(args.source, monitor=args.monitor, window=normal, lines=args.lines, view=args.view)
            base.label = f"pid {args.source} before trigger {args.trigger}"
            base.per_second = True
            source.label = f"pid {args.source} trigger {args.trigger}"
            # The event ran at a raised budget, so it has more samples per second:
            # the normal window (as long) is brought to its rate before the difference.
            assert source.profile is not None and base.profile is not None
            passes = float(source.profile.process.get("samples") or 0)
            base_passes = float(base.profile.process.get("samples") or 0)
            if base_passes > 0:
                base.scale = passes / base_passes
                base.label += f" (counts x{base.scale:.2f}: the event's sampling rate)"
            return _search(args, source, base)
    source = read_source(args.source, monitor=args.monitor, window=args.window, lines=args.lines, view=args.view)
    compared = None
    if args.compare is not None:
        compared = read_source(args.compare, monitor=args.monitor, window=args.window, lines=args.lines, view=args.view)
    return _search(args, source, compared)


def _search(args: argparse.Namespace, source: Source, base: Source | None) -> int:
    tree = source.call_tree(args.metric, lines=args.lines, libraries=args.libraries)
    profile: ProfileInterface[Any] = tree
    described: dict[str, Any] = {"source": source.label, "metric": args.metric, "lines": args.lines}
    if base is not None:
        # A trigger's event against the window before it is brought to the event's sampling rate (per
        # second): what the event costs more is its point, which scaling to its total would hide.
        per_second = base.per_second
        comparative = ComparativeProfile(
            tree,
            base.call_tree(args.metric, lines=args.lines, libraries=args.libraries),
            normalize=not args.raw and not per_second,
        )
        profile = comparative
        described["compare"] = base.label
        described["normalization"] = "per second" if per_second and not args.raw else comparative.normalization
        if comparative.normalization != "raw":
            described["scale"] = round(comparative.b_scale, 6)
    elif tree.total() == 0:
        raise CliError(f"{source.label} has no {args.metric} samples")
    session: SearchSession[Any] = SearchSession(profile, described)
    console = Console()
    results: list[Result]
    if args.commands is not None:
        results = []
        for line_result in session.run_script(args.commands):
            results.append(line_result)
            if not args.json and not (line_result["ok"] and line_result["kind"] == "quit"):
                console.print(render(line_result))
    elif not sys.stdin.isatty():
        results = session.run_script(sys.stdin.read())
        if not args.json:
            for r in results:
                console.print(render(r))
    else:
        what = f"{source.label} minus {described['compare']}" if "compare" in described else source.label
        if "compare" in described:
            what += f" ({_normalization_text(described)})"
        console.print(f"[bold]dyper bottlenecks[/]: {what}, total {profile.total():,} samples; type help")
        results = prompt_loop(session, console, emit=(lambda r: None) if args.json else None)
    if args.json:
        if "compare" in described:
            # Each result says how its numbers were made (the --json list keeps its shape).
            results = [{**r, "normalization": described["normalization"]} if r["ok"] else r for r in results]
        print(json.dumps(results))
    elif "compare" in described and args.commands is not None:
        console.print(f"[dim]{source.label} minus {described['compare']}: {_normalization_text(described)}[/]")
    return 0 if all(r["ok"] for r in results) else 1


def _normalization_text(described: dict[str, Any]) -> str:
    if described.get("normalization") == "raw":
        return "raw counts subtracted; percentages of the difference's total"
    if described.get("normalization") == "per second":
        return "normalised per second: the window before the event at the event's sampling rate"
    return (
        f"normalised by total samples: the base's counts x{described.get('scale', 1.0):g}, "
        "percentages are differences of shares"
    )
