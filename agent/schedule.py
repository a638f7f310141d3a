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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from dyper.agent.budget import ProfletCosts, cost

#: Weight of one burst's measurement in the running estimates of a proflet's
#: OVHD and SLOW. High enough to correct a wrong declaration within a few
#: bursts, low enough that one burst disturbed by the machine does not swing
#: the plan.
CALIBRATION_ALPHA = 0.3
#: The largest share of a burst the application can lose to it (SLOW = 999):
#: past this the burst's estimate is broken, not the proflet that slow.
MAX_LOSS = 0.999


def compatible(a: str, b: str, allows: Mapping[str, frozenset[str]]) -> bool:
    """Whether proflets ``a`` and ``b`` may detail at the same time.

    Both must say so: a proflet that measures timing must not have another
    proflet's slowdown inside its burst, whatever the other one declares.
    """
    return b in allows.get(a, frozenset()) and a in allows.get(b, frozenset())


#: How long a request that cannot be paid for yet lets cheaper ones behind it
#: go first. Past this it holds the queue until the guard can pay for it, so a
#: dear burst waits at most this long plus the time its price takes to accrue.
#: Held at once (as before), one dear first burst (memory_stacks' 70 ms at 1%:
#: twenty seconds of accrual beside sampling) held every other proflet for as
#: long, and a minute's run at 1% saw two heap censuses where the plan had
#: room for five. The cheap bursts go at their planned rates, which leave the
#: dear one its share, so what it waits for does accrue meanwhile.
PATIENCE_S = 30.0
#: Every proflet's first burst comes within this many seconds (see set_delays).
FIRST_DETAIL_S = 30.0


@dataclass
class DetailQueue:
    """First come, first served, except that a conflict never blocks the unrelated.

    ``allows`` maps each proflet to the proflets it may detail alongside.
    """

    allows: Mapping[str, frozenset[str]] = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    patience_s: float = PATIENCE_S
    #: when each waiting request was made
    since: dict[str, float] = field(default_factory=dict)
    #: the waiting requests an analysis asked for ahead of the plan (``first``)
    asked: set[str] = field(default_factory=set)

    def request(self, name: str, now: float = 0.0, first: bool = False) -> None:
        """Ask for a burst of ``name``; a second request while one waits or runs is the same request.

        ``first``: an analysis asked for it ahead of the plan (a hypothesis it
        tests), so it goes to the head of the queue, or moves there if it waits.
        """
        if name in self.running:
            return
        if name not in self.waiting:
            self.since[name] = now
        elif first:
            self.waiting.remove(name)
        else:
            return
        if first:
            self.waiting.insert(0, name)
            self.asked.add(name)
        else:
            self.waiting.append(name)

    def ready(self, affordable: Callable[[str], bool] = lambda name: True, now: float = 0.0) -> list[str]:
        """Take the waiting proflets that may start now, in queue order, and mark them running.

        A request that conflicts with a running burst, or with an earlier
        request that also waits, stays; later requests that conflict with
        neither go ahead. The earlier one keeps its place, so it starts as
        soon as what it waits for finishes.

        Money is different from conflicts: a request that cannot be paid for
        yet (``affordable`` says no) lets the ones behind it go first for
        ``patience_s``; after that everything behind it waits too, or cheap
        bursts would spend every token as it accrues and a dear one would
        never start.
        """
        started: list[str] = []
        still: list[str] = []
        # Earlier requests that wait for a conflict: later ones must not conflict
        # with them either. One that waits for money only does not hold back a
        # conflicting cheap burst while its patience lasts: that burst ends
        # long before the money comes.
        held: list[str] = []
        for i, name in enumerate(self.waiting):
            if not all(compatible(name, other, self.allows) for other in [*self.running, *held]):
                still.append(name)
                held.append(name)
            elif not affordable(name):
                if now - self.since.get(name, now) >= self.patience_s:
                    still.extend(self.waiting[i:])
                    break
                still.append(name)
            else:
                self.running.add(name)
                self.since.pop(name, None)
                self.asked.discard(name)
                started.append(name)
        self.waiting = still
        return started

    def finish(self, name: str) -> None:
        self.running.discard(name)

    def forget(self, name: str) -> None:
        """The proflet is gone (switched off): drop it wherever it is."""
        self.running.discard(name)
        self.since.pop(name, None)
        self.asked.discard(name)
        if name in self.waiting:
            self.waiting.remove(name)


