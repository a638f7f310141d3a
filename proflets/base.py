"""The monitor half of a proflet: the analyzer.

One analyzer per proflet per profiled process (session). The monitor hands
it every report of that process (:meth:`Analyzer.merge`) and every detailing
burst its collector finished (:meth:`Analyzer.merge_detail`); it answers
with its results for a time window (the ``dyper report`` section and the
dashboard's table), a status for the summary view, findings in plain words,
and a priority for the scheduler.

The status is DYPER's light: ``problem`` (0-1, the hue: is something wrong
here?) and ``confidence`` (0-1, the brightness: how sure, mostly from how
much has been seen).

Analyzers keep per-report rows, bounded, so any recent window can be
summed, plus whole-run totals; :meth:`state` / :meth:`restore` carry the
totals through the monitor's history.

This module is imported in the target too (collectors use its helpers), so
it imports nothing from the monitor but the model's lights (no dependencies).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

# The light's type and its confidence curve are the model's; analyzers take them from here.
from dyper.monitor.model.lights import Status, confidence_of

if TYPE_CHECKING:
    from dyper.monitor.model.frames import Frame, FunctionKey, StackKey

__all__ = [
    "KINDS",
    "ROWS_KEPT",
    "Analyzer",
    "ReportView",
    "SessionView",
    "Status",
    "YappiCharge",
    "confidence_of",
    "paired_best",
]

#: Per-report rows kept for windows: an hour of reports at one a second.
ROWS_KEPT = 3600

#: Kinds a sample's leaf can have (see agent.protocol LOC_*). With the
#: native sampler "run" is on a CPU, and a thread ready to run is "gil"
#: (waiting for the GIL) or "runq" (runnable, waiting for a CPU). The GIL
#: sampler cannot tell: its "run" is running or ready to run.
KINDS = ("run", "lock", "wait", "io", "sleep", "gil", "runq")


@dataclass(frozen=True)
class ReportView:
    """One report as an analyzer sees it."""

    #: end of the report's window (the agent's wall clock) and its length
    t: float
    window_s: float
    #: sampling passes in the window
    samples: int
    #: this proflet's collector data for the window (None: it sent none)
    data: Mapping[str, Any] | None
    #: per thread ident: samples by what the leaf was doing (KINDS)
    kinds: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    #: thread ident -> name, as the agent knows them
    threads: Mapping[int, str] = field(default_factory=dict)
    #: processors the process may run on
    cpus: int = 1


def paired_best(
    runs: int, fn: Callable[[], object], hook: Callable[[], object], unhook: Callable[[], object]
) -> tuple[float, float]:
    """The least wall time of ``fn`` plain and hooked, the two interleaved run by run.

    Timed in two batches (every plain run, then every hooked one), a change of
    the machine's speed between the batches went into the difference: on this
    VM one calibration in a dozen came out at a third or three times the cost
    that bursts on real code then lost. Each timed run follows an untimed one
    in the same state, so re-instrumenting or re-specialising the code after a
    switch is not in it. ``fn`` runs twice per state and run: hooked, 2 * ``runs`` times.
    """
    plain = hooked = float("inf")
    for _ in range(runs):
        fn()
        t0 = time.perf_counter()
        fn()
        plain = min(plain, time.perf_counter() - t0)
        hook()
        try:
            fn()
            t0 = time.perf_counter()
            fn()
            hooked = min(hooked, time.perf_counter() - t0)
        finally:
            unhook()
    return plain, hooked


def _plain_loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i & 7
    return total


class YappiCharge:
    """What a yappi burst costs the application on 3.11: its calls, and the slow path under all its bytecode.

    A profile function on 3.11 turns on the eval loop's tracing path in every
    thread it is set on: each instruction goes through a check and runs
    unspecialised, whether or not it calls anything (half a call-free loop's
    time here). Charged per call only, a burst over code that calls little
    was charged next to nothing: the planted spinners ran at half speed and
    the paced call rate came out at 0.53 to 0.65 of the truth. So two
    figures, calibrated on the thread that starts the agent: ``loss``, the
    share of plain bytecode's time the slow path takes, and ``per_call_s``,
    what a call costs beyond that; and a burst is charged ``loss`` of the
    time the application's threads ran during it.
    """

    #: More than this share lost is a disturbed calibration (about half is usual here).
    LOSS_MAX = 0.8

    def __init__(self, builtins: bool, margin: float = 1.0) -> None:
        self.builtins = builtins
        self.margin = margin
        self.per_call_s: float | None = None
        self.loss = 0.0
        self._started = self._cpu = self._thread_cpu = 0.0
        self._thread = 0

    def calibrate(self, calls: Callable[[], object], n_calls: int) -> None:
        """Time a call-free loop and ``calls`` (``n_calls`` hooked calls) with and without yappi."""
        import yappi

        def start() -> None:
            yappi.start(builtins=self.builtins, profile_threads=False)

        try:
            plain_loop, hooked_loop = paired_best(3, lambda: _plain_loop(2000), start, yappi.stop)
            plain, hooked = paired_best(3, calls, start, yappi.stop)
        finally:
            yappi.clear_stats()
        loss = 1.0 - plain_loop / hooked_loop if hooked_loop > 0 else 0.0
        self.loss = min(self.LOSS_MAX, max(0.0, loss))
        # The calls' own loop ran on the slow path too: take that part off.
        self.per_call_s = self.margin * max(0.0, hooked - plain / (1.0 - self.loss)) / n_calls

    def started(self) -> None:
        """Note the clocks as a burst starts (on the thread that will end it)."""
        self._thread = threading.get_ident()
        self._thread_cpu = time.thread_time()
        self._cpu = time.process_time()
        self._started = time.perf_counter()

    def slowdown_s(self, events: int) -> float:
        """The burst's cost so far with ``events`` calls seen (0 while it runs: yappi's count is read at the end).

        The slow path costs ``loss`` of the time the application's threads ran:
        the process's CPU time less the agent's thread's, at most the burst's
        length, since bytecode runs under one GIL. C code in that time is
        charged as if it were bytecode: an overcharge, on the safe side.
        """
        length = time.perf_counter() - self._started
        busy = time.process_time() - self._cpu
        if threading.get_ident() == self._thread:
            busy -= time.thread_time() - self._thread_cpu
        calls = events * (self.per_call_s or 0.0)
        busy = min(max(busy, calls), length)
        return calls + self.loss * (busy - calls)


# --- what an analyzer may read of its process's session -------------------------------------------

#: keys of a running sum's summaries (see SessionView.recent)
K = TypeVar("K", bound=Hashable)


class FrameLookup(Protocol):
    """The monitor's frame table: frame ids index it (append-only)."""

    @property
    def frames(self) -> Sequence[Frame]: ...


