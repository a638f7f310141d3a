"""The memory_stacks proflet: allocation sites with their callers (DYPER section 5.3, the costly mode).

The memory proflet's second detailing mode, scheduled as a proflet of its
own as DYPER does, so that the scheduler runs it less often than the cheap
one: tracemalloc with NFRAME frames per allocation instead of one. Each
site comes with the callers that led to it, which tells which caller of a
shared helper allocates. It has no basic analysis of its own (the memory
proflet's GC and RSS figures are the basic analysis of both); its priority
is half of the memory proflet's, since it only adds callers to sites the
cheap mode finds.

A separate name rather than a setting of ``memory``: the scheduler's unit is
the proflet, with its own costs, priority and burst queue.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from dyper.proflets.base import Analyzer, SessionView, Status, confidence_of
from dyper.proflets.memory import AllocationSites, MemoryAnalyzer, SiteTotals


class StacksCollector(AllocationSites):
    """Allocation sites with up to NFRAME frames of stack, for a burst."""

    name = "memory_stacks"
    # Measured: 38 to 59 ms a burst of planted_memory.py, the first one
    # calibrating (allocation traced with eight frames is slow), and names
    # looked up for every frame.
    OVHD_MS = 60.0
    # Measured: the cheapest allocating statement runs 25 to 80 times slower
    # traced with eight frames from a shallow stack, 70 to 300 times from the
    # agent's thread: a CPU-bound process loses nearly all of the burst.
    SLOW = 30.0
    ITVL_MS = 500.0
    PRTY = 0.15
    NFRAME = 8

    def unavailable(self) -> str | None:
        if sys.version_info < (3, 12) and not self.explicit:
            return (
                "on Python 3.11 tracing allocations with their stack slows allocation-heavy code about twice as "
                "much as on 3.12+: name it to turn it on (DYPER_PROFLETS=memory,memory_stacks)"
            )
        return super().unavailable()


class StacksAnalyzer(Analyzer):
    name = "memory_stacks"

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        self.allocations = SiteTotals()

    def merge_detail(self, burst: Mapping[str, Any]) -> None:
        self.allocations.add(burst)

    def _memory(self) -> MemoryAnalyzer | None:
        memory = self.session.analyzers.get("memory")
        return memory if isinstance(memory, MemoryAnalyzer) else None

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        memory = self._memory()
        # Rates extrapolate to the window the memory proflet's reports cover, else to the bursts.
        seconds = memory.seconds_in(start, end) if memory is not None else 0.0
        return {
            "sites": self.allocations.rows(seconds or self.allocations.burst_s),
            **self.allocations.summary(),
        }

    def priority(self) -> float | None:
        memory = self._memory()
        wanted = memory.priority() if memory is not None else None
        return 0.5 * (wanted if wanted is not None else 0.2)

    def status(self) -> Status:
        memory = self._memory()
        problem = memory.status().problem if memory is not None else 0.0
        return Status(problem, confidence_of(self.allocations.bursts, half=3))

    def state(self) -> dict[str, Any]:
        return {"allocations": self.allocations.state()}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.allocations.restore(state.get("allocations") or {})


COLLECTOR = StacksCollector
ANALYZER = StacksAnalyzer
