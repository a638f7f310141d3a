"""The agent half of a proflet: the collector that runs inside the target.

A proflet has two halves (DYPER section 5): this collector, which runs in
the target, and an analyzer (:class:`dyper.proflets.base.Analyzer`) in the
monitor, which merges what the collector reports. A proflet package names
them ``COLLECTOR`` in its ``collector`` module (all the target imports) and
``ANALYZER`` in its ``analyzer`` module, and registers under the
``dyper.proflets`` entry-point group (see :mod:`dyper.proflets`).

A collector has four hooks, all optional no-ops; the agent calls only those
a collector overrides, so an unused hook costs nothing:

* :meth:`Collector.sampled`: after each batch of stack samples is recorded (and each second);
* :meth:`Collector.poll`: a pass of the collector's own sampling, at the
  pace it asks for (the asyncio task sampler: the stack samples come from
  the C ticker in batches, too late for a loop's state);
* :meth:`Collector.start_detail` / :meth:`Collector.stop_detail`: a burst of
  costly analysis that the scheduler places inside the budget (DYPER
  section 4). The collector tells the scheduler what a burst costs (OVHD,
  SLOW, ITVL) and how much it wants one (PRTY), and which proflets may
  detail at the same time. The agent measures what each burst really costs
  and corrects those estimates (:func:`agent.schedule.calibrate`);
* :meth:`Collector.report`: data for the report going to the monitor.

Every hook runs on the sampler thread and its time is charged to the
budget. A hook that raises switches its proflet off (the agent reports
why); the application never sees it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any, ClassVar

from dyper.agent.budget import ProfletCosts


@dataclass(frozen=True)
class DetailContext:
    """What the agent hands a collector when a burst starts."""

    #: code objects of the functions the samples show as hottest (by self
    #: samples, hottest first): the candidates selective detailing looks at
    candidates: Sequence[CodeType]
    #: planned length of the burst, seconds
    length_s: float


@dataclass(frozen=True)
class ReportContext:
    """What the agent hands a collector's report hook."""

    #: length of the window this report covers, seconds (the agent's clock)
    window_s: float
    #: the window's stack counts so far: (thread ident, location ids leaf first) -> samples
    counts: Mapping[tuple[int, tuple[int, ...]], int]
    #: samples in the window
    samples: int
    #: active threads per sample: hist[k] = samples with k threads running or
    #: ready to run (the last slot: k or more); empty when no collector asked
    activity: Sequence[int]
    #: location flags (agent.protocol LOC_*) by location id
    loc_flags: Callable[[int], int]
    #: the agent's own thread, to leave out of per-thread figures
    agent_ident: int
    #: a location's code object and instruction offset (None: unknown id), for
    #: collectors that look at what a location does, e.g. the call it makes
    code_at: Callable[[int], tuple[CodeType, int] | None] = lambda loc: None
    #: the tables' epoch: location ids start again when it changes
    epoch: int = 0


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
    #: True: the agent counts active threads per sample for the report hook
    #: (ReportContext.activity)
    WANTS_ACTIVITY: ClassVar[bool] = False
    #: True: a poll pass runs even when the budget is in debt, because passes
    #: cut a standing cost (the memory proflet unhooking its GC callback);
    #: still charged as sampling. Waiting for money there would leave the
    #: dearer hook on, deepening the debt that made it wait.
    POLL_IN_DEBT: ClassVar[bool] = False

    def sampled(self, n: int, counts: Mapping[tuple[int, tuple[int, ...]], int]) -> None:
        """``n`` more samples were added to the window's ``counts``. Charged as sampling: keep it cheap.

        Also called about once a second with ``n`` = 0 (the ticker's samples
        come in batches seconds apart), so a hook that notes the live threads
        sees those that start and end between two batches.
        """

    def poll(self, now: float, budget: float, wake_s: float) -> float:
        """One pass of the collector's own sampling; returns the seconds until the next pass.

        ``now`` is the agent's clock, ``budget`` the share of wall time the
        agent may spend, ``wake_s`` what waking the agent's thread for a pass
        costs besides the pass (measured). A pass is charged as sampling and
        waits, like a stack sample, until the budget has the money for it;
        stack sampling is planned with what the passes leave. Pace passes so
        that they and their wake-ups cost a modest share of ``budget``.
        """
        return math.inf

    def report(self, ctx: ReportContext) -> dict[str, Any] | None:
        """Data for this window's report (plain msgpack-able data), or None for nothing."""
        return None

    def pause(self, paused: bool) -> None:
        """The agent paused (``paused``) or resumed.

        A paused agent runs nothing in the application's threads: take out any
        hook that does (a ``gc.callbacks`` entry, say). Passes do not run while
        paused, so the first after the resume may put it back.
        """

    def basic_cost_s(self) -> float:
        """Seconds this collector's always-on hooks have cost the application's threads so far.

        For work outside bursts that does not run on the agent's thread (a
        ``gc.callbacks`` entry runs in whichever thread collects): cumulative,
        measured or calibrated; the agent charges the growth at each report.
        """
        return 0.0

    #: False when the collector runs because every registered proflet does by
    #: default, True when the user named it (set by the agent when loading)
    explicit: bool = True

    def unavailable(self) -> str | None:
        """Why this collector cannot detail in this process (None: it can)."""
        return None

    def prepare(self) -> None:
        """One-time set-up before the agent's thread starts (e.g. calibrating a cost).

        Runs on the thread that starts the agent, before the application
        competes with the agent's thread for the GIL and for its caches: a
        cost measured from the agent's thread while the application runs
        came out half again too high. Start-up, like loading: reported, not
        charged. What it raises turns the proflet off.
        """

    def costs(self) -> ProfletCosts:
        return ProfletCosts(self.name, self.OVHD_MS, self.SLOW, self.ITVL_MS, self.PRTY)

    def burst_kinds(self) -> tuple[str, ...]:
        """The kinds of burst this collector takes turns between, each with its own cost.

        The agent calibrates a cost per kind and sizes each burst by its
        kind's, so a cheap kind does not waste its share and a dear one does
        not end early; the plan uses their mean (agent.schedule.combine).
        """
        return ("",)

    def kind_costs(self, kind: str) -> ProfletCosts:
        """The declared costs of one kind of burst, before its bursts calibrate them (default: costs())."""
        return self.costs()

    def burst_kind(self) -> str:
        """The kind of the next burst (one of burst_kinds())."""
        return ""

    def start_detail(self, ctx: DetailContext) -> None:
        """Begin a burst: install hooks. Its time is measured and charged as fixed cost."""

    def slowdown_s(self) -> float:
        """Seconds the application has lost to this burst's hooks so far (measured, not declared)."""
        return 0.0

    def stop_detail(self) -> dict[str, Any]:
        """End the burst: remove every hook and return its results (plain msgpack-able data).

        Keys the agent reads: ``slowdown_s`` (what the hooks cost the
        application, measured), ``length_s``, and ``ovhd_ms``, a floor for
        the planned fixed cost when an average would under-plan (a
        stop-the-world scan plans for the worst one seen).
        """
        return {}

    def close(self) -> None:
        """The agent is stopping: leave nothing behind, even in the middle of a burst."""
