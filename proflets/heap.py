"""The heap proflet: a census of live objects by type, and the types that leak (DYPER section 5.4).

No basic analysis: the samples say nothing about the heap. Detailing is a
census: every object the garbage collector tracks (``gc.get_objects()``:
every instance of a Python class and every container; not ints, floats,
strings or bytes, which it does not track), counted by type, with the
bytes they take (``sys.getsizeof``, the object itself, not what it refers
to). The monitor keeps the censuses and flags the types whose count keeps
growing as leak suspects, with their growth per minute.

A census stops the world: ``gc.get_objects()`` lists the objects with the
GIL held throughout, and the counting that follows holds it too, in chunks
(threads get it back between chunks, but the application is stalled for
the whole census's CPU time, which is what is charged). Its cost grows
with the heap, so, as DYPER's heap proflet does, the collector tracks the
worst census seen: OVHD is declared as the census expected at start plus
a margin, each burst reports the worst census and that plus the margin
(the agent then calibrates OVHD from what it measures, as for every
proflet), and a maximum pause (``DYPER_HEAP_MAX_PAUSE_MS``, default
200 ms) keeps a huge heap from being scanned at all: a census expected to
take longer, from the worst rates of the recent censuses, is skipped, and
the report says why.

How a census is kept cheap (1,000,000 objects in 120 to 170 ms on a 2-core
VM, ``bench/heap_census.py``): counting is C loops only
(``Counter(map(type, chunk))``, about 100 ns an object; a Python loop over
every object with ``sys.getsizeof`` took four to five times as long);
bytes come from a systematic sample of at most ``SIZE_SAMPLE`` objects
(every k-th of the list), a type's bytes being its exact count times its
mean sampled size. Below ``SIZE_SAMPLE`` objects, or for a type whose
instances all have one size (most classes), the bytes are exact; a rare
large object in the sample (one huge list) weighs k times its size.
Objects ``gc.freeze()`` moved out of the collector's lists are not seen.

No application code runs in a census: types are read through ``type``'s
own descriptors (a metaclass cannot intercept them), and a type whose
``__sizeof__`` is written in Python is sized with ``object.__sizeof__``
(its basic size) instead of calling it. The one exception is a metaclass
with its own ``__hash__`` (types are counted in a dict), which no standard
library metaclass has; a census that fails is skipped, with the reason.

The list of every object keeps them all alive while the census runs, so
an object the application drops meanwhile is freed when the list is, on
dyper's thread: its ``__del__`` would run there, as it may on any thread
whose allocation starts a garbage collection. The list goes first.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
import types
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any, ClassVar

from dyper.agent import procfs
from dyper.agent.budget import ProfletCosts
from dyper.agent.proflet import Collector, DetailContext, ReportContext
from dyper.proflets.base import Analyzer, ReportView, SessionView, Status, confidence_of

#: The maximum pause when DYPER_HEAP_MAX_PAUSE_MS does not say otherwise, ms.
MAX_PAUSE_MS = 200.0
MAX_PAUSE_VAR = "DYPER_HEAP_MAX_PAUSE_MS"
#: OVHD is the worst census seen plus this share of it.
MARGIN = 0.25
#: Objects counted per C call: threads may take the GIL between chunks.
#: About 5 ms of counting on a 2-core VM.
CHUNK = 50_000
#: Objects sized per census at most (a systematic sample beyond that).
SIZE_SAMPLE = 10_000
#: Types sent per census: the most numerous (a leak shows up in the count
#: first) and the largest by bytes (for the table).
TYPES_BY_COUNT = 300
TYPES_BY_BYTES = 50

_type_dict = type.__dict__
# type's own descriptors: reading through them runs no metaclass code.
_MRO = _type_dict["__mro__"]
_DICT = _type_dict["__dict__"]
_MODULE = _type_dict["__module__"]
_QUALNAME = _type_dict["__qualname__"]
_BASICSIZE = _type_dict["__basicsize__"]
_OBJECT_SIZEOF = object.__sizeof__
#: __sizeof__ implementations written in C: calling them runs no application code.
_C_CALLABLES = (
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.BuiltinFunctionType,
    types.ClassMethodDescriptorType,
)


def max_pause_ms(environ: Mapping[str, str] = os.environ) -> float:
    """The maximum pause: DYPER_HEAP_MAX_PAUSE_MS, or MAX_PAUSE_MS when unset or not a positive number."""
    try:
        value = float(environ.get(MAX_PAUSE_VAR, ""))
    except ValueError:
        return MAX_PAUSE_MS
    return value if value > 0 and math.isfinite(value) else MAX_PAUSE_MS


def type_name(t: type) -> str:
    """module.qualname of a type (builtins without their module, as their repr has it)."""
    try:
        module = _MODULE.__get__(t)
        qualname = _QUALNAME.__get__(t)
    except Exception:  # a broken extension type
        return "?"
    if not isinstance(module, str):
        module = "?"
    if not isinstance(qualname, str):
        qualname = "?"
    return qualname if module == "builtins" else f"{module}.{qualname}"


def _c_sizeof(t: type) -> bool:
    """Whether ``t``'s __sizeof__ is written in C (so sys.getsizeof runs no application code)."""
    for klass in _MRO.__get__(t):
        found = _DICT.__get__(klass).get("__sizeof__")
        if found is not None:
            return isinstance(found, _C_CALLABLES)
    return False