@dataclass
class DetailScheduler:
    """Due times per proflet from the plan's delays, feeding a :class:`DetailQueue`."""

    queue: DetailQueue = field(default_factory=DetailQueue)
    rng: random.Random = field(default_factory=random.Random)
    delays: dict[str, float] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)
    #: when each running burst started, for the next one's due time
    started: dict[str, float] = field(default_factory=dict)
    #: the latest a proflet's first burst is due after it joins the plan
    first_s: float = FIRST_DETAIL_S

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
                # The first one at a uniform point of its period, as if the
                # bursts had been going on all along: waiting a whole mean
                # delay first would leave a short run's share largely unspent.
                # Never later than FIRST_DETAIL_S: a proflet says nothing until
                # it has detailed once, and at 1% the dearest periods are
                # minutes. The guard pays for it all the same.
                self.due[name] = now + self.rng.uniform(0.1, 1.0) * min(delay, self.first_s)
            else:
                self.due[name] = min(old, now + self._draw(delay))
        for name in set(self.delays) - set(delays):
            self.due.pop(name, None)
            self.started.pop(name, None)
            self.queue.forget(name)
        self.delays = dict(delays)

    def hand_over(self) -> None:
        """Someone else (the monitor) says when from now on: no due times of our own.

        What waits in the queue or runs stays: a request is never dropped,
        and a running burst still excludes what conflicts with it.
        """
        self.due.clear()
        self.started.clear()
        self.delays = {}

    def tick(self, now: float, affordable: Callable[[str], bool] = lambda name: True) -> list[str]:
        """Queue the proflets that are due and return those that may start now."""
        for name, at in list(self.due.items()):
            if at <= now:
                self.queue.request(name, now)
                del self.due[name]
        ready = self.queue.ready(affordable, now)
        for name in ready:
            self.started[name] = now
        return ready

    def finished(self, name: str, now: float) -> None:
        """A burst ended: the next is due one drawn delay after this one started.

        The plan's delay is the mean time between detailings (COST over the
        share it may spend): counted from a burst's end, the time the burst
        lasted would be added to every period, and a 0.5-s burst planned
        every 1.1 s would run every 1.6 s, a third of its share unspent. Never
        before now, so a burst that overran its delay is not followed at once
        by a catch-up burst.
        """
        self.queue.finish(name)
        began = self.started.pop(name, now)
        delay = self.delays.get(name, math.inf)
        if not math.isinf(delay):
            self.due[name] = max(now, began + self._draw(delay))

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
    speed, so the share of L it loses is f = SLOW / (1 + SLOW): the factor in
    COST(p)'s second term. The moving average is of f, and SLOW = f / (1 - f)
    follows from it. Averaging SLOW instead would overstate COST when bursts
    differ: a proflet whose bursts alternate between losing 10% and 80% of
    their length loses 45% on average, but the mean of their SLOWs (0.11 and
    4) is 2.06, a loss of 67%, and the plan would detail a third less often
    than the budget allows.
    """
    ovhd_ms = (1 - alpha) * costs.ovhd_ms + alpha * burst.fixed_s * 1000.0
    if burst.length_s > 0:
        measured = min(max(burst.slowdown_s / burst.length_s, 0.0), MAX_LOSS)
        f = (1 - alpha) * costs.slow / (1.0 + costs.slow) + alpha * measured
        slow = f / (1.0 - f)
    else:
        slow = costs.slow
    return replace(costs, ovhd_ms=ovhd_ms, slow=slow)


def combine(kinds: Sequence[ProfletCosts]) -> ProfletCosts:
    """One proflet's costs for the planner, from the costs of its kinds of burst.

    A proflet whose bursts take turns (cpu: counting calls, then lines too)
    has a cost per kind, each calibrated from its own bursts so each burst
    is sized to what it will cost. The plan needs the mean burst: this gives
    costs whose COST(p) is the mean of the kinds' COSTs, with their mean
    OVHD and ITVL and the SLOW that makes up the difference.
    """
    if len(kinds) == 1:
        return kinds[0]
    n = len(kinds)
    mean_cost = sum(cost(k) for k in kinds) / n
    ovhd_ms = sum(k.ovhd_ms for k in kinds) / n
    itvl_ms = sum(k.itvl_ms for k in kinds) / n
    f = min(max((mean_cost - ovhd_ms) / itvl_ms, 0.0), MAX_LOSS) if itvl_ms > 0 else 0.0
    return replace(kinds[0], ovhd_ms=ovhd_ms, itvl_ms=itvl_ms, slow=f / (1.0 - f))


#: A proflet whose bursts take turns keeps them, when they spend its whole
#: share, to at most this part of the wall time: the rest is room for the
#: proflets they exclude, and for the gaps the scheduler leaves ...
KINDS_FILL = 0.5
#: ... by shortening its cheap kinds, never below this length.
MIN_CHEAP_ITVL_MS = 250.0


def share_time(
    kinds: Sequence[ProfletCosts],
    rate: float,
    fill: float = KINDS_FILL,
    min_itvl_ms: float = MIN_CHEAP_ITVL_MS,
) -> list[ProfletCosts]:
    """Shorten the cheap kinds of a proflet whose bursts take turns, so its dear kinds can spend its share.

    ``rate`` is the proflet's share of the budget, in seconds of the process's
    time per wall-clock second. A kind that loses less than ``rate / fill`` of
    its length is cheap: however long it runs it cannot spend the share, and
    every second it runs the dear kinds wait (cpu at 25%: 2-s call bursts and
    0.3-s line bursts, back to back, spent 11% where the share was 18%). One
    burst of each kind in turn spends sum COST / sum ITVL per second; the cheap
    kinds get the one length L at which that is ``rate / fill``, within
    ``min_itvl_ms`` and their own ITVL. At low budgets L is past their ITVL and
    nothing changes.
    """
    if len(kinds) < 2 or rate <= 0 or fill <= 0:
        return list(kinds)
    target = rate / fill

    def loss(k: ProfletCosts) -> float:
        return k.slow / (1.0 + k.slow)

    cheap = [i for i, k in enumerate(kinds) if loss(k) < target]
    if not cheap or len(cheap) == len(kinds):
        return list(kinds)  # all dear: nothing waits; all cheap: the share cannot be spent anyway
    dear = [k for i, k in enumerate(kinds) if i not in cheap]
    # sum(COST dear) + sum(OVHD cheap) + sum(loss cheap) * L = target * (sum(ITVL dear) + n * L)
    room = sum(cost(k) for k in dear) + sum(kinds[i].ovhd_ms for i in cheap) - target * sum(k.itvl_ms for k in dear)
    per_ms = target * len(cheap) - sum(loss(kinds[i]) for i in cheap)  # > 0: each cheap loss is below target
    length = room / per_ms
    out = list(kinds)
    for i in cheap:
        out[i] = replace(kinds[i], itvl_ms=min(kinds[i].itvl_ms, max(min_itvl_ms, length)))
    return out


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
