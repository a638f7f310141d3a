"""Detailing starts soon and stays within the budget (fake clock, no thread, no socket).

The agent's own scheduler is driven on a fake clock with a proflet like cpu,
whose bursts alternate between nearly free (call counts) and dear (line
counts), and the guard's ledger is read.
"""

from typing import Any

import pytest

from agent import core
from agent.core import Agent
from agent.proflet import Collector, DetailContext

BUDGET = 0.10


class Alternating(Collector):
    """Every other burst loses 60% of its length; the others lose nothing."""

    name = "alternating"
    DETAILS = True
    OVHD_MS = 0.1
    SLOW = 3.0  # declared dearer than either kind
    ITVL_MS = 1000.0  # a burst of 750 ms of loss as declared: more than two seconds of a 10% budget
    PRTY = 0.5

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.starts: list[float] = []

    def start_detail(self, ctx: DetailContext) -> None:
        self.starts.append(self.clock())

    def _loss(self) -> float:
        return 0.6 if len(self.starts) % 2 == 0 else 0.0

    def slowdown_s(self) -> float:
        return self._loss() * (self.clock() - self.starts[-1])

    def stop_detail(self) -> dict[str, Any]:
        length = self.clock() - self.starts[-1]
        return {"slowdown_s": self._loss() * length, "length_s": length}


def _drive(seconds: float) -> tuple[Agent, Alternating]:
    now = [0.0]

    def clock() -> float:
        return now[0]

    proflet = Alternating(clock)
    a = Agent("tcp://127.0.0.1:9", BUDGET, clock=clock, proflets=(proflet,))
    a._start_collectors()
    a._detail_at = a._next_detail_event()
    while now[0] < seconds:
        now[0] = round(now[0] + 0.005, 6)
        if now[0] >= a._detail_at:
            a._detail_step(now[0])
            a._detail_at = a._next_detail_event()
    return a, proflet


def test_alternating_bursts_stay_within_the_budget() -> None:
    a, proflet = _drive(120.0)
    assert len(proflet.starts) >= 10
    # the one burst in flight is the most the ledger may run ahead
    assert a.guard.spent_s <= BUDGET * 120.0 + a.max_op_s + 1e-6


def test_the_first_burst_starts_once_two_seconds_of_budget_are_saved(monkeypatch: pytest.MonkeyPatch) -> None:
    _, proflet = _drive(10.0)
    # due after a second, shortened to cost two seconds of budget: paid for after about two
    assert proflet.starts and proflet.starts[0] <= 3.0, proflet.starts
    # sized to half the bucket, as before, the first burst waited for five seconds of savings
    monkeypatch.setattr(core, "SAVINGS_S", float("inf"))
    _, before = _drive(10.0)
    assert before.starts and before.starts[0] >= 4.0, before.starts
