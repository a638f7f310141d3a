"""Collectors' own sampling passes (Collector.poll), each paced by its collector and paid as sampling."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from dyper.agent.ledger import EWMA_ALPHA, Ledger, cost_clock
from dyper.agent.proflet import Collector
from dyper.agent.watchdog import HookCaller

#: The least time between two passes of a collector's own sampling (Collector.poll).
MIN_POLL_S: Final = 0.001
#: A first pass short of money tries again this much later at the soonest.
FIRST_POLL_WAIT_S: Final = 0.1


class Polls:
    """The collectors that poll, when each is next due, and what their passes cost.

    Its state belongs to the sampler thread; the loop asks :meth:`next_due`
    and runs :meth:`run_due` when that time has come.
    """

    def __init__(
        self,
        ledger: Ledger,
        call: HookCaller,
        switch_off: Callable[[str, BaseException], None],
        replan: Callable[[], None],
    ) -> None:
        self._ledger = ledger
        self._call = call
        self._switch_off = switch_off
        self._replan = replan
        self.collectors: list[Collector] = []
        self.next_poll: dict[str, float] = {}
        self._cost_s: dict[str, float] = {}
        #: what each collector's passes spend per second, measured: taken off the budget that sampling is planned with
        self.rate: dict[str, float] = {}
        self._delay: dict[str, float] = {}

    def add(self, collector: Collector, now: float) -> None:
        self.collectors.append(collector)
        self.next_poll[collector.name] = now

    def forget(self, name: str, collector: Collector | None) -> None:
        self.collectors = [c for c in self.collectors if c is not collector]
        self.next_poll.pop(name, None)
        self.rate.pop(name, None)

    def rate_total(self) -> float:
        return sum(self.rate.values())

    def next_due(self) -> float:
        """When the first collector's pass is due."""
        return min(self.next_poll.values(), default=math.inf)

    def run_due(self, now: float, budget: float) -> None:
        """Run the collectors' own sampling passes that are due, charged as sampling, within the budget."""
        ledger = self._ledger
        for collector in list(self.collectors):
            name = collector.name
            due = self.next_poll.get(name, math.inf)
            if now < due:
                continue
            # Short of money, the pass is skipped and the next comes in its turn,
            # or when the money is there if that is later (FIRST_POLL_WAIT_S before
            # a first pass has set a turn). Waking again as soon as the money
            # should be there failed: every wake-up (about 0.1 ms here, a tenth of
            # a second's budget at 1%) spent what had accrued, and neither passes
            # nor samples ran again.
            wait = ledger.guard.wait_needed(now, self._cost_s.get(name, 0.0) + ledger.wake_cost_s)
            if wait > 0 and not collector.POLL_IN_DEBT:
                self.next_poll[name] = now + max(wait, self._delay.get(name, FIRST_POLL_WAIT_S))
                continue
            t0 = cost_clock()
            try:
                delay = float(self._call(name, collector.poll, now, budget, ledger.wake_cost_s))
            except Exception as exc:
                self._switch_off(name, exc)
                continue
            finally:
                spent = cost_clock() - t0
                ledger.charge("sample", spent)
                ledger.operation(spent)
            cost = self._cost_s.get(name)
            self._cost_s[name] = spent if cost is None else cost + EWMA_ALPHA * (spent - cost)
            # At least a millisecond apart: a collector asking for 0 must not spin this loop.
            delay = max(MIN_POLL_S, delay if delay == delay else MIN_POLL_S)
            self.next_poll[name] = now + delay
            self._delay[name] = delay
            # A pass usually wakes this loop for itself: the wake-up is its price too.
            rate = (self._cost_s[name] + ledger.wake_cost_s) / delay
            was = self.rate.get(name, 0.0)
            self.rate[name] = rate
            if abs(rate - was) > 0.25 * max(was, 0.02 * budget):
                self._replan()  # passes that start (asyncio came) or stop, or a new pace: sampling makes room
