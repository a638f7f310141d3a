"""The dashboard and ``dyper report --json`` agree: one builder, one report, one number and one name.

A monitor holds one process fed with synthetic reports (in-process: no socket,
no subprocess). For the same window, the control path's ``report`` op (what
``dyper report PID --json`` prints) and the dashboard's summary (``/api/summary``)
must give the same lights and the same cpu rows.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from dyper.agent import protocol
from dyper.agent.protocol import LOC_BLOCKING
from dyper.monitor.model.frames import Frame
from dyper.monitor.model.lights import cpu_light
from dyper.monitor.model.profile import Profile, StackCount, cpu_functions
from dyper.monitor.report import report_of
from dyper.monitor.server import Monitor
from dyper.monitor.session import Session
from dyper.monitor.web.server import Dashboard
from dyper.proflets.cpu.analyzer import CpuAnalyzer

PID = 4242
HELLO: dict[str, Any] = {
    "agent": f"h:{PID}:a",
    "host": "h",
    "pid": PID,
    "start_time": 100.0,
    "argv": ["python", "app.py"],
    "python": "3.11.7",
    "budget": 0.01,
    "cpus": 2,
    "paths": {"stdlib": "/usr/lib/python3.11"},
}


def _report(seq: int, hot: int, sleeping: int) -> dict[str, Any]:
    """main -> hot (app.py) on the CPU ``hot`` times, main asleep ``sleeping`` times; a cpu call burst."""
    return {
        "agent": HELLO["agent"],
        "seq": seq,
        "epoch": 0,
        "t": 1000.0 + seq,
        "window_s": 1.0,
        "strings": [[0, "/app/app.py"], [1, "main"], [2, "hot"], [3, "other"]],
        "locs": [[0, 0, 1, 1, 2, 0], [1, 0, 2, 10, 11, 0], [2, 0, 1, 1, 3, LOC_BLOCKING], [3, 0, 3, 20, 21, 0]],
        "stacks": [[7, hot, [1, 0]], [8, sleeping, [2]], [7, 2, [3, 0]]],
        "samples": hot + 2 + sleeping,
        "threads": [[7, "MainThread"], [8, "sleeper"]],
        "spent_s": 0.001 * seq,
        "elapsed_s": 1.0 * seq,
        "budget": 0.01,
        "details": [
            {"proflet": "cpu", "t": 1000.0 + seq, "length_s": 0.5, "fixed_s": 0.0, "slowdown_s": 0.0,
             "functions": [["/app/app.py", "hot", 10, 50 * seq]]}
        ],
    }  # fmt: skip


def _monitor() -> tuple[Monitor, Session]:
    monitor = Monitor("tcp://127.0.0.1:0")  # not started: no socket is opened
    session = Session(("h", PID, 100.0), HELLO, monitor.frames)
    state = session.add_agent(HELLO)
    for seq in range(1, 13):
        session.ingest(state, _report(seq, hot=20 + seq, sleeping=10))
    monitor.sessions[session.key] = session
    return monitor, session


def _cli_report(monitor: Monitor, **args: Any) -> dict[str, Any]:
    """What ``dyper report PID --json`` prints: the monitor's answer to the report op."""
    reply = monitor._on_ctl(b"cli", {"id": 1, "op": "report", "args": {"pid": PID, **args}})
    assert reply is not None
    _, body = protocol.decode(reply, max_containers=1 << 20)
    assert body["ok"], body
    result: dict[str, Any] = body["result"]
    return result


def _dashboard_summary(monitor: Monitor, session: Session, window: str) -> dict[str, Any]:
    dashboard = Dashboard(monitor)  # not started: no socket is opened
    return asyncio.run(dashboard.summary(session, window))


