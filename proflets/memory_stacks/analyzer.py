"""The memory_stacks proflet's monitor half (see :mod:`dyper.proflets.memory_stacks`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dyper.proflets.base import Analyzer, SessionView, Status, confidence_of
from dyper.proflets.memory.analyzer import MemoryAnalyzer, SiteTotals


class StacksAnalyzer(Analyzer):
    name = "memory_stacks"

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        self.allocations = SiteTotals()

    def merge_detail(self, burst: Mapping[str, Any]) -> None:
        self.allocations.add(burst)

    def has_data(self) -> bool:
        return self.allocations.bursts + self.allocations.skipped > 0

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


ANALYZER = StacksAnalyzer
