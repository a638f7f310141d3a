"""DYMON's scheduling end to end: a real monitor, the agent in this process, real detailing bursts.

Checked through the ledger and the monitor's state, never through timing
guesses: the spend the agent's guard records stays within the budget (up to
the one operation in flight), the monitor's requests reach the agent, the
burst results come back, and the agent takes over when the monitor goes.
"""

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import zmq

from dyper import agent
from dyper.agent import protocol
from dyper.agent.proflet import Collector, DetailContext
from tests.factories import MonitorThread, free_port, wait_for


def hot(n: int) -> int:
    total = 0
    for i in range(n):
        total += i % 3
    return total


def _busy_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    """Run CPU work in this thread (so there is something to detail) until ``predicate`` holds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for _ in range(20):
            hot(2000)
        if predicate():
            return
    raise AssertionError(f"timed out waiting for {what}")


def _busy_for(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hot(2000)


def _within_budget(a: Any) -> None:
    elapsed = a.clock() - a.guard.started
    assert a.guard.spent_s <= a.budget * elapsed + a.max_op_s + 1e-3, (a.guard.spent_s, elapsed, a.max_op_s)


def test_monitor_schedules_cpu_detailing_and_the_call_counts_arrive(monitor_thread):
    m = monitor_thread.monitor
    agent.start(monitor_thread.endpoint, "10%", proflets=("cpu",))
    try:
        a = agent._agent
        assert a is not None

        def counted() -> bool:
            s = m.session_for(os.getpid())
            return s is not None and any(name == "hot" for (_, name, _), rate in s.calls_per_s().items() if rate > 0)

        _busy_until(counted, timeout=40, what="call counts of hot() from a detailing burst")
        session = m.session_for(os.getpid())
        state = next(iter(session.agents.values()))
        schedule = m.schedules[state.agent_id]
        # The first bursts may be the agent's own (it keeps its schedule until
        # the monitor's first request): wait for a burst the monitor asked for.
        _busy_until(lambda: schedule.requests >= 1 and a._monitor_requests, timeout=30, what="the monitor's request")
        asked = a.bursts_total
        # bursts_total counts bursts that ended. Not "and no burst runs now": on 3.11
        # the frame hook's call bursts are cheap enough at 10% to follow one another.
        _busy_until(lambda: a.bursts_total > asked, timeout=30, what="a burst after the request")
        assert state.mode == "monitor"  # the agent was following the monitor's timings
        assert a.scheduler.delays == {}  # ... and bursts only when asked
        assert session.costs["detail"] > 0  # its cost was charged and reported
        assert a.proflets_off == {}
        _within_budget(a)
    finally:
        agent.stop()


def test_agent_schedules_on_its_own_when_the_monitor_goes():
    mt = MonitorThread()
    agent.start(mt.endpoint, "10%", proflets=("cpu",))
    try:
        a = agent._agent
        assert a is not None
        _busy_until(lambda: a._monitor_plan is not None, timeout=20, what="the monitor's plan")
        mt.close()
        _busy_until(lambda: a._monitor_plan is None, timeout=20, what="the agent to notice the monitor is gone")
        before = a.bursts_total
        _busy_until(lambda: a.bursts_total > before, timeout=30, what="a burst scheduled by the agent itself")
        _within_budget(a)
    finally:
        agent.stop()


def test_budget_holds_with_detailing_and_no_monitor_at_all():
    agent.start(f"tcp://127.0.0.1:{free_port()}", "5%", proflets=("cpu",))  # nobody listens
    try:
        a = agent._agent
        assert a is not None
        _busy_until(lambda: a.bursts_total >= 2, timeout=40, what="two local bursts")
        _within_budget(a)
        assert a.proflets_off == {}
    finally:
        agent.stop()


class Exploding(Collector):
    name = "exploding"
    DETAILS = True
    OVHD_MS = 0.1
    SLOW = 0.01
    ITVL_MS = 10.0
    PRTY = 1.0

    def __init__(self) -> None:
        self.closed = False

    def start_detail(self, ctx: DetailContext) -> None:
        raise RuntimeError("boom")

    def close(self) -> None:
        self.closed = True


def test_a_collector_that_raises_is_switched_off_and_the_agent_goes_on(monitor_thread):
    m = monitor_thread.monitor
    boom = Exploding()
    agent.start(monitor_thread.endpoint, "10%", proflets=(boom, "cpu"))
    try:
        a = agent._agent
        assert a is not None
        _busy_until(lambda: "exploding" in a.proflets_off, timeout=30, what="the collector switched off")
        assert boom.closed
        assert "boom" in a.proflets_off["exploding"]
        wait_for(
            lambda: (s := m.session_for(os.getpid())) is not None and any("exploding" in e for e in s.errors),
            what="the error reported",
        )
        samples = a._samples_total
        _busy_until(lambda: a._samples_total > samples + 10, timeout=10, what="sampling to go on")
        assert a.alive
    finally:
        agent.stop()


class QuietMonitor:
    """A monitor that answers every report with a plan and asks for a burst only when told to.

    A real ROUTER socket on its own thread; the real monitor would send its
    own requests, and the test could not tell whose burst it saw.
    """

    def __init__(self, detail_delay_s: dict[str, float]) -> None:
        self.plan = {"sample_delay_s": 0.002, "report_delay_s": 1.0, "detail_delay_s": detail_delay_s, "fract": 0.4}
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        self.endpoint = f"tcp://127.0.0.1:{self._sock.bind_to_random_port('tcp://127.0.0.1')}"
        self._ask = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def ask(self) -> None:
        self._ask.set()

    def _serve(self) -> None:
        peer = None
        while not self._done.is_set():
            if self._sock.poll(50):
                peer, data = self._sock.recv_multipart()
                msg_type, _ = protocol.decode(data)
                if msg_type == protocol.REPORT:
                    self._sock.send_multipart([peer, protocol.encode(protocol.CONFIGURE, {"plan": self.plan})])
            if peer is not None and self._ask.is_set():
                self._ask.clear()
                self._sock.send_multipart([peer, protocol.encode(protocol.DETAIL, {"proflet": "cpu"})])

    def close(self) -> None:
        self._done.set()
        self._thread.join()
        self._sock.close()
        self._ctx.term()


@contextlib.contextmanager
def _under_quiet_plan(detail_delay_s: dict[str, float]) -> Iterator[tuple[Any, QuietMonitor]]:
    """The agent in this process (cpu at 10%), once the quiet monitor's plan holds."""
    quiet = QuietMonitor(detail_delay_s)
    agent.start(quiet.endpoint, "10%", proflets=("cpu",))
    try:
        a = agent._agent
        assert a is not None
        _busy_until(lambda: a._monitor_plan is not None, timeout=20, what="the monitor's plan")
        yield a, quiet
    finally:
        agent.stop()
        quiet.close()


