"""Detailing: when each proflet runs its costly burst (DYMON's queue).

Pure, like the planner: time comes in as arguments, so the monitor and the
agent run the same code, and tests drive it with a fake clock.

The planner (:mod:`agent.budget`) gives each proflet a mean delay between
its detailings. The :class:`DetailScheduler` turns those delays into due
times (drawn around the mean so bursts never lock step with the application)
and puts due proflets in a :class:`DetailQueue`. A proflet declares which
others may detail at the same time it does; a request that conflicts with a
running burst waits in the queue, behind nothing it does not conflict with,
and is never dropped.

:func:`calibrate` turns what a burst actually cost into corrected OVHD and
SLOW estimates, so the plan follows measurements rather than declarations.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from agent.budget import ProfletCosts

#: Weight of one burst's measurement in the running estimates of a proflet's
#: OVHD and SLOW. High enough to correct a wrong declaration within a few
#: bursts, low enough that one burst disturbed by the machine does not swing
#: the plan.
CALIBRATION_ALPHA = 0.3
#: SLOW is a ratio of extra time to useful time; past this it means the
#: burst's estimate is broken, not that the proflet is that slow.
MAX_SLOW = 1000.0


def compatible(a: str, b: str, allows: Mapping[str, frozenset[str]]) -> bool:
    """Whether proflets ``a`` and ``b`` may detail at the same time.

    Both must say so: a proflet that measures timing must not have another
    proflet's slowdown inside its burst, whatever the other one declares.
    """
    return b in allows.get(a, frozenset()) and a in allows.get(b, frozenset())


@dataclass
class DetailQueue:
    """First come, first served, except that a conflict never blocks the unrelated.

    ``allows`` maps each proflet to the proflets it may detail alongside.
    """

    allows: Mapping[str, frozenset[str]] = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)

    def request(self, name: str) -> None:
        """Ask for a burst of ``name``; a second request while one waits or runs is the same request."""
        if name not in self.waiting and name not in self.running:
            self.waiting.append(name)

    def ready(self, affordable: Callable[[str], bool] = lambda name: True) -> list[str]:
        """Take the waiting proflets that may start now, in queue order, and mark them running.

        A request that conflicts with a running burst, or with an earlier
        request that also waits, stays; later requests that conflict with
        neither go ahead. The earlier one keeps its place, so it starts as
        soon as what it waits for finishes.

        Money is different from conflicts: when the request whose turn it is
        cannot be paid for yet (``affordable`` says no), everything behind it
        waits too, or cheap bursts would spend every token as it accrues and
        a dear one would never start.
        """
        started: list[str] = []
        still: list[str] = []
        for i, name in enumerate(self.waiting):
            blockers = list(self.running) + still
            if not all(compatible(name, other, self.allows) for other in blockers):
                still.append(name)
            elif not affordable(name):
                still.extend(self.waiting[i:])
                break
            else:
                self.running.add(name)
                started.append(name)
        self.waiting = still
        return started

    def finish(self, name: str) -> None:
        self.running.discard(name)

    def forget(self, name: str) -> None:
        """The proflet is gone (switched off): drop it wherever it is."""
        self.running.discard(name)
        if name in self.waiting:
            self.waiting.remove(name)


@dataclass
class DetailScheduler:
    """Due times per proflet from the plan's delays, feeding a :class:`DetailQueue`."""

    queue: DetailQueue = field(default_factory=DetailQueue)
    rng: random.Random = field(default_factory=random.Random)
    delays: dict[str, float] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)

    def set_delays(self, delays: Mapping[str, float], now: float) -> None:
        """Take a new plan's delays. A proflet's next due time moves only if the new delay brings it closer
        or it had none; a burst does not get later because the plan was redone."""
        for name, delay in delays.items():
            old = self.due.get(name)
            if name in self.queue.waiting or name in self.queue.running:
                continue  # its next due time is set when this burst finishes
            if math.isinf(delay):
                self.due.pop(name, None)
            elif old is None:
                self.due[name] = now + self._draw(delay)
            else:
                self.due[name] = min(old, now + self._draw(delay))
        for name in set(self.delays) - set(delays):
            self.due.pop(name, None)
            self.queue.forget(name)
        self.delays = dict(delays)

    def tick(self, now: float, affordable: Callable[[str], bool] = lambda name: True) -> list[str]:
        """Queue the proflets that are due and return those that may start now."""
        for name, at in list(self.due.items()):
            if at <= now:
                self.queue.request(name)
                del self.due[name]
        return self.queue.ready(affordable)

    def finished(self, name: str, now: float) -> None:
        """A burst ended: the next is due one drawn delay after its end."""
        self.queue.finish(name)
        delay = self.delays.get(name, math.inf)
        if not math.isinf(delay):
            self.due[name] = now + self._draw(delay)

    def next_event(self) -> float:
        """Earliest due time, for the caller's sleep (inf if none)."""
        return min(self.due.values(), default=math.inf)

    def _draw(self, mean: float) -> float:
        # Same shape as the sampler's delays: a gaussian around the mean,
        # never shorter than a tenth of it.
        return max(mean * 0.1, self.rng.gauss(mean, mean * 0.25))


@dataclass(frozen=True)
class BurstCost:
    """What one detailing burst really cost, as measured in the target."""

    #: seconds of fixed cost: starting and stopping (hooks set and cleared, results gathered)
    fixed_s: float
    #: seconds the application lost to the proflet's hooks while the burst ran
    slowdown_s: float
    #: wall seconds the burst lasted
    length_s: float


def calibrate(costs: ProfletCosts, burst: BurstCost, alpha: float = CALIBRATION_ALPHA) -> ProfletCosts:
    """Move a proflet's OVHD and SLOW towards what a burst cost.

    During a burst of length L the application runs at 1 / (1 + SLOW) of its
    speed, so the time it loses is SLOW / (1 + SLOW) * L: that is the second
    term of COST(p). Solving for SLOW from the measured loss f = loss / L
    gives SLOW = f / (1 - f).
    """
    ovhd_ms = (1 - alpha) * costs.ovhd_ms + alpha * burst.fixed_s * 1000.0
    if burst.length_s > 0:
        f = min(max(burst.slowdown_s / burst.length_s, 0.0), 0.999)
        measured_slow = min(f / (1.0 - f), MAX_SLOW)
        slow = (1 - alpha) * costs.slow + alpha * measured_slow
    else:
        slow = costs.slow
    return replace(costs, ovhd_ms=ovhd_ms, slow=slow)


def fit_interval(costs: ProfletCosts, max_cost_s: float, min_itvl_ms: float = 10.0) -> ProfletCosts:
    """Shorten ITVL so that one burst costs at most ``max_cost_s``.

    The guard saves at most a few seconds' worth of budget; a burst dearer
    than that could never be paid for at a low budget and would wait forever.
    A shorter burst gives a coarser count but keeps the proflet running.
    """
    budget_ms = max_cost_s * 1000.0 - costs.ovhd_ms
    per_ms = costs.slow / (1.0 + costs.slow)
    if per_ms <= 0 or costs.itvl_ms * per_ms <= budget_ms:
        return costs
    return replace(costs, itvl_ms=max(min_itvl_ms, budget_ms / per_ms))