class WindowView(Protocol):
    """One report's counts (monitor.session.Window): stack indexes into ``table``, with wall and cpu samples."""

    @property
    def table(self) -> Sequence[StackKey]: ...

    def items(self) -> Iterator[tuple[int, int, int]]: ...


class SliceView(Protocol):
    """Counts of some reports (monitor.session.Slice)."""

    @property
    def counts(self) -> Mapping[StackKey, list[int]]: ...

    @property
    def samples(self) -> int: ...

    @property
    def seconds(self) -> float: ...


class AgentView(Protocol):
    """One agent in the process, as an analyzer may see it: its budget and its proflets' state."""

    @property
    def budget(self) -> float: ...

    @property
    def proflets(self) -> Mapping[str, Mapping[str, Any]]: ...


class SessionView(Protocol):
    """What an analyzer may read of its process's session: the stacks, the windows, and little else.

    :class:`dyper.monitor.session.Session` is one (mypy checks it where the
    session makes its analyzers); a test may hand an analyzer anything with
    the parts it reads. Analyzers never change the session, except to ask it
    to forget a running sum of theirs (:meth:`forget_recent`).
    """

    @property
    def frames(self) -> FrameLookup: ...

    @property
    def threads(self) -> Mapping[int, str]: ...

    @property
    def paths(self) -> Mapping[str, str]:
        """The target's sysconfig paths (which files are library code)."""
        ...

    @property
    def samples(self) -> int: ...

    @property
    def counts(self) -> Mapping[StackKey, list[int]]:
        """The whole run: stack -> [wall, cpu] samples."""
        ...

    @property
    def calls(self) -> Mapping[FunctionKey, list[float]]:
        """What cpu detailing counted: function -> [calls, seconds counted]."""
        ...

    @property
    def agents(self) -> Mapping[str, AgentView]: ...

    @property
    def analyzers(self) -> Mapping[str, Analyzer]:
        """The process's other analyzers (one proflet may read another's figures)."""
        ...

    def duration_s(self) -> float: ...

    def slice(self, start: float | None, end: float | None) -> SliceView: ...

    def window_counts(self, seconds: float | None) -> tuple[Mapping[StackKey, list[int]], int]: ...

    def recent(
        self, name: str, seconds: float, summarize: Callable[[WindowView], dict[K, int]]
    ) -> tuple[dict[K, int], int]: ...

    def forget_recent(self, name: str) -> None: ...

    def calls_per_s(self) -> Mapping[FunctionKey, float]: ...


