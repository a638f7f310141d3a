"""Triggers as the sampler runs them (the conditions themselves: agent.triggers).

The conditions are checked once a second while any are set; the ring keeps
each second's counts so that a report can be split where an event's
"before" begins; the events fired wait for the next report that goes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from dyper.agent import protocol
from dyper.agent.ledger import Clock
from dyper.agent.triggers import CHECK_S, Ring, Triggers, TriggerSpec


class Events:
    """The triggers set, when they are next checked, the ring, and the events fired and not yet reported."""

    def __init__(self, specs: tuple[TriggerSpec, ...], clock: Clock, errors: list[str]) -> None:
        self._clock = clock
        self._errors = errors
        self.triggers: Triggers | None = Triggers(specs, clock) if specs else None
        #: (spec, predicate) added from any thread (agent.trigger), for the sampler to take
        self.new: deque[tuple[TriggerSpec, Callable[[], object] | None]] = deque()
        self.next_check = -math.inf if specs else math.inf
        self.ring = Ring()
        if specs:
            self.ring.resize(max(spec.before_s for spec in specs))
        #: events fired, for the next report (the sampler's own)
        self.fired: list[protocol.TriggerEvent] = []
        #: when the latest event's "after" ends: a report goes then, so its window ends there
        self.end: float | None = None

    def next_due(self, paused: bool) -> float:
        """The next check (none while paused) or the end of an event's "after", whichever comes first."""
        check = self.next_check if self.triggers is not None and not paused else math.inf
        return min(check, self.end if self.end is not None else math.inf)

    def check_due(self, now: float, paused: bool) -> bool:
        return self.triggers is not None and not paused and now >= self.next_check

    def checked(self, now: float) -> None:
        self.next_check = now + CHECK_S

    def switch_off(self, exc: Exception) -> None:
        """A bug in the checks must not take sampling down with it: no more triggers this run."""
        self.triggers = None
        self.next_check = math.inf
        self._errors.append(f"triggers: {type(exc).__name__}: {exc}; switched off")

    def take_new(self, now: float) -> None:
        """Take up the triggers added since the last wake-up."""
        if self.triggers is None:
            self.triggers = Triggers((), self._clock)
        while self.new:
            spec, predicate = self.new.popleft()
            try:
                self.triggers.add(spec, predicate)
            except ValueError as exc:
                self._errors.append(str(exc))
        self.ring.resize(max(s.spec.before_s for s in self.triggers.states) if self.triggers.states else 0.0)
        if math.isinf(self.next_check):
            self.next_check = now

    def ended(self, now: float) -> bool:
        """An event's "after" has ended: its window ends with a report now."""
        if self.end is not None and now >= self.end:
            self.end = None
            return True
        return False

    def lasts_until(self, end: float) -> None:
        self.end = end if self.end is None else max(self.end, end)
