"""The stack samples: who takes them, what one costs, when the next is due.

Three samplers, one interface: the agent's own thread under the GIL (the
pure-Python walker or the C one, agent/_fastsample.c), the C ticker (the
snapshot taken inside whichever thread holds the GIL) and the native sampler
(agent/_native.c: no GIL at all). The last two queue their snapshots; the
loop drains them into the flat counts.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import random
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, Final

from dyper.agent.ledger import EWMA_ALPHA, Ledger, cost_clock
from dyper.agent.native import NativeTicker, choose_sampler
from dyper.agent.proflet import Collector
from dyper.agent.tables import UNDECIDED, WAITS, Tables
from dyper.agent.triggers import Ring
from dyper.agent.watchdog import HookCaller

fast: Any
try:  # the optional C walker (agent/_fastsample.c); the pure-Python one is the reference
    fast = importlib.import_module("dyper.agent._fastsample")
except ImportError:  # not built for this interpreter
    fast = None

#: Sampling through the C ticker (see "The ticker" in agent/_fastsample.c):
#: snapshots taken inside the thread that holds the GIL, no hand-off. On
#: unless DYPER_TICKER=0 (the agent's own thread then samples, as before).
TICKER: Final = bool(fast is not None and getattr(fast, "TICKER", 0)) and os.environ.get("DYPER_TICKER") != "0"

#: Distinct (thread, stack) entries kept while reports cannot be sent. A busy
#: service has a few thousand; past this we drop samples and count them.
MAX_PENDING_STACKS: Final = 50_000
#: Starting guess until the first measurements come in; deliberately high so
#: the first plan errs on the side of spending less.
INITIAL_SAMPLE_COST_S: Final = 200e-6
#: Sample counts after which the plan is redone at once, so the first plan's
#: deliberately high cost guess does not hold sampling back for a whole second.
_EARLY_REPLANS: Final = frozenset({1, 2, 4, 8, 16, 32})
#: Snapshots the ticker may queue before the loop drains them between reports.
TICKER_DRAIN_AT: Final = 512
#: Until this many samples are in, the loop drains after TICKER_EARLY_DRAIN_S,
#: then twice that, and so on, at most TICKER_EARLY_DRAINS times, and replans,
#: so the first plan's high cost guess is soon replaced.
TICKER_EARLY_SAMPLES: Final = 64
TICKER_EARLY_DRAIN_S: Final = 0.1
TICKER_EARLY_DRAINS: Final = 5
#: Slots of the active-threads histogram (the last takes that many or more).
ACTIVITY_SLOTS: Final = 65

#: (thread ident, stack of location ids, leaf first) -> samples
Counts = dict[tuple[int, tuple[int, ...]], int]


def jitter(rng: random.Random, mean: float, spread: float = 0.25) -> float:
    # A gaussian around the planned mean so samples never lock step with a
    # periodic application (DYPER section 4).
    return max(mean * 0.1, rng.gauss(mean, mean * spread))


def sample_python(
    tables: Tables, counts: Counts, me: int, activity: list[int] | None, pending: list[tuple[int, ...]]
) -> None:
    """The pure-Python walker: the C walker's reference (agent._fastsample.sample does the same)."""
    locs = tables.locs
    new_loc = tables.new_loc
    waiting = tables.waiting
    leaves: list[int] = []
    for tid, frame in sys._current_frames().items():
        if tid == me:
            continue
        stack: list[int] = []
        push = stack.append
        f: FrameType | None = frame
        while f is not None:
            code = f.f_code
            # One int instead of a tuple: user-space addresses fit in 48
            # bits, so the instruction offset above them keeps keys unique.
            key = (f.f_lasti << 48) | id(code)
            loc = locs.get(key)
            if loc is None:
                loc = new_loc(key, code, f.f_lasti, f.f_lineno)
            push(loc)
            f = f.f_back
        k = (tid, tuple(stack))
        counts[k] = counts.get(k, 0) + 1
        if activity is not None and stack:
            leaves.append(stack[0])
    if activity is None:
        return
    # As the C walker does (agent._fastsample.sample): a sample with an
    # undecided leaf waits in pending.
    n = len(waiting)
    if any(loc >= n or waiting[loc] == UNDECIDED for loc in leaves):
        pending.append(tuple(leaves))
    else:
        active = sum(1 for loc in leaves if waiting[loc] != WAITS)
        activity[min(active, len(activity) - 1)] += 1


