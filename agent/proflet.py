"""The agent half of a proflet: the collector that runs inside the target.

A collector may detail: run a costly analysis for a short burst that the
scheduler places inside the budget (DYPER section 4). It tells the scheduler
what a burst costs (OVHD, SLOW, ITVL) and how much it wants one (PRTY), and
which proflets may detail at the same time. The agent measures what each
burst really costs and corrects those estimates (:func:`agent.schedule.calibrate`).

Every hook runs on the sampler thread. A hook that raises switches its
proflet off (the agent reports why); the application never sees it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any, ClassVar

from agent.budget import ProfletCosts


@dataclass(frozen=True)
class DetailContext:
    """What the agent hands a collector when a burst starts."""

    #: code objects of the functions the samples show as hottest (by self
    #: samples, hottest first): the candidates selective detailing looks at
    candidates: Sequence[CodeType]
    #: planned length of the burst, seconds
    length_s: float


class Collector:
    """Base class: every hook is a no-op, so a collector overrides only what it does."""

    #: the proflet's name, shared with its analyzer in the monitor
    name: ClassVar[str] = ""
    #: declared costs until measurements correct them (ms, factor, ms, 0-1)
    OVHD_MS: ClassVar[float] = 1.0
    SLOW: ClassVar[float] = 0.1
    ITVL_MS: ClassVar[float] = 1000.0
    PRTY: ClassVar[float] = 0.5
    #: proflets that may detail at the same time as this one
    ALLOWS: ClassVar[frozenset[str]] = frozenset()
    #: False for collectors with nothing to detail
    DETAILS: ClassVar[bool] = False

    def unavailable(self) -> str | None:
        """Why this collector cannot detail in this process (None: it can)."""
        return None

    def costs(self) -> ProfletCosts:
        return ProfletCosts(self.name, self.OVHD_MS, self.SLOW, self.ITVL_MS, self.PRTY)

    def start_detail(self, ctx: DetailContext) -> None:
        """Begin a burst: install hooks. Its time is measured and charged as fixed cost."""

    def slowdown_s(self) -> float:
        """Seconds the application has lost to this burst's hooks so far (measured, not declared)."""
        return 0.0

    def stop_detail(self) -> dict[str, Any]:
        """End the burst: remove every hook and return its results (plain msgpack-able data)."""
        return {}

    def close(self) -> None:
        """The agent is stopping: leave nothing behind, even in the middle of a burst."""