def test_the_agent_details_on_its_own_until_the_monitors_first_request():
    with _under_quiet_plan({"cpu": 0.3}) as (a, quiet):
        planned = a.bursts_total
        _busy_until(lambda: a.bursts_total >= planned + 2, timeout=30, what="own bursts under the monitor's plan")
        assert not a._monitor_requests
        _within_budget(a)

        quiet.ask()
        _busy_until(lambda: a._monitor_requests, timeout=20, what="the monitor's request")
        asked = a.bursts_total  # a burst running now ends, and the requested one follows it
        _busy_until(lambda: a.bursts_total > asked and not a._bursts, timeout=20, what="the requested burst")
        _busy_for(3.0)
        # From the first request on, the monitor alone says when.
        assert a.scheduler.delays == {} and a.scheduler.due == {}
        assert a.bursts_total <= asked + 2
        _within_budget(a)


def test_no_own_bursts_of_a_proflet_the_monitor_does_not_detail():
    with _under_quiet_plan({}) as (a, _):  # its plan details nothing
        planned = a.bursts_total
        _busy_for(3.0)
        assert a.scheduler.due == {}
        assert a.bursts_total <= planned + 1  # at most one that was running when the plan came


def test_a_raised_budget_takes_effect_at_once_even_from_the_least(standing_monitor):
    # At 0.01% the plan has a sample every 5 s and a report every 30 s. A raise
    # must not wait for that plan to run out: the monitor re-plans as it sends
    # the budget, and the agent drops a plan made for another budget. (Before,
    # the agent kept the old plan's delays until the monitor's next plan, which
    # came with the next report: 30 s later.)
    from tests.factories import TARGETS, dyper, start_target, stop

    target = start_target(str(TARGETS / "split.py"), "120", "--main-sleeps")
    try:
        ep = standing_monitor.endpoint
        dyper("attach", str(target.pid), "--budget", "0.01%", "--monitor", ep, check=True)
        # The first report comes within a second whatever the budget; with it the monitor's plan for 0.01%.
        first = wait_for(lambda: (s := standing_monitor.session(target.pid)) and s["reports"] >= 1 and s, what="report")
        assert first["budget"] == 0.0001
        time.sleep(1.0)  # the plan for 0.01% has reached the agent
        dyper("budget", str(target.pid), "5%", "--monitor", ep, check=True)
        raised = time.monotonic()
        # At 5% reports come every second or so and samples at tens a second.
        wait_for(
            lambda: (s := standing_monitor.session(target.pid)) and s["budget"] == 0.05 and s["samples"] >= 30,
            timeout=12, what="samples at the raised budget",
        )  # fmt: skip
        assert time.monotonic() - raised < 12
    finally:
        dyper("detach", str(target.pid), "--monitor", standing_monitor.endpoint)
        stop(target)