def _gc_header() -> int:
    """What sys.getsizeof adds to __sizeof__ for a tracked object (the GC header)."""

    class Probe:
        pass

    p = Probe()
    return max(0, sys.getsizeof(p) - p.__sizeof__())


GC_HEADER = _gc_header()


def count_types(objs: list[Any]) -> Counter[type]:
    """Objects per type, in C loops of CHUNK objects (between them other threads may run)."""
    counts: Counter[type] = Counter()
    it = iter(objs)
    for _ in range(0, len(objs), CHUNK):
        counts.update(map(type, islice(it, CHUNK)))
    return counts


def _sizeof_is_c(t: type) -> bool:
    try:
        return _c_sizeof(t)
    except Exception:
        return False


def _size_of(o: Any, c_sizeof: bool) -> int | None:
    """sys.getsizeof where that runs no application code, else the basic size; None if it fails."""
    try:
        return sys.getsizeof(o) if c_sizeof else _OBJECT_SIZEOF(o) + GC_HEADER
    except Exception:
        return None


def sample_sizes(objs: Sequence[Any]) -> tuple[dict[type, list[int]], int]:
    """Bytes per type of every k-th object: type -> [objects sized, their bytes], and k.

    The sizes are taken in one C loop when every type in the sample has a
    C ``__sizeof__`` (the usual case), object by object otherwise.
    """
    k = max(1, math.ceil(len(objs) / SIZE_SAMPLE))
    sample = objs[::k]
    kinds = list(map(type, sample))
    c_sizeof = {t: _sizeof_is_c(t) for t in set(kinds)}
    sizes: list[int | None] | None = None
    if all(c_sizeof.values()):
        try:
            sizes = list(map(sys.getsizeof, sample))
        except Exception:  # one __sizeof__ failed: size them one by one, leaving it out
            sizes = None
    if sizes is None:
        sizes = [_size_of(o, c_sizeof[t]) for o, t in zip(sample, kinds, strict=True)]
    del sample
    out: dict[type, list[int]] = {t: [0, 0] for t in c_sizeof}
    for t, size in zip(kinds, sizes, strict=True):
        if size is not None:
            entry = out[t]
            entry[0] += 1
            entry[1] += size
    return {t: v for t, v in out.items() if v[0]}, k


@dataclass
class CensusCost:
    """Seconds one census took, by part, with what each part went through."""

    #: listing the objects (gc.get_objects), counting them by type, sizing the sample
    list_s: float = 0.0
    count_s: float = 0.0
    size_s: float = 0.0
    objects: int = 0
    sized: int = 0

    @property
    def total_s(self) -> float:
        return self.list_s + self.count_s + self.size_s


def census(objs: list[Any], cost: CensusCost | None = None) -> tuple[dict[str, list[int]], int]:
    """Type name -> [count, bytes] of ``objs``, and the sampling step of the sizes (1: exact).

    ``cost``, if given, gets the counting and sizing times (CPU seconds of this thread).
    """
    t0 = time.thread_time()
    counts = count_types(objs)
    t1 = time.thread_time()
    sizes, k = sample_sizes(objs)
    t2 = time.thread_time()
    if cost is not None:
        cost.count_s, cost.size_s = t1 - t0, t2 - t1
        cost.objects, cost.sized = len(objs), len(range(0, len(objs), k))
    by_name: dict[str, list[int]] = {}
    for t, n in counts.items():
        sized = sizes.get(t)
        if sized is not None:
            nbytes = round(n * sized[1] / sized[0])
        else:  # no instance in the sample: its basic size
            try:
                nbytes = n * (int(_BASICSIZE.__get__(t)) + GC_HEADER)
            except Exception:
                nbytes = 0
        # Types of one name (a class made afresh in a function, say) are one row.
        row = by_name.setdefault(type_name(t), [0, 0])
        row[0] += n
        row[1] += nbytes
    return by_name, k


