"""The memory proflet's agent half, loaded alone in the target (see :mod:`dyper.proflets.memory`)."""

from __future__ import annotations

import contextlib
import gc
import importlib
import math
import os
import sys
import sysconfig
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import CodeType, FunctionType, ModuleType
from typing import Any, ClassVar

from dyper.agent import procfs
from dyper.agent.proflet import Collector, DetailContext, ReportContext
from dyper.proflets.base import paired_best
from dyper.proflets.memory.common import DYPER, NO_FRAME, OTHER, UNWATCHED

#: dyper's own code (agent, proflets, monitor), whose allocations and
#: collections are not the application's sites.
OWN_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), pkg) + os.sep
    for pkg in ("agent", "proflets", "monitor")
)

#: The standard library's and the installed packages' folders: frames there
#: are passed over to the code that called them when deciding whose an
#: allocation is (see _dyper_s).
LIB_DIRS = tuple(
    sorted(
        {
            os.path.join(os.path.abspath(v), "")
            for k, v in sysconfig.get_paths().items()
            if k in ("stdlib", "platstdlib", "purelib", "platlib") and isinstance(v, str)
        }
    )
)


def _dyper_s(frames: Sequence[tuple[str, int]]) -> bool:
    """Whether an allocation is dyper's: the first frame, newest first, outside the libraries is dyper's own.

    msgpack's packb called by the agent is dyper's; the application's code
    started from a dyper frame further down (a bootstrap) is not.
    """
    for file, _ in frames:
        if file.startswith(OWN_DIRS):
            return True
        if not file.startswith(LIB_DIRS):
            return False
    return False


#: Sites the GC table keeps in the target; past it, new sites share one row.
MAX_GC_SITES = 500
#: Sites a burst reports (by bytes); the rest are summed in one row.
MAX_BURST_SITES = 50
#: A burst ends early once tracemalloc holds this much: reading the traces
#: holds the GIL about 1.7 us per trace (300k traces: 0.5 s), and 2 MB of
#: tracemalloc's tables hold some 30k traces (50 ms).
MAX_TRACE_MEMORY = 2 << 20
#: Weight a fold gives the mean pauses watched before it (see GcWatch._fold).
MEAN_DECAY = 0.9
#: Factor on the calibrated cost of one GC callback (see GcWatch).
CALLBACK_COST_MARGIN = 1.25

#: Share of the budget the GC callback may cost the application (see GcWatch);
#: the rest is for sampling and bursts.
BASIC_SHARE = 0.25
#: Share of the budget the passes that turn it on and off may cost, with their wake-ups.
PASS_SHARE = 0.1
#: The least share of the time the GC callback watches, and the shortest cycle it is a share of.
MIN_DUTY = 0.01
WATCH_CYCLE_S = 1.0
#: The first watch, which measures what watching costs before the first cycle is planned.
FIRST_WATCH_S = 0.1
#: The shortest watch: a few young collections of allocation-heavy code.
MIN_WATCH_S = 0.01


# --- agent half: the basic analysis -----------------------------------------------------


def gc_callback(own: tuple[str, ...]) -> tuple[Callable[[str, Any], None], list[Any]]:
    """A ``gc.callbacks`` callback charging each collection's pause to the line that triggered it.

    Returns the callback and its state: [key of the collection in progress,
    its start, collections seen, table]. The table maps (code, line, file)
    or one of DYPER, NO_FRAME, OTHER to [gen0, gen1, gen2 collections, and
    the seconds paused in each generation]; whoever reads it swaps in a
    new one (``state[3] = {}``), so the callback never waits for a reader.
    """
    state: list[Any] = [None, 0.0, 0, {}]
    getframe = sys._getframe
    clock = time.perf_counter

    def on_gc(phase: str, info: Any) -> None:
        try:
            if phase == "start":
                try:
                    # The frame running when the collection started: the callback is called from C.
                    frame = getframe(1)
                except ValueError:
                    state[0] = NO_FRAME
                else:
                    code = frame.f_code
                    file = code.co_filename
                    # The file too: code objects that differ only in it compare equal.
                    state[0] = DYPER if file.startswith(own) else (code, frame.f_lineno, file)
                state[1] = clock()
                return
            pause = clock() - state[1]
            key = state[0]
            if key is None:  # installed while a collection ran: its start was not seen
                return
            state[0] = None
            sites = state[3]
            row = sites.get(key)
            if row is None:
                if len(sites) >= MAX_GC_SITES:
                    key = OTHER
                    row = sites.get(key)
                if row is None:
                    row = sites[key] = [0, 0, 0, 0.0, 0.0, 0.0]
            generation = info["generation"]
            row[generation] += 1
            row[3 + generation] += pause
            state[2] += 1
        except Exception:  # nothing may reach the collection: it would print as unraisable
            pass

    return on_gc, state


