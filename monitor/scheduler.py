"""DYMON's scheduling: timings for each agent and the detailing queue.

For every connected agent the monitor runs the same pure planner the agent
runs (:func:`agent.budget.plan`), with the costs the agent measured and
reported, and with priorities from the proflets' analyzers here, which see the
whole profile. After each report it sends the agent its timings (a
``configure`` with a ``plan``; it also tells the agent the monitor is alive)
and, when a proflet's detailing is due and nothing that conflicts with it is
running, a ``detail`` request. The agent follows the timings only where they
spend no more than its own plan, and starts a requested burst only when its
own guard can pay for it, so a wrong or hostile monitor cannot make it
overspend.

The queue never drops a request: a conflicting one waits until what it
conflicts with has finished (the agent's report of the burst, or a timeout if
that report is lost).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from dyper.agent import protocol
from dyper.agent.budget import Plan, ProfletCosts, plan
from dyper.agent.schedule import DetailScheduler

#: A requested burst whose report has not come back after its length plus
#: this long is taken as finished (its report was lost with a reconnect).
BURST_TIMEOUT_S = 10.0
#: Re-plan triggers: a relative change in a cost or a priority beyond this.
REPLAN_CHANGE = 0.1

#: a control message for the agent: its type and its body, as the protocol types them
Message = tuple[str, protocol.Configure | protocol.Detail]
#: proflet name -> its analyzer's priority for this session (None: keep the agent's)
Priorities = Callable[[str], float | None]


def _changed(old: float, new: float) -> bool:
    if old == new:
        return False
    return abs(new - old) > REPLAN_CHANGE * max(abs(old), abs(new), 1e-12)


@dataclass
class AgentSchedule:
    """The monitor's plan and detailing queue for one agent."""

    budget: float
    sample_cost_s: float = 200e-6
    report_cost_s: float = 2e-3
    sample_lag_s: float = 0.0
    costs: dict[str, ProfletCosts] = field(default_factory=dict)
    scheduler: DetailScheduler = field(default_factory=DetailScheduler)
    plan: Plan | None = None
    #: proflet -> when its requested burst will be taken as lost
    pending: dict[str, float] = field(default_factory=dict)
    #: proflet -> when its requested burst ends, by its planned length
    ends: dict[str, float] = field(default_factory=dict)
    replans: int = 0
    requests: int = 0
    lost: int = 0
    #: extra requests from the bottleneck search (detailing where it needs it), served first
    asked: list[str] = field(default_factory=list)
    #: asked requests not yet sent: their detail messages say so
    _first: set[str] = field(default_factory=set)

    def ask(self, proflet: str) -> None:
        """Ask for one burst of ``proflet`` as soon as the queue allows (e.g. for the diagnosis)."""
        if proflet not in self.asked:
            self.asked.append(proflet)

    def on_report(self, report: protocol.Report, now: float, priorities: Priorities) -> list[Message]:
        """Take a report's measurements, re-plan if they moved, and say what to send the agent."""
        self._measure(report, priorities)
        for burst in report.get("details") or ():
            name = burst.get("proflet")
            if isinstance(name, str) and name in self.pending:
                del self.pending[name]
                if self.ends.pop(name, None) is not None:  # it ended early (an overrun)
                    self.scheduler.finished(name, now)
        for name, deadline in list(self.pending.items()):
            if now >= deadline:
                del self.pending[name]
                self.lost += 1
                if self.ends.pop(name, None) is not None:
                    self.scheduler.finished(name, now)

        new = plan(self.budget, self.sample_cost_s, self.report_cost_s, list(self.costs.values()), self.sample_lag_s)
        if self.plan is None or self._differs(self.plan, new):
            self.plan = new
            self.replans += 1
            self.scheduler.set_delays(new.detail_delay_s, now)
            self.scheduler.queue.allows = {n: self.scheduler.queue.allows.get(n, frozenset()) for n in self.costs}
        out: list[Message] = [(protocol.CONFIGURE, protocol.Configure(plan=self.timings()))]
        out += self.tick(now)
        return out

    def tick(self, now: float) -> list[Message]:
        """Between reports: end the bursts whose planned length has passed and request those now due.

        A requested burst is taken as finished at its planned length, not
        when its report comes back, which can be a report interval (seconds
        at a low budget) later: waiting for it would leave the plan's delay
        between bursts at a report interval or more, and most of a high
        budget unspent. A burst that had to wait for the agent's guard runs
        later than that; the agent keeps a request that comes while it runs
        for after it.
        """
        for name, at in list(self.ends.items()):
            if now >= at:
                del self.ends[name]
                self.scheduler.finished(name, at)
        out: list[Message] = []
        if self.plan is None:
            return out
        for name in self.asked:
            if name in self.costs:
                self.scheduler.queue.request(name, now, first=True)
                self._first.add(name)
        self.asked.clear()
        for name in self.scheduler.tick(now):
            if name not in self.costs:
                continue
            itvl_s = self.costs[name].itvl_ms / 1000.0
            self.ends[name] = now + itvl_s
            self.pending[name] = now + itvl_s + BURST_TIMEOUT_S
            self.requests += 1
            if name in self._first:
                # the agent's queue serves it first too, ahead of a dear burst waiting for money
                self._first.discard(name)
                out.append((protocol.DETAIL, protocol.Detail(proflet=name, first=True)))
            else:
                out.append((protocol.DETAIL, protocol.Detail(proflet=name)))
        return out

    def timings(self) -> protocol.Plan:
        assert self.plan is not None
        return {
            "sample_delay_s": self.plan.sample_delay_s,
            "report_delay_s": self.plan.report_delay_s,
            "detail_delay_s": {k: v for k, v in self.plan.detail_delay_s.items() if not math.isinf(v)},
            "fract": self.plan.fract,
            # the agent takes a plan only for the budget it runs at
            "budget": self.plan.budget,
        }

    def set_budget(self, budget: float, now: float) -> protocol.Plan | None:
        """A new budget (``dyper budget``): re-plan now, not a report later, and give the timings to send.

        At 0.01% the next report can be 30 s away, and the agent would run at
        the new budget with no plan from us for that long.
        """
        self.budget = budget
        if self.plan is None:
            return None
        self.plan = plan(budget, self.sample_cost_s, self.report_cost_s, list(self.costs.values()), self.sample_lag_s)
        self.replans += 1
        self.scheduler.set_delays(self.plan.detail_delay_s, now)
        return self.timings()

    def _measure(self, report: protocol.Report, priorities: Priorities) -> None:
        if isinstance(budget := report.get("budget"), int | float):
            self.budget = float(budget)
        costs = report.get("costs") or {}
        samples = report.get("samples") or 0
        units = report.get("unit_costs") or {}
        if units.get("sample", 0) > 0 and units.get("report", 0) > 0:
            # The agent's own estimates: it knows which of its wake-ups are
            # a sample's and which a report's, and plans with the same numbers.
            self.sample_cost_s = float(units["sample"])
            self.report_cost_s = float(units["report"])
        else:
            if samples > 0 and costs.get("sample", 0) > 0:
                # A sample's wake-up (the loop around it, GIL held) is part of its cost.
                self.sample_cost_s = (float(costs["sample"]) + float(costs.get("wake", 0.0))) / samples
            if costs.get("report", 0) > 0:
                self.report_cost_s = float(costs["report"])
        delays = report.get("delays") or {}
        if isinstance(delays.get("sample_lag"), int | float):
            self.sample_lag_s = max(0.0, float(delays["sample_lag"]))
        allows = dict(self.scheduler.queue.allows)
        seen: set[str] = set()
        for name, state in (report.get("proflets") or {}).items():
            if not isinstance(state, dict) or "off" in state:
                continue
            try:
                c = ProfletCosts(
                    name, float(state["ovhd_ms"]), float(state["slow"]), float(state["itvl_ms"]), float(state["prty"])
                )
            except (KeyError, TypeError, ValueError):
                continue
            wanted = priorities(name)
            if wanted is not None:
                c = replace(c, prty=min(max(wanted, 0.0), 1.0))
            self.costs[name] = c
            allows[name] = frozenset(a for a in state.get("allows") or () if isinstance(a, str))
            seen.add(name)
        for name in set(self.costs) - seen:
            del self.costs[name]  # switched off in the agent
            allows.pop(name, None)
        self.scheduler.queue.allows = allows

    @staticmethod
    def _differs(old: Plan, new: Plan) -> bool:
        if old.budget != new.budget or _changed(old.sample_delay_s, new.sample_delay_s):
            return True
        if _changed(old.report_delay_s, new.report_delay_s) or set(old.detail_delay_s) != set(new.detail_delay_s):
            return True
        return any(_changed(old.detail_delay_s[k], new.detail_delay_s[k]) for k in new.detail_delay_s)