def top_types(by_name: Mapping[str, Sequence[int]]) -> list[list[Any]]:
    """The rows a census sends: the most numerous types and the largest, [name, count, bytes]."""
    by_count = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:TYPES_BY_COUNT]
    by_bytes = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TYPES_BY_BYTES]
    rows = dict(by_count)
    rows.update(by_bytes)
    return [[name, int(v[0]), int(v[1])] for name, v in rows.items()]


def calibrate() -> CensusCost:
    """A census of a small synthetic heap (5,000 objects, best of three), for the first estimate."""

    class Item:
        def __init__(self, i: int) -> None:
            self.i = i

    objs: list[Any] = []
    for i in range(1250):
        item = Item(i)
        objs += (item, {"i": item}, [item], (item, i))
    best = CensusCost(count_s=math.inf)
    for _ in range(3):
        cost = CensusCost()
        census(objs, cost)
        if cost.total_s < best.total_s:
            best = cost
    return best


#: Censuses whose rates the next estimate takes the worst of: recent ones,
#: so that one census slowed by a busy machine does not skip every later one.
RATES_KEPT = 5


@dataclass
class CostModel:
    """What a census will take: the worst of the recent censuses' rates, applied to the heap now."""

    #: per recent census: seconds per object listing and counting, per object sized
    rates: deque[tuple[float, float, float]]
    #: objects per memory block at the last census
    objects_per_block: float
    #: the rates are a guess from a synthetic heap, not yet from a census
    guessed: bool = True

    @classmethod
    def first_guess(cls) -> CostModel:
        # Counting and sizing as measured on a synthetic heap; listing is a
        # C walk over the GC's lists, a quarter of counting's cost on real
        # heaps (bench/heap_census.py), guessed at half; about two memory
        # blocks per tracked object (the object and its items' storage, or a string).
        c = calibrate()
        count_s = c.count_s / c.objects
        return cls(deque([(count_s / 2, count_s, c.size_s / c.sized)], maxlen=RATES_KEPT), 0.5)

    def expected_s(self, objects: float, listed_s: float | None = None) -> float:
        """A census of ``objects`` (``listed_s``: the listing already took that long)."""
        sized = min(objects, SIZE_SAMPLE)
        return max(
            (objects * per_list if listed_s is None else listed_s) + objects * per_count + sized * per_size
            for per_list, per_count, per_size in self.rates
        )

    def learn(self, cost: CensusCost, blocks: int) -> None:
        if self.guessed:
            self.rates.clear()
            self.guessed = False
        n = max(cost.objects, 1)
        self.rates.append((cost.list_s / n, cost.count_s / n, cost.size_s / max(cost.sized, 1)))
        self.objects_per_block = cost.objects / max(blocks, 1)