def _young_collections(n: int) -> None:
    for _ in range(n):
        gc.collect(0)


def calibrate_callback() -> float:
    """Seconds one collection's two callback calls cost the thread that collects, measured here.

    Young collections with and without the callback (on a scratch table,
    taking the same path an application line does), best of three; the
    difference includes the info dict the collector builds only when there
    are callbacks.
    """
    callback, _ = gc_callback(())
    n = 200

    def unhook() -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(callback)

    plain, hooked = paired_best(3, lambda: _young_collections(n), lambda: gc.callbacks.append(callback), unhook)
    return CALLBACK_COST_MARGIN * max(0.0, hooked - plain) / n


def _site_of(key: Any) -> tuple[str, int, str]:
    if isinstance(key, str):
        return ("", 0, key)
    code, line, file = key
    return (file, int(line or 0), code.co_qualname)


def _collections() -> list[int]:
    return [int(s["collections"]) for s in gc.get_stats()][:3]


class GcWatch:
    """Collections, pauses and the sites that triggered them, since it was installed.

    Cumulative, so a report that never arrives loses nothing of the totals;
    a site's row is sent when it changed since the last report.

    The callback costs the collecting thread 3 to 5 us a collection (most of
    it the interpreter's call and info dict), and allocation-heavy code
    collects its young generation a thousand times a second or more: 0.3 to
    0.6% of the time, past a budget of 1%. So the watch keeps to a share
    of the budget (BASIC_SHARE): when watching all the time would cost
    more, it watches for part of every cycle (:meth:`pace`, from the
    agent's thread) and extrapolates what it saw, generation by
    generation, to the collections ``gc.get_stats`` counted meanwhile
    (exact whether watched or not): a ratio estimate, since collections are
    no likelier in one part of a cycle than another. Collections of a
    generation none of whose were watched in a cycle are put on one row
    (UNWATCHED), at the mean pause seen for that generation.
    """

    def __init__(self) -> None:
        #: calibrated seconds the callback costs the collecting thread, per collection
        self.callback_cost_s = calibrate_callback()
        # After the calibration, whose collections are ours.
        self._base = [(s["collections"], s["collected"], s["uncollectable"]) for s in gc.get_stats()]
        #: site -> [gen0, gen1, gen2 collections, seconds paused], all collections (extrapolated when partly watched)
        self._sites: dict[tuple[str, int, str], list[float]] = {}
        self._callback, self._state = gc_callback(OWN_DIRS)
        self._sent: dict[tuple[str, int, str], tuple[float, ...]] = {}
        #: share of the time watched, planned (1: all the time)
        self.duty = 1.0
        self.watching = True
        #: collections per generation when the table was last folded in, and whether all were watched since
        self._at_fold = _collections()
        self._whole = True
        #: collections watched and their pauses, per generation (mean pauses for the unwatched)
        self._seen: list[float] = [0.0, 0.0, 0.0]
        self._seen_pause = [0.0, 0.0, 0.0]
        #: seconds watched before the current watch, the current one's start, and callbacks then
        self._watched_s = 0.0
        self._on_since = time.perf_counter()
        self._callbacks_at = 0
        #: the callback's cost per second watched (moving average; None: not measured yet)
        self._rate: float | None = None
        #: what a call of pace() costs (moving average), and the cycle that pays for it
        self._pass_s = 0.0
        self._cycle_s = WATCH_CYCLE_S
        gc.callbacks.append(self._callback)

    def _fold(self) -> None:
        """Add what the callback saw since the last fold to the totals, extrapolated if not all was watched."""
        state = self._state
        pending, state[3] = state[3], {}
        now = _collections()
        totals = [a - b for a, b in zip(now, self._at_fold, strict=True)]
        self._at_fold = now
        whole, self._whole = self._whole, self.watching
        seen = [0, 0, 0]
        seen_pause = [0.0, 0.0, 0.0]
        for row in pending.values():
            for g in range(3):
                seen[g] += row[g]
                seen_pause[g] += row[3 + g]
        for g in range(3):
            # Recent collections weigh most: a growing heap's pauses grow.
            self._seen[g] = MEAN_DECAY * self._seen[g] + seen[g]
            self._seen_pause[g] = MEAN_DECAY * self._seen_pause[g] + seen_pause[g]
        # Watched all along: exact, as counted (a collection running while the
        # watch was installed is the only one missed).
        factors: list[float] = [1, 1, 1] if whole else [t / n if n else 0.0 for t, n in zip(totals, seen, strict=True)]
        # Partly watched: the collections are counted exactly, their pauses are
        # those counts times the mean pause of the generation over the recent
        # collections watched, not over this stretch's alone. A report can fold
        # a stretch a moment before the watch goes off: a few collections seen,
        # scaled up a thousandfold, made the share swing from 0.9 to 1.5 of the
        # truth run to run (planted_gc.py, 3.12, 1%). The sites share it as
        # they shared what was seen.
        pause_factors = list(factors)
        if not whole:
            for g in range(3):
                if seen_pause[g] > 0 and self._seen[g] > 0:
                    pause_factors[g] = totals[g] * (self._seen_pause[g] / self._seen[g]) / seen_pause[g]
        for key, row in pending.items():
            total = self._row(_site_of(key))
            for g in range(3):
                total[g] += row[g] * factors[g]
                total[3] += row[3 + g] * pause_factors[g]
        if not whole:
            for g in range(3):
                if seen[g] == 0 and totals[g] > 0:
                    total = self._row(("", 0, UNWATCHED))
                    total[g] += totals[g]
                    total[3] += totals[g] * (self._seen_pause[g] / self._seen[g] if self._seen[g] else 0.0)

    def _row(self, site: tuple[str, int, str]) -> list[float]:
        row = self._sites.get(site)
        if row is None:
            if len(self._sites) >= MAX_GC_SITES:
                site = ("", 0, OTHER)
                row = self._sites.get(site)
            if row is None:
                row = self._sites[site] = [0, 0, 0, 0.0]
        return row

    def pace(self, budget: float, wake_s: float = 0.0) -> float:
        """Watch or stop watching, to keep the callback within BASIC_SHARE of ``budget``; seconds to the next call.

        ``wake_s``: what waking the agent's thread for a call costs. Two calls a
        cycle, each with its wake-up, may cost PASS_SHARE of the budget: at
        0.1% on this VM a cycle is about five seconds, at 1% one.
        """
        now = time.perf_counter()
        try:
            return self._pace(now, budget)
        finally:
            took = time.perf_counter() - now
            self._pass_s += 0.3 * (took - self._pass_s)
            self._cycle_s = max(WATCH_CYCLE_S, 2 * (self._pass_s + wake_s) / (PASS_SHARE * budget or 1e-9))

    def _pace(self, now: float, budget: float) -> float:
        if self.watching:
            on_s = now - self._on_since
            callbacks = int(self._state[2])
            seen = callbacks - self._callbacks_at
            if on_s >= FIRST_WATCH_S or (seen and on_s > 0):
                rate = seen * self.callback_cost_s / on_s
                # Up at once, down slowly: a first watch during start-up sees few
                # collections, and averaging up from there overspent for ten cycles.
                if self._rate is None or rate > self._rate:
                    self._rate = rate
                else:
                    self._rate += 0.3 * (rate - self._rate)
            allowed = BASIC_SHARE * budget
            self.duty = 1.0 if not self._rate or self._rate <= allowed else max(MIN_DUTY, allowed / self._rate)
            if self.duty >= 1.0:
                # Measured afresh each cycle: the application may start collecting more.
                self._watched_s += on_s
                self._on_since, self._callbacks_at = now, callbacks
                return self._cycle_s if self._rate is not None else FIRST_WATCH_S
            self._unwatch(now)
            return max(0.0, self._cycle_s - on_s)
        # A cycle is over: fold it in whole (its watched part is the sample of it), then watch again.
        self._fold()
        self._state[0] = None  # a start seen before the watch was removed is not this one's
        self._on_since, self._callbacks_at = now, int(self._state[2])
        self.watching = True
        gc.callbacks.append(self._callback)
        return max(MIN_WATCH_S, self.duty * self._cycle_s)

    def _unwatch(self, now: float) -> None:
        """Take the callback out until the next pass; what it saw is scaled up at the next fold."""
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)
        self.watching = False
        self._whole = False
        self._watched_s += now - self._on_since

    def suspend(self) -> None:
        """Stop watching until the next pass (the agent paused)."""
        if self.watching:
            self._unwatch(time.perf_counter())

    def watched_s(self) -> float:
        """Seconds watched since installed."""
        return self._watched_s + (time.perf_counter() - self._on_since if self.watching else 0.0)

    def read(self) -> dict[str, Any]:
        self._fold()
        stats = gc.get_stats()
        gens = [
            [s["collections"] - b[0], s["collected"] - b[1], s["uncollectable"] - b[2]]
            for s, b in zip(stats, self._base, strict=False)
        ]
        pause = 0.0
        changed = []
        for site, total in self._sites.items():
            pause += total[3]
            values = tuple(total)
            if self._sent.get(site) != values:
                self._sent[site] = values
                changed.append([*site, *values])
        callbacks = int(self._state[2])
        return {
            "gc": gens,
            "pause_s": pause,
            "callbacks": callbacks,
            "callback_s": callbacks * self.callback_cost_s,
            "watched_s": self.watched_s(),
            "duty": self.duty,
            "sites": changed,
        }

    def close(self) -> None:
        self.watching = False
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)


