"""The heap proflet's agent half, loaded alone in the target (see :mod:`dyper.proflets.heap`)."""

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


COLLECTOR = HeapCollector