class HeapCollector(Collector):
    """A census of the live objects by type, once per burst (the burst itself is nothing more).

    Before it lists anything, the census estimates its length from the
    memory blocks Python has allocated (``sys.getallocatedblocks()``: cheap),
    the objects per block at the last census and the worst seconds per
    object of the last RATES_KEPT censuses; once the objects are listed,
    from their number. Either estimate above the maximum pause skips the
    census. Before the first census the rates come from a census of a small
    synthetic heap.
    """

    name = "heap"
    #: declared at load from the heap there is then (see costs())
    OVHD_MS = 20.0
    SLOW = 0.0
    #: the census is done when the burst starts; the burst holds nothing
    ITVL_MS = 10.0
    PRTY = 0.3
    # The census stops every thread for its length: the others measure
    # around it as they would around a long GIL hold. Allocation tracing
    # (memory) would see the census's own list of every object.
    ALLOWS: ClassVar[frozenset[str]] = frozenset({"cpu", "io", "threads", "timing"})
    DETAILS = True

    def __init__(self) -> None:
        self.max_pause_s = max_pause_ms() / 1000.0
        self._model: CostModel | None = None
        #: the longest census so far, CPU seconds
        self.worst_s = 0.0
        self._result: dict[str, Any] = {}
        self._started = 0.0

    @property
    def model(self) -> CostModel:
        if self._model is None:
            self._model = CostModel.first_guess()
        return self._model

    def costs(self) -> ProfletCosts:
        # OVHD: what a census of the heap there is now is expected to take, plus the margin.
        expected = self.model.expected_s(sys.getallocatedblocks() * self.model.objects_per_block)
        return replace(super().costs(), ovhd_ms=max(1.0, 1000.0 * expected * (1.0 + MARGIN)))

    def start_detail(self, ctx: DetailContext) -> None:
        self._started = time.perf_counter()
        self._result = self.take_census()

    def _skip(self, why: str, expected_s: float) -> dict[str, Any]:
        return {"skipped": why, "expected_ms": 1000.0 * expected_s, "max_pause_ms": 1000.0 * self.max_pause_s}

    def _too_long(self, why: str, expected_s: float) -> dict[str, Any]:
        pause = f"{self.max_pause_s * 1000:,.6g} ms ({MAX_PAUSE_VAR})"
        return self._skip(f"{why}, more than the maximum pause of {pause}", expected_s)

    def take_census(self) -> dict[str, Any]:
        """One census, or why it was skipped (plain data, as the burst result carries it)."""
        model = self.model
        blocks = sys.getallocatedblocks()
        expected = model.expected_s(blocks * model.objects_per_block)
        if expected > self.max_pause_s:
            return self._too_long(f"expected {expected * 1000:,.0f} ms from {blocks:,} memory blocks", expected)
        at = time.time()
        cost = CensusCost()
        t0, wall0 = time.thread_time(), time.perf_counter()
        objs = gc.get_objects()
        try:
            cost.list_s, pause_s = time.thread_time() - t0, time.perf_counter() - wall0
            n = len(objs)
            expected = model.expected_s(n, cost.list_s)
            if expected > self.max_pause_s:
                # The blocks misled the first estimate: next time they will not.
                model.objects_per_block = max(model.objects_per_block, n / max(blocks, 1))
                return self._too_long(f"expected {expected * 1000:,.0f} ms for {n:,} objects", expected)
            try:
                by_name, k = census(objs, cost)
            except Exception as exc:  # a metaclass's __hash__ raised, say: this census is lost, not the proflet
                return self._skip(f"the census failed ({type(exc).__name__}: {exc})", expected)
        finally:
            del objs  # it holds every object alive: gone before anything else
        model.learn(cost, blocks)
        self.worst_s = max(self.worst_s, cost.total_s)
        return {
            "at": at,
            "objects": n,
            "bytes": sum(v[1] for v in by_name.values()),
            "types_seen": len(by_name),
            "types": top_types(by_name),
            "sampled_every": k,
            "scan_ms": 1000.0 * cost.total_s,
            "pause_ms": 1000.0 * pause_s,
            "worst_scan_ms": 1000.0 * self.worst_s,
            "ovhd_ms": 1000.0 * self.worst_s * (1.0 + MARGIN),
            "max_pause_ms": 1000.0 * self.max_pause_s,
        }

    def stop_detail(self) -> dict[str, Any]:
        result, self._result = self._result, {}
        # Nothing slows the application between start and stop: the census's
        # own time is the burst's fixed cost, which the agent measures.
        return {"length_s": time.perf_counter() - self._started, "slowdown_s": 0.0, **result}

    def report(self, ctx: ReportContext) -> dict[str, Any] | None:
        # The process's size, for the priority (memory growth); one small read.
        rss = procfs.rss_bytes()
        return {"rss": rss} if rss is not None else None

    def close(self) -> None:
        self._result = {}


# --- monitor half ------------------------------------------------------------------

#: A type is a leak suspect when its count was at a new high in each of this
#: many consecutive censuses ...
LEAK_CENSUSES = 5
#: ... and grew by at least this many objects and this share of its count over them.
LEAK_MIN_GROWTH = 20
LEAK_MIN_SHARE = 0.01
#: Censuses kept (a new high is against all of them); reports kept for the priority.
CENSUSES_KEPT = 120
RSS_REPORTS = 50
#: Rows of the types table: the largest by bytes, plus every suspect.
TABLE_ROWS = 20
#: Censuses and rows per census kept in the monitor's history.
STATE_CENSUSES = 12
STATE_ROWS = 100


