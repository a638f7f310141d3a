"""The timing proflet's agent half, loaded alone in the target (see :mod:`dyper.proflets.timing`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

from dyper.agent.proflet import Collector, DetailContext, ReportContext
from dyper.proflets.threads.collector import SchedCounters, ThreadClocks, ThreadNames


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class TimingCollector(Collector):
    name = "timing"
    OVHD_MS = 1.0
    SLOW = 0.0
    ITVL_MS = 2000.0
    PRTY = 0.2
    ALLOWS: ClassVar[frozenset[str]] = frozenset({"threads", "memory", "io", "heap"})
    DETAILS = True
    WANTS_ACTIVITY = True

    def __init__(self) -> None:
        self._clocks = ThreadClocks()
        self._sched = SchedCounters()
        self._names = ThreadNames()

    def sampled(self, n: int, counts: Mapping[tuple[int, tuple[int, ...]], int]) -> None:
        self._names.look()

    def report(self, ctx: ReportContext) -> dict[str, Any] | None:
        ended = self._names.ended()
        clocks = self._clocks.read(int(ident) for ident, _ in ended)
        threads = [[ident, cpu] for ident, (_, cpu) in clocks.items()]
        out: dict[str, Any] = {"activity": list(ctx.activity), "threads": threads, "cpus": _cpus()}
        if ended:
            out["names"] = ended
        return out

    def start_detail(self, ctx: DetailContext) -> None:
        self._sched.start()

    def stop_detail(self) -> dict[str, Any]:
        length, grown = self._sched.stop()
        # ns each thread was runnable but had no processor, over the burst
        return {"length_s": length, "slowdown_s": 0.0, "runqueue_ns": [[k, c[1]] for k, c in grown.items()]}


COLLECTOR = TimingCollector
