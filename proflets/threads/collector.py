"""The threads proflet's agent half, loaded alone in the target (see :mod:`dyper.proflets.threads`)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from types import FrameType
from typing import Any, ClassVar

from dyper.agent import procfs
from dyper.agent.proflet import Collector, DetailContext, ReportContext
from dyper.agent.protocol import LOC_LOCK

# --- agent half ------------------------------------------------------------------------


_ROOTS = frozenset({"LOAD_FAST", "LOAD_DEREF", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"})
_ATTRS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


def _loaded_chain(code: Any, lasti: int) -> tuple[str, list[str]] | None:
    """The names a blocked lock entry loads: ``with self._lock:`` -> ("self", ["_lock"]).

    For a call (``lock.acquire()``, a Condition's ``self._lock.__enter__()``)
    the chain ends before the method.
    """
    from dyper.agent.tables import ARG, ARGVAL, OPNAME, _instructions

    offsets, steps = _instructions(code)
    try:
        at = offsets.index(lasti)
    except ValueError:
        return None
    here = steps[at]
    if here[OPNAME] == "PRECALL" and at + 1 < len(steps):
        at += 1
        here = steps[at]
    i = at - 1
    attrs: list[str] = []
    if here[OPNAME] in ("CALL", "CALL_KW") and (here[ARG] or 0) == 0:
        # obj.method(): skip the method's own load, keep what it was loaded from
        while i >= 0 and steps[i][OPNAME] in ("PRECALL", "PUSH_NULL"):
            i -= 1
        if i < 0 or steps[i][OPNAME] not in _ATTRS:
            return None
        i -= 1
    elif here[OPNAME] != "BEFORE_WITH":
        return None
    while i >= 0 and steps[i][OPNAME] in _ATTRS:
        attrs.append(str(steps[i][ARGVAL]))
        i -= 1
    if i < 0 or steps[i][OPNAME] not in _ROOTS:
        return None
    attrs.reverse()
    return str(steps[i][ARGVAL]), attrs


def _plain_attr(obj: object, name: str) -> object | None:
    """``obj.name`` from the instance (or module) dictionary only: no property, no __getattr__."""
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
    return d.get(name) if type(d) is dict else None


def lock_owner(frame: FrameType) -> int | None:
    """The thread ident owning the lock this frame is blocked entering, when it can be known."""
    chain = _loaded_chain(frame.f_code, frame.f_lasti)
    if chain is None:
        return None
    root, attrs = chain
    f_locals = frame.f_locals
    if root in f_locals:
        obj: object | None = f_locals[root]
    else:
        obj = frame.f_globals.get(root)
    for name in attrs:
        if obj is None:
            return None
        obj = _plain_attr(obj, name)
    if isinstance(obj, threading.Condition):
        obj = _plain_attr(obj, "_lock")
    if type(obj).__name__ == "RLock" and type(obj).__module__ == "_thread":
        # The C RLock says its owner only in its repr: "<locked _thread.RLock object owner=123 count=1 ...>"
        text = repr(obj)
        at = text.find(" owner=")
        if at < 0:
            return None
        digits = text[at + 7 :].split(" ", 1)[0]
        return int(digits) if digits.isdigit() and digits != "0" else None
    owner = _plain_attr(obj, "_owner") if obj is not None else None  # threading._PyRLock
    return owner if isinstance(owner, int) else None


def _schedstat(native_id: int) -> tuple[int, int, int, int] | None:
    """(ns on CPU, ns runnable waiting for a CPU, voluntary switches, involuntary switches)."""
    base = f"/proc/self/task/{native_id}/"
    try:
        run_ns, wait_ns, _ = (int(x) for x in procfs.read(base + "schedstat").split())
        vol = invol = 0
        # status is about 1.5 KB; the switch counts are its last lines
        for line in procfs.read(base + "status", 8192).splitlines():
            if line.startswith(b"voluntary_ctxt_switches"):
                vol = int(line.split()[1])
            elif line.startswith(b"nonvoluntary_ctxt_switches"):
                invol = int(line.split()[1])
        return run_ns, wait_ns, vol, invol
    except (OSError, ValueError):
        return None


#: What ``procfs.app_threads`` is given to leave out: nothing by ident. dyper's own
#: threads are left out by name ("dyper-..."), which holds whichever thread runs
#: the hooks; the thread that built a collector is the one that started the agent
#: (often the main thread, the application's), never one to leave out.
NO_THREAD = 0


def read_clocks() -> dict[int, tuple[int, float]]:
    """Python ident -> (kernel thread id, CPU seconds), for the threads threading knows but dyper's."""
    clocks = {}
    for ident, native in procfs.app_threads(NO_THREAD).items():
        cpu = procfs.thread_cpu_s(native)
        if cpu is not None:
            clocks[ident] = (native, cpu)
    return clocks


def _own_natives() -> list[int]:
    """Kernel ids of this process's threads that are not the application's Python threads (dyper's, native ones)."""
    try:
        tasks = [int(t) for t in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return []
    app = set(procfs.app_threads(NO_THREAD).values())
    return [t for t in tasks if t not in app]


class ThreadClocks:
    """Each thread's CPU seconds since profiling began, read from its CPU clock.

    A thread already running when profiling began counts from then; one
    started later, all of its own. Cumulative, so a report that never
    arrives loses nothing.

    A thread that ends between two reads takes its clock with it: what it
    ran since the last read is the process's CPU time that no living
    thread's clock accounts for. :meth:`read` gives that to the threads that
    ended, once, as their last cumulative figure, so their totals are whole:
    in proportion to the CPU each used in the interval before (a spinner and a
    sleeper that end between the same two reads, as at a program's end, do
    not get half each).
    """

    #: reads between looks for the threads that are not the application's (their clocks are subtracted)
    OTHERS_EVERY = 30

    def __init__(self) -> None:
        clocks = read_clocks()
        self._baseline = {native: cpu for native, cpu in clocks.values()}
        #: the application's threads at the last read: ident -> (kernel id, cumulative CPU seconds)
        self._last: dict[int, tuple[int, float]] = {ident: (native, 0.0) for ident, (native, _) in clocks.items()}
        #: the other threads' (dyper's, native ones'): kernel id -> CPU seconds at the last read
        self._others: dict[int, float] = {}
        self._process_cpu = time.process_time()
        self._wall = time.monotonic()
        self._reads = 0
        #: each application thread's CPU seconds per second between the last two reads
        self._rate: dict[int, float] = {}

    def _others_growth(self) -> float:
        """CPU seconds the threads that are not the application's used since the last read."""
        natives = _own_natives() if self._reads % self.OTHERS_EVERY == 0 else list(self._others)
        self._reads += 1
        grown = 0.0
        others = {}
        for native in natives:
            cpu = procfs.thread_cpu_s(native)
            if cpu is not None:
                others[native] = cpu
                # one found since the last look ran before it too: only growth counts
                grown += cpu - self._others.get(native, cpu)
        self._others = others
        return grown

    def read(self, also_ended: Iterable[int] = ()) -> dict[int, tuple[int, float]]:
        """Python ident -> (kernel thread id, CPU seconds since profiling began); ended threads once more.

        ``also_ended``: threads known to have ended that a read may never have
        seen alive (started and ended between two reads: ThreadNames saw them).
        """
        live = {
            ident: (native, cpu - self._baseline.get(native, 0.0)) for ident, (native, cpu) in read_clocks().items()
        }
        process_cpu, wall = time.process_time(), time.monotonic()
        others = self._others_growth()
        out = dict(live)
        ended = {i: v for i, v in self._last.items() if i not in live}
        for ident in also_ended:
            if ident not in live and ident not in ended:
                ended[ident] = (0, 0.0)  # never read: all it ran is in the process's rest
        lived, rate, span = 0.0, {}, wall - self._wall
        for ident, (native, cpu) in live.items():
            before = self._last.get(ident)
            grown = cpu - before[1] if before is not None and before[0] == native else cpu
            lived += grown
            rate[ident] = grown / span if span > 0 else 0.0
        if ended:
            # the process's CPU time since the last read that no living thread's clock accounts for
            rest = max(0.0, (process_cpu - self._process_cpu) - lived - others)
            # Shared by what each ran in the interval before; one never read may have run all along.
            weight = {ident: self._rate.get(ident, 1.0) for ident in ended}
            total = sum(weight.values())
            for ident, (native, cpu) in ended.items():
                self._baseline.pop(native, None)
                share = rest * weight[ident] / total if total > 0 else rest / len(ended)
                # a thread cannot have run longer than the time between the reads
                out[ident] = (native, cpu + min(share, span))
        self._process_cpu, self._wall, self._last, self._rate = process_cpu, wall, live, rate
        return out


class ThreadNames:
    """The application's threads' names, noted while they live, for the reports after they end.

    The agent names the threads of a report's samples from those alive when
    it reports; one that ran between two reports and ended would go by its
    ident alone.
    """

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    def look(self) -> None:
        """Note the threads started since the last look (cheap: compares the idents)."""
        active = threading._active  # type: ignore[attr-defined]  # read-only
        if active.keys() <= self._names.keys():
            return
        for ident, thread in list(active.items()):
            if ident not in self._names and not thread.name.startswith("dyper-"):
                self._names[ident] = thread.name

    def ended(self) -> list[list[int | str]]:
        """[ident, name] of the noted threads that have ended since the last call (each said once)."""
        self.look()
        active = threading._active  # type: ignore[attr-defined]
        gone: list[list[int | str]] = []
        for ident in [i for i in self._names if i not in active]:
            gone.append([ident, self._names.pop(ident)])
        return gone


class SchedCounters:
    """The kernel's scheduling counters of every thread over a burst (see _schedstat)."""

    def __init__(self) -> None:
        self._natives: dict[int, int] = {}
        self._start: dict[int, tuple[int, int, int, int]] = {}
        self._started = 0.0

    def start(self) -> None:
        self._natives = procfs.app_threads(NO_THREAD)
        self._start = {ident: stat for ident, native in self._natives.items() if (stat := _schedstat(native))}
        self._started = time.perf_counter()

    def stop(self) -> tuple[float, dict[int, tuple[int, ...]]]:
        """(burst length in seconds, ident -> the four counters' growth over it)."""
        length = time.perf_counter() - self._started
        grown = {}
        for ident, before in self._start.items():
            after = _schedstat(self._natives[ident])
            if after is not None:
                grown[ident] = tuple(a - b for a, b in zip(after, before, strict=True))
        self._start = {}
        return length, grown


class ThreadsCollector(Collector):
    name = "threads"
    # A burst reads two small /proc files per thread at its start and end.
    OVHD_MS = 1.0
    SLOW = 0.0
    ITVL_MS = 2000.0
    PRTY = 0.3
    # Counting calls slows the code and so changes how threads wait: cpu stays out.
    ALLOWS: ClassVar[frozenset[str]] = frozenset({"timing", "memory", "io", "heap"})
    DETAILS = True

    def __init__(self) -> None:
        self._clocks = ThreadClocks()
        self._sched = SchedCounters()
        self._names = ThreadNames()

    def sampled(self, n: int, counts: Mapping[tuple[int, tuple[int, ...]], int]) -> None:
        self._names.look()

    def unavailable(self) -> str | None:
        if not sys.platform.startswith("linux"):
            return "per-thread CPU clocks are read the Linux way"
        return None

    def report(self, ctx: ReportContext) -> dict[str, Any] | None:
        ended = self._names.ended()
        clocks = self._clocks.read(int(ident) for ident, _ in ended)
        threads = [[ident, native, cpu] for ident, (native, cpu) in clocks.items()]
        out: dict[str, Any] = {"threads": threads}
        if ended:
            out["names"] = ended
        lock_leaves = {tid for (tid, stack), _ in ctx.counts.items() if stack and ctx.loc_flags(stack[0]) & LOC_LOCK}
        if lock_leaves:
            out["blocked_by"] = self._owners(lock_leaves)
        return out

    def _owners(self, tids: set[int]) -> list[list[int]]:
        """[blocked ident, owner ident] for the threads in ``tids`` blocked right now on a lock with a known owner."""
        from dyper.agent.tables import wait_kind

        pairs = []
        for tid, frame in sys._current_frames().items():
            if tid not in tids:
                continue
            try:
                if wait_kind(frame.f_code, frame.f_lasti) != LOC_LOCK:
                    continue
                owner = lock_owner(frame)
            except Exception:  # the application's objects are not ours to trust
                continue
            if owner is not None and owner != tid:
                pairs.append([tid, owner])
        return pairs

    def start_detail(self, ctx: DetailContext) -> None:
        self._sched.start()

    def stop_detail(self) -> dict[str, Any]:
        length, grown = self._sched.stop()
        # [ident, ns on CPU, ns waiting for a CPU, voluntary switches, involuntary switches]
        rows = [[ident, *counters] for ident, counters in grown.items()]
        return {"length_s": length, "slowdown_s": 0.0, "threads": rows}


COLLECTOR = ThreadsCollector