Census = tuple[float, Mapping[str, Any], dict[str, tuple[int, int]]]


def growth(series: Sequence[tuple[float, int]]) -> tuple[int, float | None, bool]:
    """How one type's count moved over the censuses, from its (time, count) series, oldest first.

    Returns the censuses of its current growth run (the trailing censuses
    that each set a new high, beating every count before them, and the
    census the run started from; 0 with no run), its growth per minute
    (over the run, or with no run over the last LEAK_CENSUSES censuses;
    None with fewer than two censuses), and whether it is a leak suspect: a
    run of at least LEAK_CENSUSES new highs, growing by at least
    LEAK_MIN_GROWTH objects and LEAK_MIN_SHARE of its count.
    """
    if len(series) < 2:
        return 0, None, False
    highs = [False] * len(series)
    best = series[0][1]
    for i in range(1, len(series)):
        highs[i] = series[i][1] > best
        best = max(best, series[i][1])
    steps = 0
    while steps < len(series) - 1 and highs[-1 - steps]:
        steps += 1
    back = steps or min(len(series) - 1, LEAK_CENSUSES)
    (t0, c0), (t1, c1) = series[-1 - back], series[-1]
    per_min = (c1 - c0) / (t1 - t0) * 60.0 if t1 > t0 else None
    suspect = steps >= LEAK_CENSUSES and c1 - c0 >= max(LEAK_MIN_GROWTH, LEAK_MIN_SHARE * c0)
    return (steps + 1 if steps else 0), per_min, suspect


