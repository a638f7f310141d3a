"""Pause, resume, reset and marks: the agent's side with a real agent thread, the monitor's with real reports.

The agent tests run a real :class:`agent.core.Agent` (its thread, its ticker)
in this process against a ZeroMQ ROUTER on loopback standing in for the
monitor, with a thread keeping the GIL busy as an application would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from dyper.agent import protocol
from dyper.agent.core import Agent
from dyper.monitor.profile import build_profile
from dyper.monitor.report import report_of
from tests.factories import make_report, session_with


class Monitor:
    """A ROUTER in the monitor's place: it takes the agent's reports and can send it a configure."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.ident: bytes | None = None
        self.reports: list[dict[str, Any]] = []

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                continue
            ident, data = self.sock.recv_multipart()
            msg_type, body = protocol.decode(data, protocol.MONITOR_ACCEPTS)
            self.ident = ident
            if msg_type == protocol.REPORT:
                self.reports.append(body)

    def until(self, what: str, check: Callable[[], bool], timeout: float = 15.0) -> None:
        end = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < end, f"timed out waiting for {what}"
            self.pump(0.1)

    def configure(self, body: dict[str, Any]) -> None:
        assert self.ident is not None
        self.sock.send_multipart([self.ident, protocol.encode(protocol.CONFIGURE, body)])

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


@pytest.fixture
def rig(request: pytest.FixtureRequest) -> Iterator[tuple[Agent, Monitor]]:
    ceiling = getattr(request, "param", None)
    monitor = Monitor()
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(i * i for i in range(300))

    worker = threading.Thread(target=busy, daemon=True)
    worker.start()
    a = Agent(monitor.endpoint, 0.05, ceiling=ceiling, proflets=())
    a.start()
    try:
        yield a, monitor
    finally:
        a.stop()
        stop.set()
        worker.join()
        monitor.close()


def _marks(reports: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m[1], m[2]) for r in reports for m in r.get("marks") or ()]


def test_a_paused_agent_takes_no_samples_says_so_and_takes_them_again_on_resume(rig):
    a, monitor = rig
    monitor.until("samples", lambda: a.samples_taken >= 20)
    a.mark("before the pause")
    a.pause()
    monitor.until("a report saying paused", lambda: any(r.get("paused") for r in monitor.reports))
    assert not a.ticker  # the ticker is stopped: nothing of ours runs in the application's threads
    taken = a.samples_taken
    monitor.pump(1.5)
    assert a.samples_taken == taken
    assert ("before the pause", "mark") in _marks(monitor.reports)
    assert ("pause", "pause") in _marks(monitor.reports)

    a.resume()
    monitor.until("samples after the resume", lambda: a.samples_taken >= taken + 20)
    monitor.until("a report saying resumed", lambda: not monitor.reports[-1].get("paused"))
    assert ("resume", "resume") in _marks(monitor.reports)


def test_a_paused_agent_takes_its_gc_callback_out_and_puts_it_back_on_resume():
    # The memory proflet's callback runs in whichever thread collects: paused,
    # nothing of ours may run in the application's threads.
    import gc

    from dyper.proflets.memory.collector import MemoryCollector

    monitor = Monitor()
    memory = MemoryCollector()
    a = Agent(monitor.endpoint, 0.05, proflets=(memory,))
    a.start()
    try:
        watch = memory._watch
        assert watch is not None
        monitor.until("the first report", lambda: bool(monitor.reports))
        a.pause()
        monitor.until("a report saying paused", lambda: any(r.get("paused") for r in monitor.reports))
        assert watch._callback not in gc.callbacks and not watch.watching
        watched = watch.watched_s()
        monitor.pump(1.0)
        assert watch.watched_s() == watched and watch._callback not in gc.callbacks  # no pass put it back
        a.resume()
        monitor.until("the watch back", lambda: watch._callback in gc.callbacks)
    finally:
        a.stop()
        monitor.close()
    assert memory._watch is None or memory._watch._callback not in gc.callbacks


