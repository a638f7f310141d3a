"""DYMON's scheduling end to end: a real monitor, the agent in this process, real detailing bursts.

Checked through the ledger and the monitor's state, never through timing
guesses: the spend the agent's guard records stays within the budget (up to
the one operation in flight), the monitor's requests reach the agent, the
burst results come back, and the agent takes over when the monitor goes.
"""

import os
import time
from typing import Any

import agent
from agent.proflet import Collector, DetailContext
from tests.integration.conftest import MonitorThread, free_port, wait_for


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
        assert schedule.requests >= 1  # the monitor asked for the burst ...
        assert state.mode == "monitor"  # ... and the agent was following its timings
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