class HeapAnalyzer(Analyzer):
    """The censuses of one process, their types' growth, and the leak suspects."""

    name = "heap"

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        #: (time, totals, type name -> (count, bytes)), oldest first
        self.censuses: deque[Census] = deque(maxlen=CENSUSES_KEPT)
        self.total = 0
        self.skipped = 0
        self.skip_reason: str | None = None
        self.max_pause_ms: float | None = None
        self.worst_scan_ms = 0.0
        #: the whole run's types as last judged (status, findings and priority ask often)
        self._judged: list[dict[str, Any]] | None = None

    def merge(self, report: ReportView) -> None:
        data = report.data
        if data and isinstance(data.get("rss"), int):
            self.rows.append((report.t, int(data["rss"])))

    def merge_detail(self, burst: Mapping[str, Any]) -> None:
        if isinstance(burst.get("max_pause_ms"), int | float):
            self.max_pause_ms = float(burst["max_pause_ms"])
        if burst.get("skipped"):
            self.skipped += 1
            self.skip_reason = f"heap census skipped: {burst['skipped']}"
            return
        if "types" not in burst:
            return
        t = float(burst.get("at") or burst.get("t") or 0.0)
        rows = {str(name): (int(count), int(nbytes)) for name, count, nbytes in burst["types"]}
        totals = {k: burst.get(k) for k in ("objects", "bytes", "types_seen", "sampled_every", "scan_ms", "pause_ms")}
        self.censuses.append((t, totals, rows))
        self._judged = None
        self.total += 1
        self.worst_scan_ms = max(self.worst_scan_ms, float(burst.get("scan_ms") or 0.0))
        self.skip_reason = None  # the last word is the census that ran

    def _window(self, start: float | None, end: float | None) -> list[Census]:
        if start is None and end is None:
            return list(self.censuses)
        return [c for c in self.censuses if (start is None or c[0] > start) and (end is None or c[0] <= end)]

    def _types(self, censuses: Sequence[Census]) -> list[dict[str, Any]]:
        """Every type of the last census: count, bytes, growth per minute, suspect or not."""
        if not censuses:
            return []
        out = []
        for name, (count, nbytes) in censuses[-1][2].items():
            run, per_min, suspect = growth([(t, rows.get(name, (0, 0))[0]) for t, _, rows in censuses])
            out.append(
                {
                    "type": name,
                    "count": count,
                    "bytes": nbytes,
                    "growth_per_min": per_min,
                    "suspect_leak": suspect,
                    "censuses_growing": run,
                }
            )
        return out

    def _whole_run(self) -> list[dict[str, Any]]:
        if self._judged is None:
            self._judged = self._types(list(self.censuses))
        return self._judged

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        censuses = self._window(start, end)
        every = self._whole_run() if start is None and end is None else self._types(censuses)
        by_bytes = sorted(every, key=lambda r: -r["bytes"])
        table = by_bytes[:TABLE_ROWS] + [r for r in by_bytes[TABLE_ROWS:] if r["suspect_leak"]]
        out: dict[str, Any] = {
            "types": table,
            "censuses": len(censuses),
            "skipped": self.skipped,
            "skip_reason": self.skip_reason,
            "max_pause_ms": self.max_pause_ms,
            "worst_scan_ms": self.worst_scan_ms,
        }
        if censuses:
            t, totals, _ = censuses[-1]
            out.update({"census_at": t, **totals})
        elif not self.skipped:
            out["note"] = self._none_yet()
        return out

    def _none_yet(self) -> str:
        """Why there is no census yet, in words: the planned cost against what the budget can save up."""
        from dyper.agent.budget import Guard

        agents = list(self.session.agents.values())
        if agents and not any(self.name in agent.proflets for agent in agents):
            return "the heap proflet is not running in the target: name it (DYPER_PROFLETS=...,heap)"
        for agent in agents:
            state = agent.proflets.get(self.name) or {}
            planned = state.get("ovhd_ms")
            if isinstance(planned, int | float) and agent.budget > 0:
                guard = Guard(agent.budget, 0.0)
                bucket_ms = 1000.0 * guard.rate * guard.capacity_s
                if planned > bucket_ms:
                    return (
                        f"no census yet: one is expected to take {planned:.0f} ms, more than a "
                        f"{100 * agent.budget:g}% budget saves up ({bucket_ms:.0f} ms)"
                    )
        return "no census yet"

    def suspects(self) -> list[dict[str, Any]]:
        rows = [r for r in self._whole_run() if r["suspect_leak"]]
        return sorted(rows, key=lambda r: -(r["growth_per_min"] or 0.0))

    def status(self) -> Status:
        # A problem when something leaks: the more types, the surer it is not one odd cache.
        found = self.suspects()
        problem = min(1.0, 0.6 + 0.1 * len(found)) if found else 0.0
        return Status(problem, confidence_of(len(self.censuses), half=LEAK_CENSUSES))

    def findings(self) -> list[str]:
        words = [
            f"instances of {r['type']} grew by {r['growth_per_min']:,.0f}/min over "
            f"{r['censuses_growing']} censuses: a leak?"
            for r in self.suspects()[:3]
        ]
        if self.skip_reason:
            words.append(self.skip_reason)
        return words

    def _rss_growth(self) -> float:
        """Relative growth of the process's size over the last RSS_REPORTS reports (0 when it did not grow)."""
        recent: list[int] = [int(rss) for _, rss in list(self.rows)[-RSS_REPORTS:]]
        if len(recent) < 2 or min(recent) <= 0:
            return 0.0
        return max(0.0, (recent[-1] - min(recent)) / min(recent))

    def priority(self) -> float | None:
        # Memory growth makes a census worth more; suspects make the next one
        # worth more still (to follow them). Never nothing: a leak must be
        # seen to be found.
        prty = min(1.0, 0.2 + 5.0 * self._rss_growth())
        return max(prty, 0.6) if self.suspects() else prty

    def state(self) -> dict[str, Any]:
        kept = []
        for t, totals, rows in list(self.censuses)[-STATE_CENSUSES:]:
            top = sorted(rows.items(), key=lambda kv: -kv[1][0])[:STATE_ROWS]
            kept.append([t, dict(totals), [[name, c, b] for name, (c, b) in top]])
        return {
            "censuses": kept,
            "total": self.total,
            "skipped": self.skipped,
            "skip_reason": self.skip_reason,
            "max_pause_ms": self.max_pause_ms,
            "worst_scan_ms": self.worst_scan_ms,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.censuses.clear()
        self._judged = None
        for t, totals, rows in state.get("censuses") or ():
            self.censuses.append((float(t), dict(totals), {str(name): (int(c), int(b)) for name, c, b in rows}))
        self.total = int(state.get("total") or len(self.censuses))
        self.skipped = int(state.get("skipped") or 0)
        reason = state.get("skip_reason")
        self.skip_reason = str(reason) if reason else None
        pause = state.get("max_pause_ms")
        self.max_pause_ms = float(pause) if isinstance(pause, int | float) else None
        self.worst_scan_ms = float(state.get("worst_scan_ms") or 0.0)


COLLECTOR = HeapCollector
ANALYZER = HeapAnalyzer