def test_the_monitor_pauses_and_resets_through_configure(rig):
    a, monitor = rig
    monitor.until("a report", lambda: bool(monitor.reports))
    monitor.configure({"paused": True})
    monitor.until("a report saying paused", lambda: bool(monitor.reports[-1].get("paused")))
    assert a.paused and not a.ticker
    monitor.configure({"paused": False, "reset": True})
    # The counts from before the reset go first, in a report without the mark; the mark comes next.
    monitor.until("the reset mark", lambda: ("reset", "reset") in _marks(monitor.reports))
    with_mark = next(i for i, r in enumerate(monitor.reports) if ("reset", "reset") in _marks([r]))
    assert with_mark >= 1 and not monitor.reports[with_mark].get("paused")
    assert not a.paused


@pytest.mark.parametrize("rig", [0.1], indirect=True)
def test_a_boost_raises_the_budget_up_to_the_ceiling_for_its_time_then_returns(rig):
    a, monitor = rig
    monitor.until("a report", lambda: bool(monitor.reports))
    asked = time.monotonic()
    a.boost(0.25, 1.5)
    monitor.until("the boost", lambda: a.budget == 0.1)  # 25% asked, the ceiling is 10%
    monitor.until("the end of the boost", lambda: a.budget == 0.05)
    assert time.monotonic() - asked >= 1.5  # not before its time (the agent starts it after it is asked)
    monitor.until("the marks", lambda: [k for _, k in _marks(monitor.reports)].count("boost") == 2)
    # A budget change during a boost stands: the boost does not return to the old one.
    a.boost(0.08, 1.0)
    monitor.until("the second boost", lambda: a.budget == 0.08)
    a.set_budget(0.02)
    monitor.pump(1.5)
    assert a.budget == 0.02


def test_marks_past_the_limit_drop_the_oldest_and_are_counted():
    from dyper.agent.core import MAX_PENDING_MARKS

    a = Agent("tcp://127.0.0.1:9", 0.01, proflets=())  # never started: marks only queue
    for i in range(MAX_PENDING_MARKS + 5):
        a.mark(f"m{i}")
    assert len(a._marks) == MAX_PENDING_MARKS
    assert a._marks[0][1] == "m5"  # the oldest went first
    assert a.dropped["marks"] == 5


def test_the_protocol_takes_marks_and_pause_and_refuses_bad_ones():
    report = dict(make_report([(7, 3, [1, 0])]), paused=True, marks=[[1000.0, "deploy", "mark"]])
    assert protocol.decode(protocol.encode(protocol.REPORT, report))[1]["marks"] == [[1000.0, "deploy", "mark"]]
    for bad in ([[1000.0, 5, "mark"]], [["x", "deploy", "mark"]], "deploy"):
        with pytest.raises(protocol.DecodeError):
            protocol.decode(protocol.encode(protocol.REPORT, dict(report, marks=bad)))
    with pytest.raises(protocol.DecodeError):
        protocol.decode(protocol.encode(protocol.CONFIGURE, {"paused": "yes"}))


def test_a_reset_starts_the_whole_run_afresh_and_the_windows_keep_the_old():
    before = make_report([(7, 30, [1, 0]), (7, 10, [2, 1, 0])], seq=0, t=1000.0)
    before["elapsed_s"] = 10.0
    after = make_report([(7, 5, [2, 1, 0])], seq=1, t=1004.0, with_tables=False)
    after.update(elapsed_s=14.0, window_s=4.0, marks=[[1000.5, "reset", "reset"], [1002.0, "deploy", "mark"]])
    s = session_with(before, after)

    assert s.samples == 5
    assert s.reset_t == 1000.5
    assert s.duration_s() == pytest.approx(4.0)  # the agent's 14 s less the 10 s before the reset
    p = build_profile(s)
    assert {f["name"]: f["self"] for f in p.functions("cpu") if f["self"]} == {"g": 5}
    # The windows still hold the report before the reset: a slice over it shows f.
    assert sum(w.samples for w in s.windows) == 45
    report = report_of(p)["process"]
    assert report["reset_t"] == 1000.5
    assert [(m["name"], m["kind"]) for m in report["marks"]] == [("reset", "reset"), ("deploy", "mark")]

    # History keeps the reset: a restored session has the same whole run.
    from dyper.monitor.session import FrameTable, Session

    restored = Session.restore(s.key, s.hello, FrameTable(), s.snapshot(), {})
    assert restored.duration_s() == pytest.approx(4.0)
    assert restored.reset_t == 1000.5
    assert len(restored.marks) == 2


