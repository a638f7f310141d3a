"""The overhead budget: DYMON's planner (DYPER, section 4) and a local guard.

Both halves are pure: no I/O, no threads, time comes in as arguments. The
monitor and the agent run the same planner, so the agent can keep to the
budget on its own when no monitor is connected.

Budget ``B`` is the overhead analysis may cause, measured the way DYPER and
bench/overhead.py measure it: as a slowdown, the application's time with the
agent over its time without, minus one. Analysis that takes ``s`` seconds of a
wall-clock span ``T`` leaves the application ``T - s`` for its own work, a
slowdown of ``s / (T - s)``; so the agent may take ``B / (1 + B)`` of wall
time (``wall_share``): 0.99% at 1%, 9.1% at 10%, 20% at 25%. Below a few
percent the two readings agree; at 25% a spend of 25% of wall time was a
slowdown of 33%. Everything below is in wall time at that share.
Per proflet ``p`` the proflet supplies OVHD(p) (ms, fixed cost of one
detailing), SLOW(p) (slowdown factor while detailing), ITVL(p) (ms, length of
one detailing) and PRTY(p) in [0, 1]. Then, exactly as in the paper::

    COST(p)  = OVHD(p) + SLOW(p) / (1 + SLOW(p)) * ITVL(p)
    TPRI(p)  = PRTY(p) * sqrt(COST(p))
    P        = mean PRTY over the active proflets
    FRACT(P) = P^2/2 - 5P/4 + 1

FRACT(P)*B goes to stack sampling (90%) and reporting (10%); the rest is
shared among proflets in proportion to TPRI. A share ``s`` of the budget,
spent on a proflet whose detailing costs COST(p), allows one detailing every
``COST(p) / (s * W)`` ms, with ``W = wall_share(B)``.

One step beyond the paper, which left most of a high budget unspent: when
sampling cannot use its share (its delay is at the floor, or the sampler
waits for the GIL behind a busy thread, measured as ``sample_lag_s``), what
it cannot use goes to the detailing proflets, in the same TPRI proportions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: At most 2,000 samples a second. The ticker (agent/_fastsample.c) takes a
#: sample inside the running thread, with no GIL hand-off, for about 20 to 40
#: us of measured cost, so at 10-25% budget sampling can use its share (and
#: samples keep growing with the budget) up to this rate; past it the
#: ticker's own timer wake-ups would be most of the cost.
MIN_SAMPLE_DELAY_S = 0.0005
#: A sampler that is a Python thread must take the GIL for each sample:
#: behind a busy thread it waits up to the 5-ms switch interval, and each
#: hand-off costs the application more than the sampler's clocks see.
MIN_THREAD_SAMPLE_DELAY_S = 0.002
#: At 0.01% budget and a costly process the computed delay can reach minutes;
#: a sample every 5 s still gives a profile over a long run and is cheap.
MAX_SAMPLE_DELAY_S = 5.0
#: Reports are how the user sees anything: not more than once a second (the
#: live views refresh at that rate) ...
MIN_REPORT_DELAY_S = 1.0
#: ... and not less than every 30 s, so a dead connection is noticed and the
#: agent's pending counts stay small. A report costs about 1 ms, so the floor
#: only binds below 0.03% budget, where the guard below still holds the line.
MAX_REPORT_DELAY_S = 30.0
#: Detailing less often than once an hour tells the user nothing new.
MAX_DETAIL_DELAY_S = 3600.0

SAMPLING_SHARE = 0.9
REPORTING_SHARE = 0.1


@dataclass(frozen=True)
class ProfletCosts:
    """What a proflet tells the scheduler (the paper's OVHD, SLOW, ITVL, PRTY)."""

    name: str
    ovhd_ms: float
    slow: float
    itvl_ms: float
    prty: float


@dataclass(frozen=True)
class Plan:
    """The timings the planner hands to the sampler."""

    budget: float
    fract: float
    sample_delay_s: float
    report_delay_s: float
    #: proflet name -> mean delay between its detailings, in seconds
    detail_delay_s: dict[str, float]
    #: proflet name -> its share of the whole budget (fraction of B)
    detail_share: dict[str, float]


def cost(p: ProfletCosts) -> float:
    """COST(p) in ms: fixed overhead plus the slowdown over the detailing interval."""
    return p.ovhd_ms + p.slow / (1.0 + p.slow) * p.itvl_ms


def tpri(p: ProfletCosts) -> float:
    """TPRI(p): priority biased by the square root of the cost."""
    return p.prty * math.sqrt(cost(p))


def fract(mean_priority: float) -> float:
    """FRACT(P): share of the budget for sampling and reporting."""
    p = min(max(mean_priority, 0.0), 1.0)
    return p * p / 2.0 - 5.0 * p / 4.0 + 1.0


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def wall_share(budget: float) -> float:
    """The share of wall-clock time an overhead budget allows the analysis: B / (1 + B)."""
    return budget / (1.0 + budget)


def slowdown(spent_s: float, elapsed_s: float) -> float:
    """The overhead a spend amounts to: ``spent_s`` over the ``elapsed_s - spent_s`` left to the application.

    Capped at 100 (a spend of nearly all the time), so it stays a finite number.
    """
    if not (elapsed_s > 0 and spent_s > 0):  # NaN too: a report's figures are not trusted
        return 0.0
    rest = elapsed_s - spent_s
    return min(100.0, spent_s / rest) if rest > 0 else 100.0


def slowdown_by(spent_s: dict[str, float], elapsed_s: float) -> dict[str, float]:
    """The overhead by what it was spent on: shares of ``slowdown`` of the total, in proportion."""
    total = sum(spent_s.values())
    if total <= 0:
        return dict.fromkeys(spent_s, 0.0)
    whole = slowdown(total, elapsed_s)
    return {k: whole * v / total for k, v in spent_s.items()}


def plan(
    budget: float,
    sample_cost_s: float,
    report_cost_s: float,
    proflets: Sequence[ProfletCosts] = (),
    sample_lag_s: float = 0.0,
    min_sample_delay_s: float = MIN_SAMPLE_DELAY_S,
) -> Plan:
    """Turn a budget and measured costs into mean delays.

    ``sample_cost_s`` is the measured wall cost of one stack sample including
    every proflet's per-sample work, ``report_cost_s`` that of encoding and
    sending one report. Clamping only ever lengthens a delay past what the
    budget allows, except the sampling floor, which only binds for budgets so
    high (tens of percent with microsecond samples) that spending less is the
    right answer anyway. ``sample_lag_s`` is how late samples start on
    average (waiting for the GIL): sampling can then spend at most
    ``sample_cost_s / (delay + lag)``, and the rest of its share is passed on
    to detailing.
    """
    if budget <= 0:
        raise ValueError("budget must be positive")
    wall = wall_share(budget)
    active = [p for p in proflets if p.prty > 0]
    mean_prty = sum(p.prty for p in active) / len(active) if active else 0.0
    f = fract(mean_prty)
    sampling = f * wall * SAMPLING_SHARE
    reporting = f * wall * REPORTING_SHARE
    sample_delay = _clamp(sample_cost_s / sampling, min_sample_delay_s, MAX_SAMPLE_DELAY_S)
    report_delay = _clamp(report_cost_s / reporting, MIN_REPORT_DELAY_S, MAX_REPORT_DELAY_S)

    detail_delay: dict[str, float] = {}
    detail_share: dict[str, float] = {}
    total_tpri = sum(tpri(p) for p in active)
    # The part of sampling's share it cannot spend, as a fraction of B.
    can_spend = sample_cost_s / (sample_delay + max(sample_lag_s, 0.0))
    unused = max(0.0, sampling - can_spend) / wall if total_tpri > 0 else 0.0
    for p in proflets:
        share = (1.0 - f + unused) * tpri(p) / total_tpri if total_tpri > 0 and p.prty > 0 else 0.0
        detail_share[p.name] = share
        if share <= 0:
            detail_delay[p.name] = math.inf
            continue
        # One detailing costs COST(p) ms of the process's time; at a share of
        # the budget that is one detailing every COST / (share * W) ms.
        delay = cost(p) / 1000.0 / (share * wall)
        detail_delay[p.name] = min(delay, MAX_DETAIL_DELAY_S)
    return Plan(budget, f, sample_delay, report_delay, detail_delay, detail_share)


class Guard:
    """Keeps the actual spend at or below the budget, whatever the estimates say.

    A token bucket in seconds of process time: tokens accrue at
    ``wall_share(budget)`` seconds per wall-clock second (so what is spent
    slows the application by at most ``budget``), every measured cost is paid from it, and
    while it is in debt the sampler waits until the debt is repaid. The
    bucket's capacity bounds how much unused budget can be saved up and spent
    in one burst, so a quiet minute cannot buy a noisy one.
    """

    def __init__(self, budget: float, now: float, capacity_s: float = 10.0) -> None:
        self.budget = budget
        self.capacity_s = capacity_s
        self._tokens = 0.0
        self._last = now
        self.spent_s = 0.0
        #: what the budgets in force allowed so far (seconds of process time): over a run
        #: with boosts and trigger events, the line the spending is held to
        self.allowed_s = 0.0
        #: spent_s by what paid (sample, wake, report, detail): the ledger's lines
        self.spent_by: dict[str, float] = {}
        self.started = now

    def set_budget(self, budget: float, now: float) -> None:
        """Take a new budget from ``now``; a debt never takes longer to repay than under the old one.

        A debt is an operation's overrun, paid for after the fact (a burst's
        settlement, say). Run up under 25% and repaid at 1%, each 10 ms of it
        would keep the agent silent, no samples and no reports, for a second;
        at 0.01%, for 100 s. So on a lower budget the debt shrinks with the
        rate, and takes the time to repay it would have taken; on a higher
        one it is repaid sooner.
        """
        self._accrue(now)
        old = self.rate
        self.budget = budget
        new = self.rate
        if self._tokens < 0 and 0 < new < old:
            self._tokens *= new / old

    @property
    def rate(self) -> float:
        """Seconds of process time that accrue per wall-clock second."""
        return wall_share(self.budget)

    def _accrue(self, now: float) -> None:
        elapsed = max(0.0, now - self._last)
        self._last = now
        rate = self.rate
        self.allowed_s += elapsed * rate
        self._tokens = min(rate * self.capacity_s, self._tokens + elapsed * rate)

    def charge(self, seconds: float, now: float, what: str = "other") -> None:
        """Pay for work that took ``seconds`` of the process's time (``what`` names the ledger line)."""
        self._accrue(now)
        self._tokens -= seconds
        self.spent_s += seconds
        self.spent_by[what] = self.spent_by.get(what, 0.0) + seconds

    def tokens(self, now: float) -> float:
        """Seconds that may be spent now; negative while in debt."""
        self._accrue(now)
        return self._tokens

    def wait_needed(self, now: float, expected_s: float = 0.0) -> float:
        """Seconds to wait before an operation expected to cost ``expected_s`` may start.

        Paying before spending keeps the ledger under the budget at every
        moment, up to the error in the estimate of the operation in flight.
        """
        self._accrue(now)
        need = expected_s - self._tokens
        # A nanosecond is float rounding, not overspending.
        return 0.0 if need <= 1e-9 else need / self.rate

    def overhead(self, now: float) -> float:
        """The overhead so far: the slowdown what was spent caused (compare with the budget)."""
        return slowdown(self.spent_s, now - self.started)