class _NoFrames:
    frames: Sequence[Frame] = ()


class NoSession:
    """The view of an analyzer made without a session (in a test, say): nothing seen yet."""

    frames: FrameLookup = _NoFrames()
    threads: Mapping[int, str] = {}
    paths: Mapping[str, str] = {}
    samples = 0
    counts: Mapping[StackKey, list[int]] = {}
    calls: Mapping[FunctionKey, list[float]] = {}
    agents: Mapping[str, AgentView] = {}
    analyzers: Mapping[str, Analyzer] = {}

    def duration_s(self) -> float:
        return 0.0

    def slice(self, start: float | None, end: float | None) -> SliceView:
        return _EmptySlice()

    def window_counts(self, seconds: float | None) -> tuple[Mapping[StackKey, list[int]], int]:
        return {}, 0

    def recent(
        self, name: str, seconds: float, summarize: Callable[[WindowView], dict[K, int]]
    ) -> tuple[dict[K, int], int]:
        return {}, 0

    def forget_recent(self, name: str) -> None:
        pass

    def calls_per_s(self) -> Mapping[FunctionKey, float]:
        return {}


@dataclass(frozen=True)
class _EmptySlice:
    counts: Mapping[StackKey, list[int]] = field(default_factory=dict)
    samples: int = 0
    seconds: float = 0.0


class Analyzer:
    """Base class: the hooks an analyzer may override. Every one has a safe default."""

    name: ClassVar[str] = ""
    #: True: the analyzer has a basic analysis from the stack samples alone
    #: (cpu, threads, io), so it has results whether its collector runs or not;
    #: False: without its collector it has nothing, and the report says "not running"
    FROM_SAMPLES: ClassVar[bool] = False

    def __init__(self, session: SessionView | None = None) -> None:
        #: what the analyzer may read of its process's session (not the session itself: see SessionView)
        self.session: SessionView = session if session is not None else NoSession()
        #: (report end time, per-report row) for windows
        self.rows: deque[tuple[float, Any]] = deque(maxlen=ROWS_KEPT)

    def merge(self, report: ReportView) -> None:
        """Fold one report in."""

    def merge_detail(self, burst: Mapping[str, Any]) -> None:
        """Fold in a detailing burst of this proflet (length_s, fixed_s, slowdown_s, and the collector's results)."""

    def priority(self) -> float | None:
        """PRTY for the scheduler (0-1), or None to keep the collector's own."""
        return None

    def wants_detail(self, now: float) -> bool:
        """Whether the analysis asks for a burst now, ahead of the plan (``now``: wall-clock time).

        For a hypothesis being tested that only another measurement settles
        (a type whose count keeps rising: a leak or not?). The monitor queues
        it as the bottleneck search's requests are; the agent's guard pays for
        it like any other, so it is taken from the budget, never added to it.
        """
        return False

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        """The proflet's section of ``dyper report``: the window of reports ending in (start, end], default all."""
        return {}

    def status(self) -> Status:
        return Status()

    def findings(self) -> list[str]:
        """Noteworthy things, in plain words, for the summary."""
        return []

    def has_data(self) -> bool:
        """Whether anything has been measured yet; False: the report says "no data yet", never zeros."""
        return True

    def state(self) -> dict[str, Any]:
        """What history keeps (plain data)."""
        return {}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take back what :meth:`state` gave."""

    def window_rows(self, start: float | None, end: float | None) -> list[Any]:
        return [row for t, row in self.rows if (start is None or t > start) and (end is None or t <= end)]