# --- agent half: detailing, shared with memory_stacks -----------------------------------


def _codes_of(module: ModuleType) -> list[CodeType]:
    """Code objects of a module's functions, methods and what they define inside."""
    found: list[CodeType] = []
    seen: set[int] = set()

    def add(obj: object, depth: int = 0) -> None:
        if id(obj) in seen or depth > 8:
            return
        seen.add(id(obj))
        for _ in range(10):  # decorators that kept the original (functools.wraps)
            inner = getattr(obj, "__wrapped__", None) if isinstance(obj, FunctionType) else None
            if inner is None:
                break
            add(inner, depth + 1)
            obj = inner
        if isinstance(obj, FunctionType):
            found.append(obj.__code__)
        elif isinstance(obj, staticmethod | classmethod):
            add(obj.__func__, depth + 1)
        elif isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                if f is not None:
                    add(f, depth + 1)
        elif isinstance(obj, type) and obj.__module__ == module.__name__:
            for v in list(vars(obj).values()):
                add(v, depth + 1)

    for value in list(vars(module).values()):
        add(value)
    i = 0
    while i < len(found):
        found.extend(c for c in found[i].co_consts if isinstance(c, CodeType))
        i += 1
    return found


class FunctionNames:
    """(file, line) -> qualified name of the innermost function there.

    tracemalloc gives files and lines only. The names come from the code
    objects of the loaded module with that file; "<module>" for a line
    outside every function, "" when no loaded module has that file.
    """

    MAX_FILES = 256

    def __init__(self) -> None:
        self._spans: dict[str, list[tuple[int, int, str]] | None] = {}

    def _spans_of(self, file: str) -> list[tuple[int, int, str]] | None:
        modules = [m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == file]
        if not modules:
            return None
        spans = []
        for module in modules:
            for code in _codes_of(module):
                if code.co_filename != file:
                    continue
                lines = [line for _, _, line in code.co_lines() if line is not None]
                spans.append((min(code.co_firstlineno, *lines), max(code.co_firstlineno, *lines), code.co_qualname))
        return spans

    def __call__(self, file: str, line: int) -> str:
        if file not in self._spans:
            if len(self._spans) >= self.MAX_FILES:
                self._spans.clear()
            self._spans[file] = self._spans_of(file)
        spans = self._spans[file]
        if spans is None:
            return ""
        best, width = "<module>", sys.maxsize
        for first, last, name in spans:
            if first <= line <= last and last - first < width:
                best, width = name, last - first
        return best

    def forget(self) -> None:
        """Modules change between bursts (reloads, new imports): look again next time."""
        self._spans.clear()


