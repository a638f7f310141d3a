"""The agent spends its budget instead of losing it (fake clock, no thread, no socket).

A proflet like cpu alternates bursts that cost almost nothing (call counts)
with dear ones (line counts). The agent's own scheduler is driven here on a
fake clock and the guard's ledger is read: the spend must come close to the
budget and never pass it.
"""

from typing import Any

import pytest

from agent import core
from agent.core import Agent
from agent.proflet import Collector, DetailContext

BUDGET = 0.10
SECONDS = 120.0


class Alternating(Collector):
    """Every other burst loses 60% of its length; the others lose nothing."""

    name = "alternating"
    DETAILS = True
    OVHD_MS = 0.1
    SLOW = 3.0  # declared dearer than either kind
    ITVL_MS = 200.0
    PRTY = 0.5

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.bursts = 0
        self.started = 0.0

    def start_detail(self, ctx: DetailContext) -> None:
        self.started = self.clock()

    def _loss(self) -> float:
        return 0.6 if self.bursts % 2 else 0.0

    def slowdown_s(self) -> float:
        return self._loss() * (self.clock() - self.started)

    def stop_detail(self) -> dict[str, Any]:
        length = self.clock() - self.started
        result = {"slowdown_s": self._loss() * length, "length_s": length}
        self.bursts += 1
        return result


def _drive(monkeypatch: pytest.MonkeyPatch, savings_s: float) -> Agent:
    monkeypatch.setattr(core, "SAVINGS_S", savings_s)
    now = [0.0]

    def clock() -> float:
        return now[0]

    a = Agent("tcp://127.0.0.1:9", BUDGET, clock=clock, proflets=(Alternating(clock),))
    a._start_collectors()
    a._detail_at = a._next_detail_event()
    while now[0] < SECONDS:
        now[0] = round(now[0] + 0.005, 6)
        if now[0] >= a._detail_at:
            a._detail_step(now[0])
            a._detail_at = a._next_detail_event()
    return a


def test_cheap_bursts_leave_no_budget_unspent_and_the_guard_still_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    a = _drive(monkeypatch, savings_s=2.0)
    spent = a.guard.spent_s
    # Within the budget, up to the one burst in flight ...
    assert spent <= BUDGET * SECONDS + a.max_op_s + 1e-6
    # ... and most of it used: nothing else spends here (no sampling), so
    # what the bursts did not spend was budget lost.
    assert spent >= 0.8 * BUDGET * SECONDS, (spent, a.bursts_total)


def test_without_spare_bursts_the_plan_alone_leaves_budget_unspent(monkeypatch: pytest.MonkeyPatch) -> None:
    # The comparison that makes the first test mean something: the planned
    # delays alone (sized for the mean burst, from estimates) spend less.
    planned = _drive(monkeypatch, savings_s=float("inf")).guard.spent_s
    spare = _drive(monkeypatch, savings_s=2.0).guard.spent_s
    assert planned < spare