@pytest.mark.parametrize(("cli_args", "window"), [({}, ""), ({"window_s": 5.0}, "-5s:")])
def test_the_dashboard_and_dyper_report_agree(cli_args: dict[str, Any], window: str) -> None:
    monitor, session = _monitor()
    cli = _cli_report(monitor, **cli_args)
    web = _dashboard_summary(monitor, session, window)
    # every proflet's light, not only the cpu one, and the same numbers
    assert len(cli["status"]) > 1 and "cpu" in cli["status"]
    assert web["status"] == cli["status"]
    assert web["findings"] == cli["findings"] and web["off"] == cli["off"]
    assert web["proflets"]["cpu"] == cli["proflets"]["cpu"]
    assert set(web["proflets"]) == set(cli["proflets"])
    rows = {r["name"]: r for r in cli["proflets"]["cpu"]["functions"]}
    # the cpu light is the busy share: cpu samples per sampling pass, over the whole run
    busy = sum(20 + s + 2 for s in range(1, 13)) / sum(20 + s + 2 + 10 for s in range(1, 13))
    assert cli["status"]["cpu"]["problem"] == pytest.approx(busy, abs=1e-3)
    # the cpu rows, named once; calls where detailing counted them
    hot = rows["hot"]
    assert {"self_s", "total_s", "calls", "calls_per_s", "counted_s", "s_per_call"} <= set(hot)
    assert hot["calls_per_s"] == pytest.approx(sum(50 * s for s in range(1, 13)) / (0.5 * 12))
    assert hot["calls"] == round(hot["calls_per_s"] * cli["process"]["duration_s"])
    assert rows["other"]["calls"] is None and rows["other"]["s_per_call"] is None
    if window:
        assert cli["process"]["duration_s"] == pytest.approx(5.0)


def test_cpu_rows_carry_seconds_from_the_sampling_interval_and_calls_from_detailing() -> None:
    frames = [Frame("/app/main.py", "main", 1, 2), Frame("/app/main.py", "a", 5, 6), Frame("/app/main.py", "b", 9, 10)]
    stacks = [StackCount(1, (0, 1), 30, 30), StackCount(1, (0, 2), 10, 10)]
    profile = Profile(frames, stacks, {1: "MainThread"}, {"window_s": 10.0, "samples": 40})
    rows = {r["name"]: r for r in cpu_functions(profile, {("/app/main.py", "a", 5): (100.0, 2.0)})}
    a = rows["a"]
    assert a["self_s"] == pytest.approx(30 * 10.0 / 40) and a["total_s"] == pytest.approx(30 * 10.0 / 40)
    assert a["calls"] == 1000 and a["counted_s"] == 2.0 and a["s_per_call"] == pytest.approx(a["total_s"] / 1000)
    assert rows["b"]["calls"] is None and rows["b"]["s_per_call"] is None


def test_a_bare_profile_s_report_has_the_analyzer_s_cpu_light() -> None:
    # A saved profile without the proflets' sections: the light is the same busy share.
    frames = [Frame("/app/main.py", "main", 1, 2)]
    profile = Profile(frames, [StackCount(1, (0,), 50, 30)], {1: "MainThread"}, {"duration_s": 5.0, "samples": 50})
    assert report_of(profile)["status"]["cpu"] == cpu_light(30, 50).to_json()


