"""What is asked of the agent, and by whom: its own API from any thread, and the monitor over the socket.

Requests from the application's threads (a budget, pause, resume, reset, a
boost) are only noted here, each an atomic store; the sampler thread applies
them at its next wake-up. Nothing the monitor sends is trusted: a bad
message is counted and dropped, a budget is bounded by the ceiling, timings
never make us spend more than our own plan, and a burst starts only when the
guard can pay for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

from dyper.agent import protocol
from dyper.agent.budget import MAX_DETAIL_DELAY_S, MAX_REPORT_DELAY_S, MAX_SAMPLE_DELAY_S
from dyper.agent.bursts import Bursts
from dyper.agent.ledger import Clock

#: The monitor's timings hold this long after its last plan, or for this many
#: report intervals if that is longer; past it the agent schedules on its own
#: (the monitor answers every report with a plan, so only a monitor that is
#: gone or stuck lets it lapse).
MONITOR_PLAN_TTL_S: Final = 5.0
MONITOR_PLAN_TTL_REPORTS: Final = 2.5
#: Messages from the monitor taken per wake-up: a flood cannot keep the loop from sampling.
CONTROL_BATCH: Final = 64
#: A monitor that restarted asks once a second (monitor.server.RESYNC_INTERVAL_S);
#: more often than this, the full tables are not sent again.
RESYNC_MIN_S: Final = 1.0


def their_timings(timings: Mapping[str, Any]) -> dict[str, Any]:
    """The monitor's timings within our planner's bounds (the protocol made them finite and non-negative).

    Agent._replan takes them only where they are slower than our own plan; the
    bounds keep a monitor from stopping our samples or reports altogether.
    """
    out: dict[str, Any] = {}
    for key, most in (("sample_delay_s", MAX_SAMPLE_DELAY_S), ("report_delay_s", MAX_REPORT_DELAY_S)):
        if timings.get(key) is not None:
            out[key] = min(float(timings[key]), most)
    if isinstance(timings.get("budget"), int | float):
        out["budget"] = float(timings["budget"])
    details = timings.get("detail_delay_s")
    if isinstance(details, dict):
        out["detail_delay_s"] = {name: min(float(d), MAX_DETAIL_DELAY_S) for name, d in details.items()}
    return out


class Control:
    """The requests waiting for the sampler thread, a running boost, and the monitor's plan while it holds."""

    def __init__(
        self,
        bursts: Bursts,
        *,
        clock: Clock,
        budget: float,
        ceiling: float | None,
        report_delay_s: Callable[[], float],
        replan: Callable[[], None],
        detach: Callable[[], None],
        dropped: dict[str, int],
    ) -> None:
        self._bursts = bursts
        self._clock = clock
        self.budget = budget
        self.ceiling = ceiling
        self._report_delay_s = report_delay_s
        self._replan = replan
        #: the monitor asked us to leave
        self._detach = detach
        self._dropped = dropped
        self.pending_budget: float | None = None
        #: pause (True) or resume (False) asked for, applied by the sampler thread
        self.pending_pause: bool | None = None
        #: statistics start afresh: the sampler sends what it has, then a reset mark
        self.pending_reset = False
        #: (budget, seconds) of a boost asked for (see Agent.boost)
        self.pending_boost: tuple[float, float] | None = None
        #: while a boost runs: when it ends, and the budget it returns to
        self.boost_until: float | None = None
        self.boost_base = budget
        #: the monitor's last timings and until when they hold
        self.monitor_plan: dict[str, Any] | None = None
        self.monitor_plan_until = -math.inf
        #: the monitor has sent a detailing request under its current plan
        self.monitor_requests = False
        #: no resync is served before this (see resync_allowed)
        self._resync_after = -math.inf

    def next_due(self) -> float:
        """When a running boost ends (the requests themselves wake the loop through its pipe)."""
        return self.boost_until if self.boost_until is not None else math.inf

    # --- the budget -------------------------------------------------------------

    def under_ceiling(self, budget: float) -> float:
        return min(budget, self.ceiling) if self.ceiling is not None else budget

    def made_for(self, timings: dict[str, Any], budget: float) -> bool:
        """Whether the monitor's timings were planned for ``budget`` (one that does not say is taken at its word)."""
        planned_for = timings.get("budget")
        return planned_for is None or self.under_ceiling(float(planned_for)) == budget

    def boost(self, now: float, raised: float, seconds: float) -> float:
        """A boost starts (or extends the running one from now): the budget it runs at."""
        if self.boost_until is None:
            self.boost_base = self.budget
        self.boost_until = now + seconds
        return max(raised, self.boost_base)

    def boost_over(self, now: float) -> bool:
        """The running boost has ended: the loop returns to ``boost_base``."""
        if self.boost_until is not None and now >= self.boost_until:
            self.boost_until = None
            return True
        return False

    # --- the monitor's plan ---------------------------------------------------------

    def _plan_ttl(self) -> float:
        """How long the monitor's plan holds: until two and a half report intervals pass with no new one."""
        return max(MONITOR_PLAN_TTL_S, MONITOR_PLAN_TTL_REPORTS * self._report_delay_s())

    def expired(self, now: float) -> bool:
        """The monitor's plan has lapsed and the agent must plan on its own again."""
        return self.monitor_plan is not None and now >= self.monitor_plan_until

    def timings(self, now: float) -> dict[str, Any] | None:
        """The monitor's timings while they hold; None (and forgotten) once they lapsed."""
        theirs = self.monitor_plan if now < self.monitor_plan_until else None
        if theirs is None:
            self.monitor_plan = None
            self.monitor_requests = False
        return theirs

    def budget_changed(self, budget: float) -> None:
        if self.monitor_plan is not None and not self.made_for(self.monitor_plan, budget):
            # The monitor's plan was made for the old budget: at 0.01% its
            # delays are 5 s and 30 s, and taken where slower than ours they
            # would hold a raised budget unspent until its next plan.
            self.monitor_plan = None
        self.budget = budget

    def resync_allowed(self, now: float) -> bool:
        """At most once per RESYNC_MIN_S: a monitor asking again and again must not make us resend megabytes."""
        if now < self._resync_after:
            self._dropped["resyncs"] = self._dropped.get("resyncs", 0) + 1
            return False
        self._resync_after = now + RESYNC_MIN_S
        return True

    def on_message(self, data: bytes) -> bool:
        """Act on one message from the monitor; True if it asks for a resync (served once per batch)."""
        try:
            msg_type, body = protocol.decode(data, protocol.AGENT_ACCEPTS, protocol.MAX_CONTROL_BYTES)
        except protocol.DecodeError:
            self._dropped["bad_messages"] += 1
            return False
        if msg_type == protocol.RESYNC:
            return True
        if msg_type == protocol.DETACH:
            self._detach()
        elif msg_type == protocol.CONFIGURE:
            configure = cast(protocol.Configure, body)
            # The protocol checked the budget's range; the loop applies it under
            # the ceiling, as set_budget's. A "ceiling" the monitor sends is not
            # taken: only whoever started the agent sets it.
            budget = configure.get("budget")
            if budget is not None:
                self.pending_budget = float(budget)
            paused = configure.get("paused")
            if paused is not None:
                self.pending_pause = bool(paused)
            if configure.get("reset"):
                self.pending_reset = True
            theirs = configure.get("plan")
            running_at = self.under_ceiling(self.pending_budget if self.pending_budget is not None else self.budget)
            if theirs is not None and self.made_for(their_timings(theirs), running_at):
                # A plan for another budget (one sent before a change) would hold us to that budget's delays.
                self.monitor_plan = their_timings(theirs)
                now = self._clock()
                self.monitor_plan_until = now + self._plan_ttl()
                self._replan()
                # Its plan may space our reports further apart than ours did
                # (6 s instead of 3 at 1%): held to the old interval, it lapsed
                # before the next report could bring the next plan, and every
                # few seconds the two schedules took turns.
                self.monitor_plan_until = now + self._plan_ttl()
        elif msg_type == protocol.DETAIL:
            detail = cast(protocol.Detail, body)
            name = detail["proflet"]
            # Only while the monitor's plan holds: on our own we keep our own schedule.
            if name in self._bursts.proflet_costs and self.monitor_plan is not None:
                if not self.monitor_requests:
                    # From now on the monitor says when.
                    self.monitor_requests = True
                    self._bursts.hand_over()
                self._bursts.request(name, first=bool(detail.get("first")))
        return False