def _churn(n: int) -> None:
    # The cheapest statement that allocates and frees: the worst case for tracemalloc.
    for i in range(n):
        _ = [i]


#: Mean bytes between two samples of the allocation sampler: a few hundred
#: samples a second of code allocating 100 MB/s, each a few reads; the hook's
#: count of every allocation costs 1 to 4 ns, the samples next to nothing.
SAMPLE_MEAN_BYTES = 256 << 10
#: Samples a burst keeps (8 frames each, about 150 bytes); past it the counts
#: still count and the sites are scaled to them.
MAX_SAMPLES = 8192


def _sampler() -> Any:
    """The C allocation sampler (``_fastsample.alloc_*``), or None where the extension is missing."""
    try:
        fast = importlib.import_module("dyper.agent._fastsample")
    except ImportError:
        return None
    return fast if hasattr(fast, "alloc_start") else None


#: Whether memory's bursts sample (the C extension loads) or trace with tracemalloc.
_SAMPLER_LOADS = _sampler() is not None


def _weigh(
    samples: Sequence[tuple[int, tuple[tuple[str, int], ...]]], mean: float, count: int, size: int
) -> list[tuple[tuple[tuple[str, int], ...], float, float]]:
    """Each sample as (frames, allocations, bytes) it stands for, summing to the exact ``count`` and ``size``.

    A Poisson process over the bytes samples an allocation of s bytes with
    probability p = 1 - exp(-s / mean), so it stands for 1/p allocations and
    s/p bytes (unbiased); scaled then to the totals the hook counted exactly,
    which also covers the samples dropped past MAX_SAMPLES.
    """
    weighed = []
    for s, frames in samples:
        p = -math.expm1(-s / mean) if s > 0 else 0.0
        if p > 0:
            weighed.append((frames, 1.0 / p, s / p))
    total_n = sum(w[1] for w in weighed)
    total_b = sum(w[2] for w in weighed)
    if total_n <= 0 or total_b <= 0:
        return []
    kn, kb = count / total_n, size / total_b
    return [(frames, n * kn, b * kb) for frames, n, b in weighed]


