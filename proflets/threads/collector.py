"""The threads proflet's agent half, loaded alone in the target (see :mod:`dyper.proflets.threads`)."""

from __future__ import annotations

import sys
import threading
import time
from types import FrameType
from typing import Any, ClassVar

from dyper.agent import procfs
from dyper.agent.proflet import Collector, DetailContext, ReportContext
from dyper.agent.protocol import LOC_LOCK

# --- agent half ------------------------------------------------------------------------


def thread_cpu_s(native_id: int) -> float | None:
    """CPU seconds of one of this process's threads, from its kernel thread id.

    The thread's CPU clock id is built from its id the way glibc's
    pthread_getcpuclockid does; unlike a pthread handle, a stale id gives an
    error, never a crash.
    """
    try:
        return time.clock_gettime((~native_id << 3) | 6)
    except (OSError, OverflowError):
        return None


_ROOTS = frozenset({"LOAD_FAST", "LOAD_DEREF", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"})
_ATTRS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


def _loaded_chain(code: Any, lasti: int) -> tuple[str, list[str]] | None:
    """The names a blocked lock entry loads: ``with self._lock:`` -> ("self", ["_lock"]).

    For a call (``lock.acquire()``, a Condition's ``self._lock.__enter__()``)
    the chain ends before the method.
    """
    from dyper.agent.tables import _instructions

    offsets, steps = _instructions(code)
    try:
        at = offsets.index(lasti)
    except ValueError:
        return None
    here = steps[at]
    if here.opname == "PRECALL" and at + 1 < len(steps):
        at += 1
        here = steps[at]
    i = at - 1
    attrs: list[str] = []
    if here.opname in ("CALL", "CALL_KW") and (here.arg or 0) == 0:
        # obj.method(): skip the method's own load, keep what it was loaded from
        while i >= 0 and steps[i].opname in ("PRECALL", "PUSH_NULL"):
            i -= 1
        if i < 0 or steps[i].opname not in _ATTRS:
            return None
        i -= 1
    elif here.opname != "BEFORE_WITH":
        return None
    while i >= 0 and steps[i].opname in _ATTRS:
        attrs.append(str(steps[i].argval))
        i -= 1
    if i < 0 or steps[i].opname not in _ROOTS:
        return None
    attrs.reverse()
    return str(steps[i].argval), attrs


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


def read_clocks(skip: int) -> dict[int, tuple[int, float]]:
    """Python ident -> (kernel thread id, CPU seconds), for the threads threading knows but ``skip`` and dyper's."""
    clocks = {}
    for ident, native in procfs.app_threads(skip).items():
        cpu = thread_cpu_s(native)
        if cpu is not None:
            clocks[ident] = (native, cpu)
    return clocks


class ThreadClocks:
    """Each thread's CPU seconds since profiling began, read from its CPU clock.

    A thread already running when profiling began counts from then; one
    started later, all of its own. Cumulative, so a report that never
    arrives loses nothing.
    """

    def __init__(self, skip: int) -> None:
        self._baseline = {ident: cpu for ident, (_, cpu) in read_clocks(skip).items()}

    def read(self, skip: int) -> dict[int, tuple[int, float]]:
        """Python ident -> (kernel thread id, CPU seconds since profiling began)."""
        return {
            ident: (native, cpu - self._baseline.get(ident, 0.0)) for ident, (native, cpu) in read_clocks(skip).items()
        }


class SchedCounters:
    """The kernel's scheduling counters of every thread over a burst (see _schedstat)."""

    def __init__(self) -> None:
        self._natives: dict[int, int] = {}
        self._start: dict[int, tuple[int, int, int, int]] = {}
        self._started = 0.0

    def start(self, skip: int) -> None:
        self._natives = procfs.app_threads(skip)
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
        self._me = threading.get_ident()  # built on the sampler thread
        self._clocks = ThreadClocks(self._me)
        self._sched = SchedCounters()

    def unavailable(self) -> str | None:
        if not sys.platform.startswith("linux"):
            return "per-thread CPU clocks are read the Linux way"
        return None

    def report(self, ctx: ReportContext) -> dict[str, Any] | None:
        threads = [[ident, native, cpu] for ident, (native, cpu) in self._clocks.read(self._me).items()]
        out: dict[str, Any] = {"threads": threads}
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
        self._sched.start(self._me)

    def stop_detail(self) -> dict[str, Any]:
        length, grown = self._sched.stop()
        # [ident, ns on CPU, ns waiting for a CPU, voluntary switches, involuntary switches]
        rows = [[ident, *counters] for ident, counters in grown.items()]
        return {"length_s": length, "slowdown_s": 0.0, "threads": rows}


COLLECTOR = ThreadsCollector
