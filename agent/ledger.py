"""The sampler thread's account of what its own work costs.

Every subsystem of the agent (sampling, polls, bursts, reports, control)
pays through one :class:`Ledger`: the guard that holds the spend under the
budget, the current report window's lines, and the figures the plan and the
guard's slack are drawn from. And they call back into the agent that owns
them only through :func:`weakly`.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Final, ParamSpec, TypeVar

from dyper.agent.budget import Guard

Clock = Callable[[], float]

#: What the agent's own work costs is read on the sampler thread's CPU clock.
#: While it computes it holds the GIL, so its CPU time is what it takes from
#: the application. Wall time would overcharge every operation longer than
#: the switch interval: the application forces the GIL back, runs its slice,
#: and that slice would be counted as ours. Bursts' slowdown of the
#: application threads is measured by the proflets themselves.
cost_clock: Callable[[], float] = time.thread_time

#: Weight of a new measurement in the moving averages of costs.
EWMA_ALPHA: Final = 0.05

_P = ParamSpec("_P")
_T = TypeVar("_T")


def weakly(method: Callable[_P, _T], default: _T) -> Callable[_P, _T]:
    """``method`` (a bound method) called through a weak reference; ``default`` once its object is gone.

    The subsystems call back into the agent that owns them. Strong references
    would make a cycle, and a stopped agent, its tables and its collectors
    would stay in memory until the cyclic gc ran: for good in a process that
    disabled it (a detach must leave the process as it was).
    """
    ref = weakref.WeakMethod(method)

    def call(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        bound = ref()
        return default if bound is None else bound(*args, **kwargs)

    return call


def fresh_window() -> dict[str, float]:
    """A report window's cost lines before anything is charged (the others appear when first charged)."""
    return {"sample": 0.0, "report": 0.0, "detail": 0.0, "wake": 0.0}


class Ledger:
    """The guard, the window's cost lines and the figures measured from what was charged."""

    def __init__(self, guard: Guard, clock: Clock) -> None:
        self.guard = guard
        self.clock = clock
        #: this report window's costs by line (sample, report, detail, wake, basic, watchdog, hung)
        self.window = fresh_window()
        #: sampler-thread time charged so far in this wake-up (see Agent._serve)
        self.accounted_s = 0.0
        #: the costliest single operation so far: how far the ledger can be
        #: over the budget at any instant (see Guard.wait_needed)
        self.max_op_s = 0.0
        #: the loop's own GIL-held time per wake-up, beyond the operations it runs
        self.wake_cost_s = 0.0

    def charge(self, line: str, spent: float, now: float | None = None) -> None:
        """Charge ``spent`` to the guard and to the window's ``line``."""
        self.window[line] = self.window.get(line, 0.0) + spent
        self.guard.charge(spent, self.clock() if now is None else now, line)

    def operation(self, spent: float) -> None:
        """One operation of the sampler thread's, charged just now: in this wake-up, and perhaps the costliest."""
        self.accounted_s += spent
        self.max_op_s = max(self.max_op_s, spent)