_live: weakref.WeakSet[AllocationSites] = weakref.WeakSet()
_fork_handler = False


def _after_fork_in_child() -> None:
    # The child has the parent's hooks but not its agent thread: nothing
    # would ever remove them. A new agent in the child installs its own.
    for collector in list(_live):
        with contextlib.suppress(Exception):
            collector.close()


class AllocationSites(Collector):
    """Allocation sites for a burst, through tracemalloc with NFRAME frames.

    The slowdown is calibrated, then charged pessimistically: tracemalloc
    hooks every allocation and free in every thread, and nothing counts
    them, so a burst is charged as if all the CPU time the application used
    during it went to allocating: that time times (1 - 1/F), F being how
    many times slower the cheapest allocating statement runs under tracing
    (measured here once, at the first burst: 10 to 20 with one frame, 70 to
    300 with eight, from the agent's thread).
    """

    DETAILS = True
    #: frames per traceback
    NFRAME: ClassVar[int] = 1
    #: frames tracemalloc keeps: one more than a site shows when it shows one,
    #: so that an allocation made in a library for dyper (msgpack's packb
    #: encoding a report) is known by its caller and left out with dyper's own
    TRACE_FRAMES: ClassVar[int] = 2
    # tracemalloc slows allocation, and so what cpu's call counts and io's
    # timings would see; threads and timing measure the kernel's figures.
    ALLOWS: ClassVar[frozenset[str]] = frozenset({"threads", "timing"})

    #: Sample allocations with the C hook where it loads, instead of tracing them
    #: with tracemalloc: what was allocated during the burst, not what is alive at its end.
    SAMPLED: ClassVar[bool] = False

    def __init__(self) -> None:
        global _fork_handler
        self._sampler = _sampler() if self.SAMPLED else None
        #: seconds each allocation costs under the sampler's hook, as calibrated
        self._per_alloc_s = 0.0
        self._names = FunctionNames()
        #: how many times slower allocation runs under our tracing (None: not measured yet)
        self._factor: float | None = None
        #: True while the tracing is ours (we started it and must stop it)
        self._ours = False
        self._running = False
        self._result: dict[str, Any] | None = None
        self._started = 0.0
        self._app_cpu0 = 0.0
        self._lost_s = 0.0
        _live.add(self)
        if not _fork_handler:
            # Once per process: os.register_at_fork cannot be undone.
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_handler = True

    def unavailable(self) -> str | None:
        try:
            import tracemalloc  # noqa: F401
        except ImportError:
            return "tracemalloc is not importable in the target"
        return None

    @staticmethod
    def _app_cpu() -> float:
        # Hooks run on the sampler thread, whose own time the agent charges already.
        return time.process_time() - time.thread_time()

    def _calibrate(self) -> float:
        if self._sampler is not None:
            return self._calibrate_sampler()
        import tracemalloc

        # Each traced allocation costs 0.3 us (one frame) to 5 us (eight): a short loop is enough.
        # (paired_best runs it twice per state and run.)
        n = 1000
        plain, hooked = paired_best(3, lambda: _churn(n), lambda: tracemalloc.start(self._frames()), tracemalloc.stop)
        return max(1.0, hooked / plain) if plain > 0 else 1.0

    def _calibrate_sampler(self) -> float:
        """How many times slower allocation runs hooked, and each allocation's cost (``_per_alloc_s``)."""
        fs = self._sampler
        assert fs is not None
        n = 20_000  # about a millisecond: the hook adds a few percent, within a timer's noise on less
        fs.alloc_start(float(SAMPLE_MEAN_BYTES), MAX_SAMPLES)
        _churn(n)
        counted = fs.alloc_stop()
        allocations = counted[0] if counted else 0
        plain, hooked = paired_best(
            3, lambda: _churn(n), lambda: fs.alloc_start(float(SAMPLE_MEAN_BYTES), MAX_SAMPLES), fs.alloc_stop
        )
        # At least a nanosecond: a noisy calibration must not make the hook free.
        self._per_alloc_s = max(1e-9, (hooked - plain) / allocations) if allocations else 5e-9
        return max(1.0, hooked / plain) if plain > 0 else 1.0

    def start_detail(self, ctx: DetailContext) -> None:
        import tracemalloc

        self._result, self._lost_s = None, 0.0
        self._ours = False
        if tracemalloc.is_tracing():
            # The application's tracing (or another tool's) is left as it is.
            # Its traces hold everything since it began (dyper's agent adds
            # some 50k when it attaches), with its frames: reading them would
            # stop the application for about a second, and could only tell
            # what grew, not what was allocated.
            self._result = {"skipped": "the application traces allocations itself (tracemalloc): left alone"}
        else:
            if self._factor is None:
                self._factor = self._calibrate()
            if self._sampler is not None:
                try:
                    self._sampler.alloc_start(float(SAMPLE_MEAN_BYTES), MAX_SAMPLES)
                except RuntimeError as exc:  # another hook went over ours once: we stay out
                    self._result = {"skipped": str(exc)}
                else:
                    self._ours = True
            else:
                tracemalloc.start(self._frames())
                self._ours = True
        self._running = True
        self._started = time.perf_counter()
        self._app_cpu0 = self._app_cpu()

    def _stop_tracing(self) -> Any:
        """Stop what the burst started; the sampler's counts and samples, if it ran."""
        if self._ours:
            self._ours = False
            if self._sampler is not None:
                return self._sampler.alloc_stop()
            import tracemalloc

            tracemalloc.stop()
        return None

    def _charge(self) -> None:
        if not self._ours:
            return  # nothing of ours slowed the application
        if self._sampler is not None:
            # The hook counts every allocation: each cost what the calibration measured.
            lost = self._sampler.alloc_state()[3] * self._per_alloc_s
        else:
            lost = (self._app_cpu() - self._app_cpu0) * (1.0 - 1.0 / (self._factor or 1.0))
        # Monotonic: the agent charges what it has not charged yet.
        self._lost_s = max(self._lost_s, lost)

    def slowdown_s(self) -> float:
        if self._running and self._ours:
            self._charge()
            if self._sampler is None:
                import tracemalloc

                if tracemalloc.get_tracemalloc_memory() > MAX_TRACE_MEMORY:
                    self._finish()  # bound what reading the traces costs, and what tracing holds
        return self._lost_s

    def _finish(self) -> None:
        """End the tracing and keep its sites (the burst may go on until the agent stops it)."""
        import tracemalloc

        if not self._running:
            return
        self._running = False
        length = time.perf_counter() - self._started
        if self._result is not None:  # skipped at the start
            self._result["length_s"] = length
            return
        self._charge()
        if self._sampler is not None:
            self._finish_sampled(length)
            return
        if not tracemalloc.is_tracing():
            self._ours = False  # the application stopped it under us: nothing of ours to stop
            self._result = {"length_s": length, "skipped": "tracemalloc was stopped during the burst"}
            return
        traces = _raw_traces()
        limit = tracemalloc.get_traceback_limit()
        self._stop_tracing()
        self._result = self._rows(self._aggregate(traces, limit), length)
        self._result["nframe"] = min(self.NFRAME, limit)
        self._result["factor"] = self._factor

    def _finish_sampled(self, length: float) -> None:
        seen = self._stop_tracing()
        if seen is None:
            self._result = {"length_s": length, "skipped": "the allocation sampler was not running"}
            return
        count, size, dropped, samples = seen
        n = self.NFRAME
        by_traceback: dict[tuple[Any, ...], list[float]] = {}
        for frames, allocations, nbytes in _weigh(samples, SAMPLE_MEAN_BYTES, count, size):
            # No Python frame: an allocation in a thread's start, or C code on its own.
            key = () if _dyper_s(frames) else (frames[:n] or (("<unknown>", 0),))
            row = by_traceback.setdefault(key, [0.0, 0.0])
            row[0] += allocations
            row[1] += nbytes
        self._result = self._rows(by_traceback, length)
        self._result["nframe"] = n
        self._result["factor"] = self._factor
        self._result["sampled"] = {
            "allocations": count,
            "bytes": size,
            "samples": len(samples),
            "dropped": dropped,
            "mean_bytes": SAMPLE_MEAN_BYTES,
        }

    def _frames(self) -> int:
        return max(self.NFRAME, self.TRACE_FRAMES)

    def _aggregate(self, traces: Iterable[tuple[Any, ...]], limit: int) -> dict[tuple[Any, ...], list[int]]:
        """(count, bytes) per traceback (newest frame first, NFRAME frames at most).

        dyper's own allocations (any frame kept in dyper's code: the agent
        encoding a report through msgpack, say) go under the empty traceback.
        """
        n = min(self.NFRAME, limit)
        out: dict[tuple[Any, ...], list[int]] = {}
        for trace in traces:
            frames = trace[2]
            key = () if _dyper_s(frames) else frames[:n]
            row = out.get(key)
            if row is None:
                out[key] = [1, trace[1]]
            else:
                row[0] += 1
                row[1] += trace[1]
        return out

    def _rows(self, by_traceback: Mapping[tuple[Any, ...], Sequence[float]], length: float) -> dict[str, Any]:
        own = [0.0, 0.0]
        other = [0.0, 0.0]
        mine: list[tuple[tuple[Any, ...], list[float]]] = []
        for tb, (count, size) in by_traceback.items():
            if not tb or tb[0][0].startswith(OWN_DIRS):
                own[0] += count
                own[1] += size
            else:
                mine.append((tb, [count, size]))
        mine.sort(key=lambda kv: -kv[1][1])
        for _, (count, size) in mine[MAX_BURST_SITES:]:
            other[0] += count
            other[1] += size
        self._names.forget()
        sites = []
        for tb, (count, size) in mine[:MAX_BURST_SITES]:
            file, line = tb[0]
            # "<unknown>": tracemalloc saw no Python frame (a thread starting, C code on its own).
            name = NO_FRAME if file == "<unknown>" else self._names(file, line)
            row: list[Any] = [file, line, name, count, size]
            if self.NFRAME > 1:
                row.append([[f, ln, self._names(f, ln)] for f, ln in tb[1:]])
            sites.append(row)
        return {"length_s": length, "sites": sites, "dyper": own, "other": other}

    def stop_detail(self) -> dict[str, Any]:
        self._finish()
        result = self._result if self._result is not None else {"length_s": 0.0, "skipped": "no burst"}
        result.setdefault("sites", [])
        result["slowdown_s"] = self._lost_s
        self._result = None
        return result

    def close(self) -> None:
        self._running = False
        self._stop_tracing()
        _live.discard(self)


