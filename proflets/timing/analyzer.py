"""The timing proflet's monitor half (see :mod:`dyper.proflets.timing`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dyper.proflets.base import Analyzer, ReportView, SessionView, Status, confidence_of
from dyper.proflets.threads.analyzer import learn_names


class TimingAnalyzer(Analyzer):
    name = "timing"

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        self._hist_seen: list[int] | None = None
        self._cpu_seen: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.cpus = 1
        #: whole run: samples per number of active threads
        self.hist: list[int] = []
        #: whole run: ident -> CPU seconds; and the wall seconds they were measured over
        self.cpu: dict[int, float] = {}
        self.seconds = 0.0
        #: bursts: seconds measured, ns runnable without a CPU (all threads)
        self.burst_s = 0.0
        self.runqueue_ns = 0.0

    def merge(self, report: ReportView) -> None:
        data = report.data
        learn_names(self.names, report)
        if not data:
            return
        self.cpus = int(data.get("cpus") or report.cpus or 1)
        hist = [int(x) for x in data.get("activity") or ()]
        last = self._hist_seen
        # Cumulative; a shorter or smaller one is a new agent, counted from zero.
        if last is not None and len(last) == len(hist) and all(a >= b for a, b in zip(hist, last, strict=True)):
            delta = [a - b for a, b in zip(hist, last, strict=True)]
        else:
            delta = hist
        self._hist_seen = hist
        cpu: dict[int, float] = {}
        for ident, value in data.get("threads") or ():
            ident, value = int(ident), float(value)
            seen = self._cpu_seen.get(ident)
            cpu[ident] = value - seen if seen is not None and value >= seen else value
            self._cpu_seen[ident] = value
        self.rows.append((report.t, (delta, cpu, report.window_s)))
        _add_hist(self.hist, delta)
        for ident, v in cpu.items():
            self.cpu[ident] = self.cpu.get(ident, 0.0) + v
        self.seconds += report.window_s

    def has_data(self) -> bool:
        return self.seconds > 0 or sum(self.hist) > 0

    def merge_detail(self, burst: Mapping[str, Any]) -> None:
        self.burst_s += float(burst.get("length_s") or 0.0)
        self.runqueue_ns += sum(float(v) for _, v in burst.get("runqueue_ns") or ())

    def _window(self, start: float | None, end: float | None) -> tuple[list[int], dict[int, float], float]:
        if start is None and end is None:
            return self.hist, self.cpu, self.seconds
        hist: list[int] = []
        cpu: dict[int, float] = {}
        seconds = 0.0
        for delta, per, window_s in self.window_rows(start, end):
            _add_hist(hist, delta)
            for ident, v in per.items():
                cpu[ident] = cpu.get(ident, 0.0) + v
            seconds += window_s
        return hist, cpu, seconds

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        hist, cpu, seconds = self._window(start, end)
        n = sum(hist)
        mean = sum(k * c for k, c in enumerate(hist)) / n if n else 0.0
        var = sum(c * (k - mean) ** 2 for k, c in enumerate(hist)) / n if n else 0.0
        cores = sum(cpu.values()) / seconds if seconds > 0 else 0.0
        out: dict[str, Any] = {
            "active_threads_mean": mean,
            "active_threads_std": math.sqrt(var),
            "cpus": self.cpus,
            "cores_used": cores,
            "samples": n,
            "seconds": seconds,
            "threads": sorted(
                ({"name": self.names.get(i, f"thread-{i}"), "ident": i, "cpu_s": v} for i, v in cpu.items()),
                key=lambda r: -r["cpu_s"],
            ),
            "active_histogram": list(hist),
        }
        if self.burst_s > 0:
            out["runqueue_wait_threads"] = self.runqueue_ns / 1e9 / self.burst_s
        out["finding"] = _finding(mean, cores, self.cpus, out.get("runqueue_wait_threads"))
        return out

    def _lost(self) -> float:
        """Parallelism lost: the share of the usable parallelism the process did not get."""
        r = self.results()
        usable = min(float(r["active_threads_mean"]), float(self.cpus))
        if usable <= 1.0:
            return 0.0
        return max(0.0, usable - float(r["cores_used"])) / usable

    def status(self) -> Status:
        return Status(self._lost(), confidence_of(sum(self.hist)))

    def priority(self) -> float | None:
        return min(1.0, 0.1 + self._lost())

    def findings(self) -> list[str]:
        text = self.results()["finding"]
        return [text] if text and sum(self.hist) >= 20 else []

    def state(self) -> dict[str, Any]:
        return {
            "names": {str(k): v for k, v in self.names.items()},
            "hist": self.hist,
            "cpu": {str(k): v for k, v in self.cpu.items()},
            "seconds": self.seconds,
            "cpus": self.cpus,
            "burst_s": self.burst_s,
            "runqueue_ns": self.runqueue_ns,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.names = {int(k): str(v) for k, v in (state.get("names") or {}).items()}
        self.hist = [int(x) for x in state.get("hist") or ()]
        self.cpu = {int(k): float(v) for k, v in (state.get("cpu") or {}).items()}
        self.seconds = float(state.get("seconds") or 0.0)
        self.cpus = int(state.get("cpus") or 1)
        self.burst_s = float(state.get("burst_s") or 0.0)
        self.runqueue_ns = float(state.get("runqueue_ns") or 0.0)


def _add_hist(into: list[int], delta: list[int]) -> None:
    if len(into) < len(delta):
        into.extend([0] * (len(delta) - len(into)))
    for k, c in enumerate(delta):
        into[k] += c


def _finding(active: float, cores: float, cpus: int, runqueue: float | None) -> str | None:
    """Said in words when threads are ready to run but the process gets less parallelism than it could."""
    usable = min(active, float(cpus))
    if usable < 1.5 or cores > 0.75 * usable:
        return None
    queued = (
        f"; the kernel's run queue also held {runqueue:.1f} of them on average: the machine is short of CPU too"
        if runqueue is not None and runqueue >= 0.5
        else ""
    )
    if cores <= 1.25:
        # Several threads ready and about one core at most: only one runs Python at a time.
        return (
            f"{active:.1f} threads are ready to run on average but the process gets only {cores:.2f} of {cpus} "
            f"processors: the threads are waiting for the GIL (parallelism lost to the global interpreter lock)"
            f"{queued}"
        )
    return f"{active:.1f} threads are ready to run on average but the process gets {cores:.2f} of {cpus} CPUs{queued}"


ANALYZER = TimingAnalyzer
