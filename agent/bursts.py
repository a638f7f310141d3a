"""Detailing: the bursts that run, their calibrated costs and when the next is due.

A burst starts only when the guard can pay for all of it (its COST and the
loop's wake-ups while it runs); its expected slowdown is reserved at the
start and settled against what the proflet measured at the end.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from dyper.agent import protocol
from dyper.agent.budget import Plan, ProfletCosts, cost
from dyper.agent.ledger import Ledger, cost_clock
from dyper.agent.proflet import Collector, DetailContext
from dyper.agent.schedule import (
    CALIBRATION_ALPHA,
    BurstCost,
    DetailScheduler,
    calibrate,
    combine,
    fit_interval,
    share_time,
)
from dyper.agent.tables import Tables
from dyper.agent.watchdog import HookCaller

#: The most a detailing burst may cost, in seconds of budget (at 5%, 50 ms).
BURST_BUDGET_S: Final = 1.0
#: A burst whose measured slowdown passes its reservation is ended early: the
#: proflet is dearer than it said, and the next plan knows.
BURST_OVERRUN: Final = 1.0
#: ... by more than this many seconds of budget (at 5%, 2.5 ms). A cheap burst
#: reserves next to nothing (a call burst: well under a millisecond), and the
#: events it counts come in clumps as threads take turns with the GIL: ended at
#: the first clump past its reservation, it is cut short exactly when its count
#: runs high, and the rates taken from such bursts came out low (a third of the
#: truth once). What passes the reservation is still charged when the burst ends.
BURST_SLACK_S: Final = 0.05
#: While a burst runs, the loop wakes at least this often to charge its
#: slowdown as it accrues (and end it if it overruns) ...
BURST_TICK_S: Final = 0.02
BURST_TICK_MAX_S: Final = 0.25
#: ... and while requests wait for money, this often to start what has become affordable.
DETAIL_TICK_S: Final = 0.1
#: A burst an analysis asked for may borrow what this many seconds of budget repay (see step).
BORROW_S: Final = 3.0


class Burst:
    """A detailing burst in progress."""

    __slots__ = ("charged_s", "end", "fixed_s", "kind", "name", "reserved_s", "start")

    def __init__(self, name: str, kind: str, start: float, end: float, fixed_s: float, reserved_s: float) -> None:
        self.name = name
        self.kind = kind
        self.start = start
        self.end = end
        self.fixed_s = fixed_s
        self.reserved_s = reserved_s
        #: slowdown charged to the guard so far (the reservation, then what was measured past it)
        self.charged_s = reserved_s


class Bursts:
    """The detailing proflets' calibrated costs, the scheduler's queue, the bursts in progress.

    Its state belongs to the sampler thread; the loop asks :meth:`next_due`
    and runs :meth:`run_due` when that time has come.
    """

    def __init__(
        self,
        ledger: Ledger,
        call: HookCaller,
        switch_off: Callable[[str, BaseException], None],
        replan: Callable[[], None],
        *,
        collectors: dict[str, Collector],
        plan: Plan,
        counts: dict[tuple[int, tuple[int, ...]], int],
        tables: Tables,
        rng: random.Random,
    ) -> None:
        self.ledger = ledger
        # The guard as the burst arithmetic below has always named it.
        self.guard = ledger.guard
        self.clock = ledger.clock
        self._call = call
        self._switch_off = switch_off
        self._replan = replan
        self.collectors = collectors
        #: the plan in force, its detail shares sizing the bursts (the agent hands over every new one)
        self.plan = plan
        self.counts = counts
        self.tables = tables
        #: calibrated costs per detailing proflet (the collectors that detail)
        self.proflet_costs: dict[str, ProfletCosts] = {}
        #: proflet -> kind of burst -> its calibrated costs (see Collector.burst_kinds)
        self.kind_costs: dict[str, dict[str, ProfletCosts]] = {}
        self._kind_bursts: dict[tuple[str, str], int] = {}
        #: proflets the monitor asked for again while their burst still ran
        self._again: set[str] = set()
        self.scheduler = DetailScheduler(rng=rng)
        #: the bursts in progress, by proflet
        self.running: dict[str, Burst] = {}
        #: when the detailing machinery next needs a look: a due time, a burst's
        #: tick or end, or a retry while requests wait for money. Set when
        #: something changes, never pushed later by merely looping.
        self.due = -math.inf
        #: finished bursts' results, for the next report
        self.done: list[dict[str, Any]] = []
        self.bursts_total = 0
        #: location id of a leaf -> recent self samples, decayed each report: the candidates
        self.heat: dict[int, float] = {}

    def add(self, name: str, by_kind: dict[str, ProfletCosts]) -> None:
        """Take on a detailing proflet with its declared costs per kind of burst."""
        self.kind_costs[name] = by_kind
        self.proflet_costs[name] = combine(list(by_kind.values()))

    def forget(self, name: str) -> None:
        """A proflet switched off: no burst, no request, no delay of its own from now on."""
        self.proflet_costs.pop(name, None)
        self.kind_costs.pop(name, None)
        self.running.pop(name, None)
        self._again.discard(name)
        self.scheduler.queue.forget(name)
        self.scheduler.set_delays({k: v for k, v in self.scheduler.delays.items() if k != name}, self.clock())

    def planned_s(self, name: str) -> float:
        """A proflet's planned fixed cost: a census, say, is slow by design, and no hang at that."""
        costs = self.proflet_costs.get(name)
        return costs.ovhd_ms / 1000.0 if costs is not None else 0.0

    def look_now(self) -> None:
        """Detail at the loop's next pass, not at the planned time."""
        self.due = -math.inf

    def set_delays(self, delays: dict[str, float], now: float, *, look: bool = True) -> None:
        """The scheduler's delays between bursts; with ``look``, an earlier due time is taken at once."""
        self.scheduler.set_delays(delays, now)
        if look:
            self.due = min(self.due, self.scheduler.next_event())

    def hand_over(self) -> None:
        """The monitor says when from now on: no due times of our own; what waits or runs stays."""
        self.scheduler.hand_over()

    def request(self, name: str, first: bool = False) -> None:
        """The monitor asks for a burst of ``name``: queued, or taken for the next one if one runs.

        ``first``: an analysis asked for it ahead of the plan; it goes to the queue's head.
        """
        if name in self.running:
            # The monitor takes a burst as done at its planned length;
            # this one runs later than it thinks (it waited for the
            # guard): the request is for the next one, not this one.
            self._again.add(name)
        else:
            self.scheduler.queue.request(name, self.clock(), first=first)
        self.due = -math.inf  # look at once

    def next_due(self) -> float:
        """When the loop must look next (never, without detailing proflets)."""
        return self.due if self.proflet_costs else math.inf

    def run_due(self) -> None:
        """Charge and check the running bursts, start what is due and affordable; then say when to look again."""
        self.step(self.clock())
        self.due = self._next_event()

    def stop_all(self, now: float) -> None:
        for name in list(self.running):
            self.stop(name, now)

    def fitted_costs(self) -> list[ProfletCosts]:
        """Per proflet, the mean of its kinds of burst, each sized as it will run: what the plan uses."""
        return [combine([self.costs_of(name, kind) for kind in self.kind_costs[name]]) for name in self.proflet_costs]

    def _next_kind(self, name: str) -> str:
        kinds = self.kind_costs[name]
        try:
            kind = self._call(name, self.collectors[name].burst_kind)
        except Exception:  # a broken proflet shows itself in start_detail, where it is switched off
            kind = ""
        return kind if kind in kinds else next(iter(kinds))

    def costs_of(self, name: str, kind: str) -> ProfletCosts:
        # A burst costs at most BURST_BUDGET_S of budget. Larger bursts would
        # wait for their price to accrue (five seconds at half the bucket), and
        # a run of a few seconds would end before any could start; smaller
        # ones, more often, spend the same share sooner.
        kinds = self.kind_costs[name]
        fitted = [fit_interval(c, self.guard.rate * BURST_BUDGET_S) for c in kinds.values()]
        # Kinds that take turns: the cheap ones are kept short enough for the
        # dear ones to spend the share the current plan gives (one kind: as is).
        fitted = share_time(fitted, self.plan.detail_share.get(name, 0.0) * self.guard.rate)
        return fitted[list(kinds).index(kind)]

    def price_s(self, name: str) -> float:
        """What a burst must find in the guard before it starts: its COST, and
        the loop's wake-ups while it runs (each charged when it happens, after
        the fact: unplanned, a burst's ticks could run the ledger past the budget)."""
        costs = self.costs_of(name, self._next_kind(name))
        length = costs.itvl_ms / 1000.0
        tick = min(BURST_TICK_MAX_S, max(BURST_TICK_S, length / 5.0))
        wakes = math.ceil(length / tick) + 2  # the ticks, the start and the end
        return cost(costs) / 1000.0 + wakes * self.ledger.wake_cost_s

    def step(self, now: float) -> None:
        """Charge the running bursts' slowdown so far and end those due or overrunning; start what is affordable."""
        for name, burst in list(self.running.items()):
            collector = self.collectors[name]
            try:
                slowdown = self._call(name, collector.slowdown_s)
            except Exception as exc:
                self._switch_off(name, exc)
                continue
            if slowdown > burst.charged_s:
                self.guard.charge(slowdown - burst.charged_s, now, "detail")
                burst.charged_s = slowdown
            # End it when the next tick would pass the reservation, not after:
            # the sampler may wait a switch interval for the GIL before it looks again.
            rate = slowdown / max(now - burst.start, 1e-3)
            limit = BURST_OVERRUN * burst.reserved_s + self.guard.rate * BURST_SLACK_S
            if now >= burst.end or slowdown + rate * (self._tick_s() + 0.005) > limit:
                self.stop(name, now)

        def affordable(name: str) -> bool:
            # A burst an analysis asked for ahead of the plan borrows: it starts
            # once the bucket is out of debt, and what it costs is repaid before
            # the next sample or burst. Waiting for its whole price beside every
            # other proflet's bursts, the heap's census came every 10 to 30 s
            # at 1% on a loaded machine, and a minute held two of the five a
            # leak's verdict needs. The budget is kept over the run as ever.
            # Only what BORROW_S of budget repays: at 0.1% a 20-ms census
            # borrowed would silence sampling for 20 s.
            price = self.price_s(name)
            if name in self.scheduler.queue.asked and price <= self.guard.rate * BORROW_S:
                price = 0.0
            return self.guard.wait_needed(now, price) <= 0

        for name in self.scheduler.tick(now, affordable):
            self.start(name, now)

    def start(self, name: str, now: float) -> None:
        kind = self._next_kind(name)
        costs = self.costs_of(name, kind)
        length = costs.itvl_ms / 1000.0
        t0 = cost_clock()
        collector = self.collectors[name]
        try:
            self._call(name, collector.start_detail, DetailContext(self.candidates(), length))
        except Exception as exc:
            self._switch_off(name, exc)
            return
        fixed = cost_clock() - t0
        self.ledger.operation(fixed)
        self.ledger.window["detail"] += fixed
        # Reserve the expected slowdown now, so sampling cannot spend it while
        # the burst runs; the measured slowdown replaces it at the end.
        reserved = costs.slow / (1.0 + costs.slow) * length
        self.guard.charge(fixed + reserved, self.clock(), "detail")
        start = self.clock()
        self.running[name] = Burst(name, kind, start, start + length, fixed, reserved)

    def stop(self, name: str, now: float) -> None:
        burst = self.running.pop(name)
        collector = self.collectors.get(name)
        t0 = cost_clock()
        try:
            result = self._call(name, collector.stop_detail) if collector is not None else {}
        except Exception as exc:
            self._switch_off(name, exc)
            return
        fixed = burst.fixed_s + cost_clock() - t0
        slowdown = float(result.get("slowdown_s", burst.charged_s))
        length = float(result.get("length_s", now - burst.start))
        # Settle the reservation against what was measured (a refund if it was less).
        self.guard.charge(fixed - burst.fixed_s + slowdown - burst.charged_s, self.clock(), "detail")
        # What passed the reservation was spent before the guard could stop it:
        # like one long operation, it bounds how far the ledger can exceed the budget.
        self.ledger.max_op_s = max(self.ledger.max_op_s, slowdown - burst.reserved_s)
        self.ledger.window["detail"] += fixed - burst.fixed_s + slowdown
        self.ledger.operation(fixed - burst.fixed_s)
        kinds = self.kind_costs[name]
        # A plain mean over a kind's first bursts, then a moving average: the
        # declared costs are a cautious guess, and the first measurement is a
        # better one (cpu declares call bursts as dear as line bursts; they cost
        # next to nothing, and a run of a few seconds would end before a
        # moving average found that out).
        n = self._kind_bursts[name, burst.kind] = self._kind_bursts.get((name, burst.kind), 0) + 1
        alpha = max(CALIBRATION_ALPHA, 1.0 / n)
        costs = calibrate(kinds[burst.kind], BurstCost(fixed, slowdown, length), alpha)
        floor = result.get("ovhd_ms")
        if isinstance(floor, int | float) and floor > costs.ovhd_ms:
            # The collector knows its fixed cost better than an average: a
            # stop-the-world scan plans for the worst one seen (heap), not the mean.
            costs = replace(costs, ovhd_ms=float(floor))
        kinds[burst.kind] = costs
        self.proflet_costs[name] = combine(list(kinds.values()))
        result["kind"] = burst.kind
        self.scheduler.finished(name, self.clock())
        if name in self._again:
            self._again.discard(name)
            self.scheduler.queue.request(name, self.clock())
        self.bursts_total += 1
        result.update({"proflet": name, "t": time.time(), "fixed_s": fixed, "slowdown_s": slowdown})
        self.done.append(result)
        del self.done[:-64]  # bounded while no monitor reads them
        self._replan()

    def _next_event(self) -> float:
        if not self.proflet_costs:
            return math.inf
        now = self.clock()
        if self.running:
            return min(now + self._tick_s(), min(b.end for b in self.running.values()))
        if self.scheduler.queue.waiting:
            # Look again when the cheapest waiting request is paid for: each
            # look wakes this thread, which is not free either.
            wait = min(self.guard.wait_needed(now, self.price_s(name)) for name in self.scheduler.queue.waiting)
            return now + max(DETAIL_TICK_S, wait)
        return self.scheduler.next_event()

    def _tick_s(self) -> float:
        """How often a running burst is charged and checked: a fifth of the
        shortest, within BURST_TICK_S and BURST_TICK_MAX_S."""
        shortest = min(b.end - b.start for b in self.running.values())
        return min(BURST_TICK_MAX_S, max(BURST_TICK_S, shortest / 5.0))

    def candidates(self) -> list[Any]:
        """Code objects of the hottest functions by self samples, hottest first."""
        heat = dict(self.heat)
        for (_, stack), n in self.counts.items():
            if stack:
                heat[stack[0]] = heat.get(stack[0], 0.0) + n
        by_code: dict[int, tuple[float, Any]] = {}
        rows = self.tables.loc_rows
        for loc, h in heat.items():
            if loc >= len(rows) or rows[loc][5] & (protocol.LOC_BLOCKING | protocol.LOC_AGENT):
                continue  # a thread waiting in a call is not spending CPU in its function
            code = self.tables.code_of(loc)
            old = by_code.get(id(code))
            by_code[id(code)] = (h + (old[0] if old else 0.0), code)
        ranked = sorted(by_code.values(), key=lambda pair: -pair[0])
        return [code for _, code in ranked]

    def cool(self) -> None:
        """Fold this window's leaves into the decayed heat the candidates come from."""
        heat = self.heat
        for loc in list(heat):
            heat[loc] *= 0.5
            if heat[loc] < 0.5:
                del heat[loc]
        for (_, stack), n in self.counts.items():
            if stack:
                heat[stack[0]] = heat.get(stack[0], 0.0) + n