def _raw_traces() -> list[tuple[Any, ...]]:
    """tracemalloc's traces as plain tuples: (domain, size, frames newest first, total frames).

    What ``tracemalloc.take_snapshot()`` wraps. Its ``statistics()`` builds a
    Traceback object per trace: 2 to 20 seconds for 300k traces, against a
    few tens of milliseconds to count the tuples here.
    """
    import tracemalloc

    traces: list[tuple[Any, ...]] = tracemalloc._get_traces()  # type: ignore[attr-defined]
    return traces


class MemoryCollector(AllocationSites):
    """The basic analysis (RSS, GC) at every report, and allocation sites with one frame for a burst."""

    name = "memory"
    SAMPLED = True
    if _SAMPLER_LOADS:
        # The sampler's hook costs allocation-heavy code a few percent (1 to
        # 4 ns an allocation) and a burst ends reading a few thousand
        # samples: long bursts, so they see the threads that hold the GIL a
        # part of the time. Calibrated from the bursts as ever.
        OVHD_MS = 3.0
        SLOW = 0.08
        ITVL_MS = 2000.0
        # A few percent slower allocation changes no count or timing another
        # proflet takes; tracemalloc (memory_stacks) would wrap the hook, and
        # heap's census allocates a list of every object.
        ALLOWS = frozenset({"cpu", "io", "threads", "timing"})
    else:
        # tracemalloc. Measured: the first burst calibrates its slowdown (a
        # few ms); each ends reading its traces: 21 to 24 ms a burst of
        # planted_memory.py.
        OVHD_MS = 25.0
        # Allocation-heavy code runs about ten times slower traced with one
        # frame: a CPU-bound process loses nine tenths of the burst.
        SLOW = 9.0
        # Short bursts, more often: what a burst sees is what is still alive
        # at its end, and reading it costs in proportion.
        ITVL_MS = 500.0
    PRTY = 0.3
    NFRAME = 1
    # Its passes turn the GC callback off when watching all the time costs too much.
    POLL_IN_DEBT = True

    def __init__(self) -> None:
        super().__init__()
        self._watch: GcWatch | None = GcWatch()

    def unavailable(self) -> str | None:
        # The basic analysis needs only the gc module; a CPython without
        # tracemalloc would fail its bursts, and the agent says so then.
        return None

    def basic_cost_s(self) -> float:
        # the gc callback runs in the collecting thread: calibrated cost times callbacks
        watch = self._watch
        return int(watch._state[2]) * watch.callback_cost_s if watch is not None else 0.0

    def poll(self, now: float, budget: float, wake_s: float) -> float:
        # Watching collections is the one standing cost: kept to a share of the budget.
        return self._watch.pace(budget, wake_s) if self._watch is not None else math.inf

    def pause(self, paused: bool) -> None:
        # Paused, nothing of ours runs in the application's threads: the callback neither.
        if paused and self._watch is not None:
            self._watch.suspend()

    def report(self, ctx: ReportContext) -> dict[str, Any] | None:
        if self._watch is None:
            return None
        data = self._watch.read()
        rss = procfs.rss_bytes()
        if rss is None:  # no /proc: the peak is what there is
            import resource

            rss = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
        data["rss"] = rss
        data["callback_cost_s"] = self._watch.callback_cost_s
        return data

    def close(self) -> None:
        super().close()
        if self._watch is not None:
            self._watch.close()
            self._watch = None


COLLECTOR = MemoryCollector
