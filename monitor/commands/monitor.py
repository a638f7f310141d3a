"""Run a standing monitor (DYMON) that many agents stream to.

    dyper monitor [--listen tcp://127.0.0.1:7341] [--history FILE | --no-history]
                  [--retain-age 7d] [--retain-size 1GiB] [--http 127.0.0.1:8341 [--http-token T]]
    dyper monitor --listen tcp://0.0.0.0:7341 --curve-secret monitor.key_secret --authorized DIR
    dyper monitor --http 127.0.0.1:8341 --proflets all,-heap

Agents started with --monitor, DYPER_MONITOR or `dyper attach --monitor`
connect to it; `dyper top`, `dyper ps` and `dyper detach` query it. It
listens on loopback by default; profiles never leave the host unencrypted.
Stops on Ctrl-C or SIGTERM.

Off loopback it needs CURVE (keys made with `dyper keys`): --curve-secret is
the monitor's secret certificate, --authorized a directory holding the public
certificate (NAME.key) of each agent it lets in; agents pin the monitor's
public certificate (--monitor-key) and present their own secret one (--key).
Commands on this host (top, ps, budget, detach, ...) then use the control
endpoint it prints, which has no CURVE and only this user can reach (--control
to choose it: ipc://PATH or a loopback tcp:// address).

Everything it receives is kept in a SQLite file (default
$DYPER_HISTORY, else $XDG_STATE_HOME/dyper/history.sqlite3, that is
~/.local/state/dyper/history.sqlite3), so a restarted monitor still knows
every session and its reports, and old time windows can be exported and
compared (`dyper export PID --window START:END`). Reports older than
--retain-age go, and past --retain-size the oldest go first; a session's
whole-run totals stay as long as the session does.

With --http it also serves the web dashboard (processes, summaries, call
trees, bottleneck search and diagnosis, live) at the URL it prints. The
dashboard can attach to processes, so off loopback it needs a token:
--http-token, or one is made and printed in the URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from dyper.agent import DEFAULT_MONITOR, check_endpoint
from dyper.monitor.commands import CliError, add_proflets_argument, chosen_proflets
from dyper.monitor.history import DEFAULT_MAX_AGE_S, DEFAULT_MAX_BYTES, History, HistoryError, Retention, parse_size
from dyper.monitor.server import Monitor
from dyper.monitor.windows import parse_seconds

if TYPE_CHECKING:
    from dyper.monitor.curve import ServerKeys

NAME = "monitor"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        metavar="ENDPOINT",
        default=DEFAULT_MONITOR,
        help=f"where agents and clients connect (default {DEFAULT_MONITOR}); off loopback it needs CURVE",
    )
    parser.add_argument(
        "--curve-secret",
        metavar="FILE",
        help="the monitor's secret certificate (NAME.key_secret from `dyper keys`): agents must use CURVE",
    )
    parser.add_argument(
        "--authorized",
        metavar="DIR",
        help="with --curve-secret: the agents' public certificates (NAME.key) it lets in",
    )
    parser.add_argument(
        "--control",
        metavar="ENDPOINT",
        help="with --curve-secret: the endpoint without CURVE for this host's commands "
        "(default ipc://$XDG_RUNTIME_DIR/dyper/monitor-PORT.sock, else /tmp/dyper-UID/...)",
    )
    keep = parser.add_mutually_exclusive_group()
    keep.add_argument(
        "--history",
        metavar="FILE",
        help="keep what is received in this SQLite file (default $DYPER_HISTORY or "
        "~/.local/state/dyper/history.sqlite3)",
    )
    keep.add_argument("--no-history", action="store_true", help="keep nothing: a restart forgets every session")
    parser.add_argument(
        "--retain-age",
        type=_age_arg,
        default=DEFAULT_MAX_AGE_S,
        metavar="AGE",
        help="drop reports older than this, e.g. 12h, 30d, or 0 to keep them forever (default 7d)",
    )
    parser.add_argument(
        "--retain-size",
        type=_size_arg,
        default=DEFAULT_MAX_BYTES,
        metavar="SIZE",
        help="keep the history file under this, oldest reports going first, e.g. 500MB, 4GiB, "
        "or 0 for no bound (default 1GiB)",
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve the web dashboard here, e.g. 127.0.0.1:8341 (port 0: any free port); "
        "a host off loopback needs a token",
    )
    add_proflets_argument(parser, "with --http: the proflets of the processes the dashboard attaches to")
    parser.add_argument(
        "--http-token",
        metavar="TOKEN",
        help="the dashboard asks for this token (default: none on loopback, a random one otherwise)",
    )


def _age_arg(text: str) -> float | None:
    try:
        seconds = parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return seconds or None


def _size_arg(text: str) -> int | None:
    if text.strip() == "0":
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def http_options(http: str | None, token: str | None) -> tuple[str, int, str | None] | None:
    """``--http`` and ``--http-token`` checked: (host, port, token), a token made when off loopback."""
    if http is None:
        if token is not None:
            raise CliError("--http-token goes with --http", code=2)
        return None
    from dyper.monitor.web.server import is_loopback, parse_http

    try:
        host, port = parse_http(http)
    except ValueError as exc:
        raise CliError(str(exc), code=2) from None
    if token is None and not is_loopback(host):
        import secrets

        token = secrets.token_urlsafe(18)
    return host, port, token


def curve_options(args: argparse.Namespace) -> ServerKeys | None:
    """--listen with --curve-secret, --authorized and --control checked: the keys, or None for no CURVE."""
    given = args.curve_secret is not None or args.authorized is not None
    if not given:
        if args.control is not None:
            raise CliError("--control goes with --curve-secret and --authorized", code=2)
        try:
            check_endpoint(args.listen)
        except ValueError:
            raise CliError(
                f"listen endpoint {args.listen!r} is not on loopback and profiles would cross the network "
                "unencrypted: make keys with `dyper keys --name monitor` and `dyper keys --name agent-NAME`, "
                "then give --curve-secret monitor.key_secret --authorized DIR (holding each agent's .key)",
                code=2,
            ) from None
        return None
    if args.curve_secret is None or args.authorized is None:
        raise CliError("CURVE takes both --curve-secret FILE and --authorized DIR (see `dyper keys`)", code=2)
    if not args.listen.startswith("tcp://"):
        raise CliError("--curve-secret is for tcp:// endpoints; ipc:// is guarded by its file permissions", code=2)
    if args.control is not None:
        try:
            check_endpoint(args.control)
        except ValueError:
            raise CliError(
                f"--control {args.control!r} has no CURVE, so it must stay on this host: ipc://PATH or loopback",
                code=2,
            ) from None
    from dyper.monitor.curve import CurveError, load_server_keys

    try:
        return load_server_keys(args.curve_secret, args.authorized)
    except CurveError as exc:
        raise CliError(str(exc), code=2) from None


def run(args: argparse.Namespace) -> int:
    curve = curve_options(args)
    http = http_options(args.http, args.http_token)
    proflets = chosen_proflets(args)  # a bad $DYPER_PROFLETS is an error before anything listens
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
        elif kind in ("auth_rejected", "handshake_failed", "auth_error"):
            # escaped: a key in Z85 may hold "[" and "]", which rich takes for markup
            console.print(f"{stamp} [yellow]{escape(data['message'])}[/]", soft_wrap=True)

    history = None
    if not args.no_history:
        from dyper.monitor.history import default_path

        try:
            history = History(args.history or default_path(), Retention(args.retain_age, args.retain_size))
        except HistoryError as exc:
            raise CliError(str(exc)) from None
    try:
        monitor = Monitor(args.listen, on_event=on_event, history=history, curve=curve, control=args.control)
    except HistoryError as exc:
        if history is not None:
            history.close()
        raise CliError(str(exc)) from None
    try:
        endpoint = monitor.bind()
    except OSError as exc:
        monitor.close()
        raise CliError(f"{exc}: is another monitor running? (dyper ps --monitor {args.listen})") from None
    console.print(f"dyper monitor listening on {endpoint}; Ctrl-C to stop")
    if curve is not None:
        console.print(
            f"CURVE: {len(curve.keys)} authorized agent key(s) in {curve.authorized}; "
            f"commands on this host: --monitor {monitor.control_endpoint}",
            soft_wrap=True,
        )
    if history is not None:
        kept = f"{len(monitor.sessions)} session(s) from before" if monitor.sessions else "nothing yet"
        console.print(f"history in {history.path} ({history.retention.describe()}): {kept}")
    else:
        console.print("no history: a restart forgets every session")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        dashboard = None
        if http is not None:
            from dyper.monitor.web.server import Dashboard

            dashboard = Dashboard(monitor, *http)
            dashboard.proflets = proflets
            try:
                url = await dashboard.start()
            except OSError as exc:
                raise CliError(str(exc)) from None
            console.print(f"dashboard: [bold]{url}[/]", soft_wrap=True)
        try:
            await monitor.serve(stop)
        finally:
            if dashboard is not None:
                await dashboard.close()

    try:
        asyncio.run(main())
    finally:
        monitor.close()
    return 0