def count_pending(tables: Tables, activity: list[int] | None, pending: list[tuple[int, ...]]) -> None:
    """Decide the new leaves of pending samples, then count those samples' active threads.

    Once per new leaf location, so after the first samples of a run
    nothing is pending; counting a new leaf as either running or waiting
    before deciding it would skew the histogram (a run's first drain can
    hold a second of samples).
    """
    if activity is None:
        return
    tables.flag_leaves({loc for leaves in pending for loc in leaves})
    top = len(activity) - 1
    for leaves in pending:
        active = sum(1 for loc in leaves if not tables.waits(loc))
        activity[min(active, top)] += 1


class Sampling:
    """The sampler in use, the subscribers to its samples, its measured cost and its next due time.

    Its state belongs to the sampler thread, ``samples_taken`` aside.
    """

    def __init__(
        self,
        ledger: Ledger,
        call: HookCaller,
        switch_off: Callable[[str, BaseException], None],
        replan: Callable[[], None],
        *,
        tables: Tables,
        counts: Counts,
        dropped: dict[str, int],
        errors: list[str],
        rng: random.Random,
        ring: Ring,
        restart_tables: Callable[[], None],
    ) -> None:
        self._ledger = ledger
        self._call = call
        self._switch_off = switch_off
        self._replan = replan
        self.tables = tables
        self.counts = counts
        self._dropped = dropped
        self._errors = errors
        self._rng = rng
        #: the triggers' per-second slices of the counts (agent.events): dropped with the counts
        self._ring = ring
        #: what full tables call for: everything held is dropped (counted) and the tables start afresh
        self._restart_tables = restart_tables
        #: the sampler thread's id: the one thread the samplers skip. The agent's
        #: state, its socket included, belongs to that thread (Agent._owns); the
        #: watchdog sets it to 0 when it gives a thread up, the replacement to its own.
        self.ident = 0
        self.sample_cost_s = INITIAL_SAMPLE_COST_S
        self.sample_lag_s = 0.0
        self.samples_total = 0
        self.samples_in_window = 0
        #: the mean delay between samples in force (set by the agent's plan)
        self.delay_s = 0.0
        self.next_sample = math.inf
        self._early_drains = 0
        #: which sampler takes the stack samples, "native" (agent/_native.c: no GIL) or
        #: "gil" (the ticker or this thread, under the GIL), and why (see agent.native.choose_sampler)
        self.sampler, self.sampler_why = choose_sampler()
        #: what the ticker functions are called on: the C ticker, or the native sampler behind its interface
        self.tk: Any = NativeTicker(tables, TICKER_DRAIN_AT) if self.sampler == "native" else fast
        #: sampling through the C ticker (or the native sampler); decided when the loop starts
        self.ticker = False
        #: the ticker was stopped by a pause, to start again on resume
        self._ticker_paused = False
        self._ticker_last: dict[str, Any] = {}
        #: costs charged since the last drain, spread over the samples it brought
        self._undrained_s = 0.0
        #: the drains' own part of that since the last drain, and per sample (moving average)
        self._own_undrained_s = 0.0
        self.drain_cost_s = 0.0
        #: expected GIL hand-off cost of one wake-up of the agent's thread
        self.handoff_s = 0.0
        #: the collectors whose sampled hook is overridden (only those are called)
        self.subscribers: list[Collector] = []
        #: active threads per sample, cumulative (see ReportContext.activity); None: nobody asked
        self.activity: list[int] | None = None
        #: samples whose leaves were not all decided when taken (leaf tuples):
        #: counted into activity once flag_leaves has decided them
        self.pending: list[tuple[int, ...]] = []

    @property
    def samples_taken(self) -> int:
        """Samples taken so far, those still in the ticker's queue included."""
        queued = self.tk.ticker_stats()["queued"] if self.ticker else 0
        return self.samples_total + int(queued)

    def want_activity(self) -> None:
        """A collector reads the active-threads histogram: the samplers keep it from now on."""
        self.activity = [0] * ACTIVITY_SLOTS

    # --- when ---------------------------------------------------------------------

    def begin(self, now: float) -> None:
        """The loop starts (or a replacement's does): the first sample, or the first drain, is due."""
        self.next_sample = now + (TICKER_EARLY_DRAIN_S if self.ticker else jitter(self._rng, self.delay_s))
        self._early_drains = 0

    def next_due(self) -> float:
        """The next sample, or the next early drain of the ticker (never once the ticker runs on its own, or paused)."""
        return self.next_sample

    def hurry(self, at: float) -> None:
        """The next sample no later than ``at`` (a higher budget plans a shorter delay)."""
        self.next_sample = min(self.next_sample, at)

    def run_due(self, now: float, paused: bool) -> None:
        """Drain the ticker as needed, or take the sample that is due if the guard can pay for it."""
        if self.ticker:
            # Early on, drain every now and then: the plan waits for
            # measured costs. Backing off, since each wake-up has its price.
            early = self.samples_total < TICKER_EARLY_SAMPLES and self._early_drains < TICKER_EARLY_DRAINS
            self.ticker_step(drain=early and now >= self.next_sample)
            if early and now >= self.next_sample:
                self._early_drains += 1
                # Not before a few samples can have come: at 0.1% a wake-up
                # every 0.1 s drained nothing and cost more than sampling.
                self.next_sample = now + max(TICKER_EARLY_DRAIN_S * 2**self._early_drains, 4 * self.delay_s)
            elif not early:
                self.next_sample = math.inf
        elif not paused and now >= self.next_sample:
            ledger = self._ledger
            wait = ledger.guard.wait_needed(now, self.sample_cost_s)
            if wait > 0:
                self.next_sample = now + wait
            else:
                # How late the sample starts: mostly the wait for the GIL
                # behind a busy thread, which caps how often we can sample.
                self.sample_lag_s += EWMA_ALPHA * (now - self.next_sample - self.sample_lag_s)
                t0 = cost_clock()
                self.sample()
                spent = cost_clock() - t0
                ledger.charge("sample", spent)
                ledger.operation(spent)
                # A plain mean over the first samples, then a moving average:
                # the plan follows real costs within a few samples of start.
                self.samples_total += 1
                alpha = max(EWMA_ALPHA, 1.0 / self.samples_total)
                self.sample_cost_s += alpha * (spent - self.sample_cost_s)
                if self.samples_total in _EARLY_REPLANS:
                    self._replan()
                self.next_sample = now + jitter(self._rng, self.delay_s)

    # --- the agent's own thread samples ---------------------------------------------

    def sample(self) -> None:
        """Record one snapshot of every thread's Python stack.

        Runs with the GIL held, so every application thread is paused while
        it runs: keep it tight. Stacks are recorded leaf first as walked;
        the monitor reverses them once. The C walker, when it was built,
        does the same without creating frame objects.
        """
        if fast is not None:
            if self.activity is None:
                fast.sample(self.counts, self.tables.locs, self.tables.new_loc, self.ident)
            else:
                fast.sample(
                    self.counts,
                    self.tables.locs,
                    self.tables.new_loc,
                    self.ident,
                    self.tables.waiting,
                    self.activity,
                    self.pending,
                )
        else:
            sample_python(self.tables, self.counts, self.ident, self.activity, self.pending)
        self.after_samples(1)

    def after_samples(self, n: int) -> None:
        self.samples_in_window += n
        if self.pending:
            pending, self.pending = self.pending, []
            count_pending(self.tables, self.activity, pending)
        for collector in self.subscribers:
            try:
                self._call(collector.name, collector.sampled, n, self.counts)
            except Exception as exc:
                self._switch_off(collector.name, exc)
        if len(self.counts) > MAX_PENDING_STACKS:
            # The monitor has been away long enough to fill the table: drop
            # these samples (counted) rather than grow without bound.
            self._dropped["samples"] += sum(self.counts.values())
            self.counts.clear()
            self._ring.clear(self._ledger.clock())
        if self.tables.full():
            self._restart_tables()

    # --- sampling through the ticker ------------------------------------------------

    def start_ticker(self, wake_w: int) -> None:
        """Sample through the C ticker (see TICKER) or the native sampler, skipping this thread, the sampler."""
        if not TICKER and self.sampler != "native":
            return
        if self.ticker:
            # A replacement sampler: the running ticker skips the thread given
            # up. Its queue is drained first (a new start would discard it).
            with contextlib.suppress(Exception):
                self.tk.ticker_stop()
            self.ticker_step(drain=True)
            self.ticker = False
        try:
            self.tk.ticker_start(self.ident, wake_w)
        except Exception as exc:  # e.g. no thread could be started: sample from here
            self._errors.append(f"ticker unavailable ({exc}); sampling from the agent's thread")
            if self.sampler == "native":
                self.sampler, self.sampler_why = "gil", f"the native sampler did not start: {exc}"
                self.tk = fast
                self.start_ticker(wake_w)
        else:
            self.ticker = True
            self._ticker_last = self.tk.ticker_stats()
            self.sync_ticker()

    def stop_ticker(self) -> None:
        self.tk.ticker_stop()

    def pause(self) -> None:
        """Stop the ticker, so that nothing runs in the application's threads; the samples it took are kept."""
        if self.ticker:
            self.ticker_step(drain=True)
            self.tk.ticker_stop()
            self.ticker = False
            self._ticker_paused = True

    def resume(self, wake_w: int) -> None:
        if self._ticker_paused:
            self._ticker_paused = False
            self.start_ticker(wake_w)

    def sync_ticker(self) -> None:
        """Give the ticker the planned delay and the guard's money."""
        guard = self._ledger.guard
        rate = guard.rate  # what accrues per second: the budget's share of wall time
        self.tk.ticker_set(
            self.delay_s if rate > 0 else 0.0,
            0.25,
            rate,
            guard.tokens(self._ledger.clock()),
            rate * guard.capacity_s,
        )

    def ticker_step(self, drain: bool) -> None:
        """Drain the ticker's queue when asked or long, charge what sampling cost.

        The costs: the snapshots taken in application threads (their CPU
        time, measured there), the ticker thread's own CPU time (its timer
        and the samples it takes itself), the GIL hand-offs those cost
        other threads (estimated by the ticker), and the drains run here.
        Per-sample cost for planning is all of it, and the loop's wake-ups,
        over the samples drained.
        """
        t0 = cost_clock()
        stats = self.tk.ticker_stats()
        last = self._ticker_last
        if drain or stats["queued"] >= TICKER_DRAIN_AT or stats["dropped"] > last["dropped"]:
            if self.activity is None:
                n = self.tk.ticker_drain(self.counts, self.tables.locs, self.tables.new_loc)
            else:
                n = self.tk.ticker_drain(
                    self.counts,
                    self.tables.locs,
                    self.tables.new_loc,
                    self.tables.waiting,
                    self.activity,
                    self.pending,
                )
            self.after_samples(n)
        else:
            n = 0
        own = cost_clock() - t0
        elsewhere = sum(stats[k] - last[k] for k in ("app_cpu_s", "ticker_cpu_s", "handoff_s"))
        self._ticker_last = stats
        dropped = self._dropped
        dropped["samples"] += stats["dropped"] - last["dropped"]
        if self.sampler == "native":  # its torn and refused reads, counted by why
            for why, count in self.tk.counters().items():
                dropped[why] = dropped.get(why, 0) + count
        spent = own + elsewhere
        self._ledger.charge("sample", spent)
        self._ledger.operation(own)
        self.sample_lag_s = stats["latency_s"]
        ticks = stats["ticks"] - last["ticks"]
        if ticks > 0:
            busy = (stats["busy_ticks"] - last["busy_ticks"]) / ticks
            self.handoff_s = busy * 2.0 * stats["latency_floor_s"]
        self._undrained_s += spent
        self._own_undrained_s += own
        tick_cost = float(stats.get("tick_cost_s", 0.0))
        if n > 0:
            per_sample = self._undrained_s / n
            self._undrained_s = 0.0
            self.samples_total += n
            alpha = max(EWMA_ALPHA * 4, min(1.0, n / self.samples_total))
            self.sample_cost_s += alpha * (per_sample - self.sample_cost_s)
            # A drain's cost per sample is a mean over its samples already; the first drains'
            # one-time costs (new locations, their code checked) must not linger in it.
            self.drain_cost_s += max(alpha, 0.5) * (self._own_undrained_s / n - self.drain_cost_s)
            self._own_undrained_s = 0.0
        if tick_cost > 0 and self.samples_total > 0:
            # The native sampler says what an instant costs its thread at
            # every look, not only at drains, which come seconds apart at a
            # low rate: the plan follows it without waiting for a drain to
            # correct a first estimate. Only the drain's part is per drain.
            self.sample_cost_s = tick_cost + self.drain_cost_s
        if n > 0 and self.samples_total < TICKER_EARLY_SAMPLES:
            self._replan()
        self.sync_ticker()
