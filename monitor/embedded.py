"""Profiling one target from the CLI: live view until it ends, then the result.

``dyper run`` and ``dyper attach`` share this driver. Without ``--monitor``
it hosts a monitor on a random loopback port inside the CLI process, shows
the live view while the target runs, and at the end (program exit,
``--duration``, Ctrl-C) collects the last report, writes ``-o`` and prints
a summary. With ``--monitor`` the views come from the standing monitor.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from dyper.agent import protocol
from dyper.monitor.exports import exporter_for
from dyper.monitor.model.profile import FLOOR_PCT, Profile
from dyper.monitor.profile import build_profile
from dyper.monitor.server import Monitor
from dyper.monitor.services import service_of
from dyper.monitor.session import Session
from dyper.monitor.views import render_top, render_waiting, service_top_view, top_view

#: How long to wait for an agent's last report and bye at the end.
FINAL_REPORT_WAIT_S = 3.0
REFRESH_S = 1.0
#: With no agent heard from and no Python process in sight this long, the view says the program may not be Python.
NOT_PYTHON_NOTE_S = 5.0

#: The key of a saved profile's proflet sections that holds its task view (a profile's JSON), when the
#: program showed asyncio tasks: what `dyper export FILE --view tasks` reads.
TASK_VIEW = "task_view"


class Target(Protocol):
    pid: int
    #: the command is about the agent, not the process: once its agent is gone (``dyper detach PID``
    #: from outside), there is nothing left to show (dyper attach), where dyper run waits for its program
    ends_with_agent: bool

    def done(self) -> bool: ...

    def not_python(self) -> bool:
        """True while no Python process has been seen in it (so no agent can come), False once one was."""
        ...

    async def finish(self, monitor: Monitor | None, reason: str) -> None: ...


@dataclass
class Options:
    duration: float | None = None
    output: str | None = None
    metric: str = "cpu"
    libraries: bool = False
    live: bool = True
    window_s: float | None = None


def _session(monitor: Monitor, pid: int) -> Session | None:
    session = monitor.session_for(pid)
    if session is None and len(monitor.sessions) == 1:
        # `dyper run -- sh -c "python app.py"`: the Python process is a child
        # of the one we started; show whichever process reported.
        session = next(iter(monitor.sessions.values()))
    return session


async def profile_target(
    start: Callable[[str], Awaitable[Target]],
    options: Options,
    console: Console,
    *,
    beside: Callable[[Monitor], contextlib.AbstractAsyncContextManager[object]] | None = None,
) -> tuple[Target, Profile | None]:
    """Host a monitor, start the target against it, show it live, finish it.

    ``beside(monitor)`` is entered once the monitor serves and left when it
    stops: what else runs on its loop for as long (``dyper demo``'s dashboard).
    """
    monitor = Monitor("tcp://127.0.0.1:0")
    endpoint = monitor.bind()
    stop = asyncio.Event()
    server = asyncio.create_task(monitor.serve(stop))
    extra = contextlib.AsyncExitStack()
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, interrupted.set)
        loop.add_signal_handler(signal.SIGTERM, interrupted.set)
    target: Target | None = None
    try:
        if beside is not None:
            await extra.enter_async_context(beside(monitor))
        target = await start(endpoint)
        began = time.monotonic()
        reason = await _watch(monitor, target, options, console, interrupted, began)
        if reason == "detached":
            console.print(f"dyper: the agent in process {target.pid} was detached from outside (dyper detach); ending")
        await target.finish(monitor, reason)
        if not (_session(monitor, target.pid) is None and target.not_python()):
            await _await_final_reports(monitor, target.pid)
        session = _session(monitor, target.pid)
        if session is None:
            return target, None
        service = service_of(monitor.sessions.values(), session)
        # A pre-fork server: the master and its workers, merged (the master alone is mostly idle).
        profile = build_profile(service) if len(service.members) > 1 else build_profile(session, proflets=True)
        if len(service.members) == 1:
            # A saved profile carries its task view too: `dyper export FILE --view tasks` reads it.
            with contextlib.suppress(ValueError):
                profile.proflets[TASK_VIEW] = build_profile(session, view="tasks").to_json()
        return target, profile
    finally:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGINT)
            loop.remove_signal_handler(signal.SIGTERM)
        await extra.aclose()
        stop.set()
        await server
        monitor.close()


async def _watch(
    monitor: Monitor,
    target: Target,
    options: Options,
    console: Console,
    interrupted: asyncio.Event,
    began: float,
) -> str:
    """Show the live view until the target ends, the duration passes or Ctrl-C."""
    heard = False
    noted = False
    live = None
    if options.live and console.is_terminal:
        from rich.live import Live

        live = Live(
            render_waiting("waiting for the agent's first report", began),
            console=console,
            refresh_per_second=4,
            transient=True,
        )
        live.start()
    try:
        while True:
            if target.done():
                return "exited"
            if interrupted.is_set():
                return "interrupted"
            if options.duration is not None and time.monotonic() - began >= options.duration:
                return "duration"
            if target.ends_with_agent:
                session = monitor.session_for(target.pid)
                # Once it said hello: the monitor marks it disconnected on its bye (or when the process is gone).
                heard = heard or (session is not None and session.connected)
                if heard and session is not None and not session.connected:
                    return "detached"
            waiting = "waiting for the agent's first report"
            late = time.monotonic() - began >= NOT_PYTHON_NOTE_S
            if late and _session(monitor, target.pid) is None and target.not_python():
                waiting = "no Python process has started under the program: is it a Python program? (Ctrl-C stops)"
                if live is None and not noted:
                    console.print(f"dyper: {waiting}")
                    noted = True
            if live is not None:
                view = live_view(monitor, target.pid, options)
                if view is not None:
                    live.update(render_top(view, title=_title(options)))
                else:
                    live.update(render_waiting(waiting, began))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(interrupted.wait(), timeout=0.25 if live is None else REFRESH_S / 2)
    finally:
        if live is not None:
            live.stop()


def live_view(monitor: Monitor, pid: int, options: Options) -> dict[str, Any] | None:
    """The live view of ``pid``, or of its whole service when it has forked workers that report too."""
    session = _session(monitor, pid)
    if session is None or not session.reports:
        return None
    service = service_of(monitor.sessions.values(), session)
    if len(service.members) > 1:
        return service_top_view(service, options.window_s, charge_libraries=options.libraries)
    return top_view(session, options.window_s, charge_libraries=options.libraries)


def _title(options: Options) -> str:
    window = f"last {options.window_s:.0f}s" if options.window_s else "whole run"
    return f"top functions by self cpu ({window}); Ctrl-C to stop"


async def _await_final_reports(monitor: Monitor, pid: int) -> None:
    """Wait (bounded) for the last report and bye of ``pid`` and of the rest of its service."""
    deadline = time.monotonic() + FINAL_REPORT_WAIT_S
    while time.monotonic() < deadline:
        session = _session(monitor, pid)
        if session is not None and not any(m.connected for m in service_of(monitor.sessions.values(), session).members):
            return
        await asyncio.sleep(0.05)


async def detach_via(monitor: Monitor, pid: int) -> bool:
    """Ask the agents of ``pid`` to detach; True once they said bye."""
    if monitor.send_to_pid(pid, protocol.DETACH, {}) == 0:
        return False
    deadline = time.monotonic() + FINAL_REPORT_WAIT_S
    while time.monotonic() < deadline:
        session = monitor.session_for(pid)
        if session is not None and not session.connected:
            return True
        await asyncio.sleep(0.05)
    return False


def finish_output(profile: Profile | None, options: Options, console: Console, pid: int) -> None:
    """Write ``-o`` and print the summary table."""
    if profile is None or not profile.stacks:
        console.print(f"[yellow]dyper: no samples were received from process {pid}[/]")
        if options.output:
            raise RuntimeError("no profile to write: the agent sent no samples")
        return
    if options.output:
        exporter = exporter_for(options.output, options.metric, options.libraries)
        exporter.write(profile, Path(options.output))
    view = summary_view(profile, options)
    console.print(render_top(view, title="summary: top functions by self " + options.metric))
    if options.output:
        console.print(f"profile written to [bold]{options.output}[/]")


def summary_view(profile: Profile, options: Options) -> dict[str, Any]:
    rows = profile.functions(options.metric, charge_libraries=options.libraries, floor_pct=FLOOR_PCT)
    p = profile.process
    duration = float(p.get("duration_s") or 0.0)
    view: dict[str, Any] = {
        "session": {
            "pid": p.get("pid"),
            "argv": p.get("argv", []),
            "connected": False,
            "ended": True,
            "samples": p.get("samples", 0),
            "budget": p.get("budget", 0.0),
            "overhead": p.get("overhead", 0.0),
            "sampler": p.get("sampler"),
            "errors": [],
        },
        "samples_per_s": (p.get("samples", 0) / duration) if duration > 0 else 0.0,
        "cpu_samples": profile.total("cpu"),
        "wall_samples": profile.total("wall"),
        "functions": rows[:20],
        "dropped": p.get("dropped", {}),
    }
    members = p.get("processes") or []
    if len(members) > 1:
        view["service"] = {
            "name": p.get("service", ""),
            "processes": len(members),
            "connected": 0,
            "members": members,
        }
    return view