def test_cpu_seconds_of_a_thread_come_from_its_clock_and_never_pass_the_time_sampled() -> None:
    # Issue 30: two threads, each always on a CPU or ready for one, 10 s sampled
    # 100 times. Thread 1 ran "a" 3 s by its clock, thread 2 ran "b" 6 s. A cpu
    # sample of a thread waiting for the GIL still counts: each pass's worth
    # (0.1 s) would give "a" 10 s.
    frames = [Frame("/app/main.py", "a", 5, 6), Frame("/app/main.py", "b", 9, 10)]
    stacks = [StackCount(1, (0,), 100, 100), StackCount(2, (1,), 100, 100)]
    process = {"window_s": 10.0, "samples": 100}
    threads = {"threads": [{"ident": 1, "run_s": 3.0, "gil_pct": 70.0}, {"ident": 2, "run_s": 6.0, "gil_pct": 40.0}]}
    profile = Profile(frames, stacks, {1: "one", 2: "two"}, process, proflets={"results": {"threads": threads}})
    rows = {r["name"]: r for r in report_of(profile)["proflets"]["cpu"]["functions"]}
    assert rows["a"]["self_s"] == pytest.approx(3.0) and rows["a"]["total_s"] == pytest.approx(3.0)
    assert rows["b"]["self_s"] == pytest.approx(6.0)
    # The timing proflet's clocks serve as well; a clock above the time sampled is capped at it.
    timing = {"threads": [{"ident": 1, "cpu_s": 3.0}, {"ident": 2, "cpu_s": 20.0}]}
    profile = Profile(frames, stacks, {1: "one", 2: "two"}, process, proflets={"results": {"timing": timing}})
    rows = {r["name"]: r for r in report_of(profile)["proflets"]["cpu"]["functions"]}
    assert rows["a"]["self_s"] == pytest.approx(3.0) and rows["b"]["self_s"] == pytest.approx(10.0)
    # Without clocks (the threads proflet off in the agent): the pass's worth, as before.
    no_clocks = {"threads": [{"ident": 1, "run_s": 0.0, "gil_pct": None}]}
    profile = Profile(frames, stacks, {1: "one", 2: "two"}, process, proflets={"results": {"threads": no_clocks}})
    rows = {r["name"]: r for r in report_of(profile)["proflets"]["cpu"]["functions"]}
    assert rows["a"]["self_s"] == pytest.approx(10.0)


def test_no_call_counted_is_no_rate_not_zero_per_second() -> None:
    session = types.SimpleNamespace(calls={("/app/main.py", "a", 5): [0.0, 4.0], ("/app/main.py", "b", 9): [8.0, 2.0]})
    session.calls_per_s = lambda: {k: n / s for k, (n, s) in session.calls.items()}
    rates = {(r["name"]): r["calls_per_s"] for r in CpuAnalyzer(session).results()["call_rates"]}
    assert rates == {"b": 4.0}  # "a" ran across the bursts without a call beginning in them


def test_a_proflet_off_or_not_yet_run_is_said_never_shown_as_zeros() -> None:
    # Issue 30: timing not asked for showed "cores used 0.00 on 1 processors".
    # Here the agent runs cpu, threads and memory; memory has detailed
    # nothing yet and sent nothing; heap was switched off in the target.
    running = {"ovhd_ms": 1.0, "slow": 0.0, "itvl_ms": 500.0, "prty": 0.5, "allows": [], "detailing": False}
    monitor = Monitor("tcp://127.0.0.1:0")  # not started: no socket is opened
    session = Session(("h", PID, 100.0), HELLO, monitor.frames)
    state = session.add_agent(HELLO)
    for seq in range(1, 4):
        report = _report(seq, hot=20, sleeping=10)
        report["proflets"] = {
            "cpu": running,
            "threads": running,
            "memory": running,
            "heap": {"off": "the heap census needs gc.get_objects"},
        }
        report["delays"] = {"sample": 0.01, "report": 1.0, "detail.memory": 40.0}
        session.ingest(state, report)
    monitor.sessions[session.key] = session
    cli = _cli_report(monitor)
    off = cli["off"]
    assert off["timing"].startswith("not running: not among the proflets asked for"), off
    assert off["heap"] == "not running: the heap census needs gc.get_objects", off
    assert off["memory"] == "no data yet, 3 s of 40 before its first detailing", off
    for name in ("timing", "heap", "memory", "memory_stacks"):
        assert name not in cli["proflets"] and name not in cli["status"], name
    # the basic analyses from the samples stay
    assert {"cpu", "threads", "io"} <= set(cli["proflets"]) and {"cpu", "threads"} <= set(cli["status"])
    # the dashboard and dyper top say the same
    assert _dashboard_summary(monitor, session, "")["off"] == off
    from dyper.monitor.views import top_view

    assert top_view(session)["off"] == off
    # and dyper report's text
    import io

    from rich.console import Console

    from dyper.monitor.commands.report import render

    out = io.StringIO()
    render(cli, Console(file=out, width=300), 10)
    assert "memory: no data yet, 3 s of 40 before its first detailing" in out.getvalue()
    assert "timing: not running" in out.getvalue() and "cores used" not in out.getvalue()
