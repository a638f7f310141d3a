"""When the agent ends a detailing burst early, and what each kind of burst is declared to cost.

A real Agent (its thread not started, time injected) with a proflet whose
measured slowdown the test sets: the agent's detailing step is what is tested.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from dyper.agent.budget import ProfletCosts
from dyper.agent.core import BURST_SLACK_S, Agent
from dyper.agent.proflet import Collector
from dyper.agent.schedule import cost

BUDGET = 0.05


class Clumpy(Collector):
    """Bursts of two kinds: a cheap long one and a dear short one; its slowdown so far is whatever the test says."""

    name = "clumpy"
    DETAILS = True
    OVHD_MS = 0.5
    SLOW = 3.0
    ITVL_MS = 200.0
    PRTY = 0.5

    def __init__(self) -> None:
        self.lost_s = 0.0

    def burst_kinds(self) -> tuple[str, ...]:
        return ("cheap", "dear")

    def kind_costs(self, kind: str) -> ProfletCosts:
        if kind == "cheap":
            return ProfletCosts(self.name, self.OVHD_MS, 0.001, 1000.0, self.PRTY)
        return self.costs()

    def burst_kind(self) -> str:
        return "cheap"

    def start_detail(self, ctx: Any) -> None:
        self.lost_s = 0.0

    def slowdown_s(self) -> float:
        return self.lost_s

    def stop_detail(self) -> dict[str, Any]:
        return {"slowdown_s": self.lost_s}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def rig() -> Iterator[tuple[Agent, Clumpy, Clock]]:
    clock, proflet = Clock(), Clumpy()
    agent = Agent("inproc://burst-limits", BUDGET, clock=clock, proflets=(proflet,))
    agent._start_collectors()
    yield agent, proflet, clock
    for fd in (agent._wake_r, agent._wake_w):
        os.close(fd)


def _start_a_burst(agent: Agent, clock: Clock) -> None:
    for _ in range(2000):
        agent._detail_step(clock())
        if agent._bursts:
            return
        clock.t += 0.05
    raise AssertionError("no burst started in 100 s")


def test_each_kind_starts_from_its_declared_costs(rig: tuple[Agent, Clumpy, Clock]) -> None:
    agent, proflet, _ = rig
    kinds = agent.kind_costs["clumpy"]
    assert kinds["cheap"].itvl_ms == 1000.0 and kinds["cheap"].slow == 0.001
    assert kinds["dear"] == proflet.costs()
    # The plan's costs: the mean COST of the two kinds.
    assert cost(agent.proflet_costs["clumpy"]) == pytest.approx((cost(kinds["cheap"]) + cost(kinds["dear"])) / 2)


def test_a_clump_just_past_a_cheap_reservation_does_not_end_the_burst(rig: tuple[Agent, Clumpy, Clock]) -> None:
    agent, proflet, clock = rig
    _start_a_burst(agent, clock)
    burst = agent._bursts["clumpy"]
    length = burst.end - burst.start
    assert length >= 0.25  # the cheap kind's length (0.25 to 1 s, as the plan leaves room), not the dear one's
    # Twice the reservation (a millisecond or less), but within the slack: the burst goes on.
    proflet.lost_s = 2 * burst.reserved_s
    assert proflet.lost_s < agent.guard.rate * BURST_SLACK_S
    clock.t += 0.4 * length
    agent._detail_step(clock())
    assert agent._bursts.get("clumpy") is burst
    # Past the reservation and the slack: it is ended, and what it cost is charged.
    lost = proflet.lost_s = burst.reserved_s + 2 * agent.guard.rate * BURST_SLACK_S
    clock.t += 0.1 * length
    agent._detail_step(clock())
    assert agent._bursts.get("clumpy") is not burst
    # (the same step may start the next burst, which sets the proflet's loss back to 0)
    done = agent._details_done[-1]
    assert done["slowdown_s"] == pytest.approx(lost)


def test_at_a_high_budget_the_cheap_kind_is_shortened_so_the_dear_one_can_spend() -> None:
    def cheap_and_dear_ms(budget: float) -> tuple[float, float]:
        agent = Agent("inproc://burst-limits-share", budget, clock=Clock(), proflets=(Clumpy(),))
        try:
            agent._start_collectors()
            # The plan's share as at any budget with one proflet (the share moves with measured sample costs).
            agent.plan = replace(agent.plan, detail_share={"clumpy": 0.5})
            return agent._burst_costs("clumpy", "cheap").itvl_ms, agent._burst_costs("clumpy", "dear").itvl_ms
        finally:
            for fd in (agent._wake_r, agent._wake_w):
                os.close(fd)

    cheap_low, dear_low = cheap_and_dear_ms(0.01)
    cheap_high, dear_high = cheap_and_dear_ms(0.25)
    assert cheap_low == 1000.0  # at 1% the declared length: the pair cannot spend the share faster anyway
    assert dear_high == 200.0 and dear_low < dear_high  # (at 1%, what one second of budget buys)
    assert cheap_high < 0.6 * cheap_low


def test_a_lower_budget_ends_the_running_burst_and_a_higher_one_does_not(rig: tuple[Agent, Clumpy, Clock]) -> None:
    agent, proflet, clock = rig
    _start_a_burst(agent, clock)
    burst = agent._bursts["clumpy"]
    clock.t += 0.1 * (burst.end - burst.start)
    agent._apply_budget(2 * BUDGET)
    assert agent._bursts.get("clumpy") is burst  # sized for less than it may now spend: it goes on
    proflet.lost_s = 0.001
    agent._apply_budget(BUDGET / 50)
    # Sized and reserved for the old budget: it ends now, charged what it cost so far.
    assert "clumpy" not in agent._bursts
    assert agent._details_done[-1]["slowdown_s"] == pytest.approx(0.001)