def test_the_module_calls_check_their_arguments_and_do_nothing_without_an_agent():
    from dyper import agent

    assert not agent.is_running()
    for bad in (("200%", 5), ("5%", 0), ("5%", 3601), ("five", 5)):
        with pytest.raises(ValueError):
            agent.boost(*bad)
    agent.boost("5%", 5)  # no agent here: nothing to raise
    agent.pause()
    agent.resume()
    agent.reset()
    agent.mark("nobody listens")
    assert not agent.is_running()


def test_a_predicate_trigger_splits_the_report_boosts_to_the_ceiling_and_reports_at_its_end():
    from dyper.agent.triggers import TriggerSpec

    # At 0.1% reports come every 30 s after the first: the event's "before" falls inside the window.
    monitor = Monitor()
    a = Agent(monitor.endpoint, 0.001, ceiling=0.1, proflets=())
    a.start()
    try:
        monitor.until("the first report", lambda: bool(monitor.reports))
        fire = threading.Event()
        a.add_trigger(TriggerSpec(kind="predicate", name="backlog", before_s=1.0, after_s=1.5), fire.is_set)
        monitor.pump(2.5)  # checks with nothing to see: the ring has its cuts
        fire.set()
        monitor.until("the event", lambda: any(r.get("triggers") for r in monitor.reports))
        at = next(i for i, r in enumerate(monitor.reports) if r.get("triggers"))
        (event,) = monitor.reports[at]["triggers"]
        assert (event["name"], event["kind"], event["budget"]) == ("backlog", "predicate", 0.1)
        # The report was split: the part before ends at the last cut (a second apart) at or before
        # the event's "before", and the event's report follows it at once.
        before, during = monitor.reports[at - 1], monitor.reports[at]
        assert at >= 2 and before["seq"] + 1 == during["seq"]
        # (Cuts a second apart, late by up to half a second under load; unsplit, this would be the first
        # report, which at >= 2 rules out.)
        assert event["t"] - 1.0 - 1.5 <= before["t"] <= event["t"] - 1.0 + 0.05, (before["t"], event["t"])
        assert during["window_s"] >= 1.0
        monitor.until("the boost to the ceiling", lambda: a.budget == 0.1)
        monitor.until("the end of the event", lambda: a.budget == 0.001)
        # A report goes when the "after" ends, so the event's window ends on one.
        monitor.until("the report at its end", lambda: any(abs(r["t"] - (event["t"] + 1.5)) < 0.3
                                                            for r in monitor.reports[at + 1 :]))  # fmt: skip
        assert ("backlog: the predicate held", "trigger") in _marks(monitor.reports)
    finally:
        a.stop()
        monitor.close()


def test_a_failure_in_the_triggers_switches_them_off_and_sampling_goes_on(rig, monkeypatch):
    from dyper.agent.triggers import Triggers, TriggerSpec

    a, monitor = rig

    def broken(self: Triggers, now: float, skip: frozenset[int] = frozenset()) -> list[Any]:
        raise RuntimeError("planted")

    monkeypatch.setattr(Triggers, "check", broken)
    monitor.until("a report", lambda: bool(monitor.reports))
    a.add_trigger(TriggerSpec(kind="predicate", name="never"), lambda: False)
    monitor.until(
        "the error in a report", lambda: any("triggers: RuntimeError: planted" in e for r in monitor.reports
                                             for e in r.get("errors") or ())
    )  # fmt: skip
    taken = a.samples_taken
    monitor.until("samples after it", lambda: a.samples_taken >= taken + 20)
    assert a.alive and a.triggers is None
