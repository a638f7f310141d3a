"""The threads proflet: what each thread does, and who blocks whom (DYPER section 5.4).

Basic analysis, per thread, from samples: running, blocked on a lock,
waiting (condition, event, queue, join), in I/O, sleeping, and probably
waiting for the GIL. What a sample's leaf is doing comes from its location
flags (``agent.tables.wait_kind``: which call the instruction makes). A
sample cannot tell running from ready-to-run, because the sampler holds the
GIL while it samples: every thread that is not waiting looks the same. So
the collector reports each thread's CPU clock, and the analyzer splits the
not-waiting share: the part the CPU clock accounts for ran; the rest was
ready to run but did not, which for a Python thread is mostly the GIL.

Who blocks whom: when a thread is blocked entering a lock whose owner is
known (an RLock, or a Condition built on one), the collector reads the
owner from the lock, by following the names the blocked instruction loads
(``with self._lock:``) through plain attribute dictionaries, never running
the application's code.

Detailing: the kernel's own figures for every thread over a burst, from
``/proc/self/task/*/schedstat`` and ``status``: CPU time, time runnable but
waiting for a processor, and voluntary and involuntary context switches
(each voluntary switch is one wait, block, sleep or I/O).
"""

from __future__ import annotations

import sys
import threading
import time
from array import array
from collections.abc import Mapping
from types import FrameType
from typing import Any, ClassVar

from dyper.agent import procfs
from dyper.agent.proflet import Collector, DetailContext, ReportContext
from dyper.agent.protocol import LOC_LOCK
from dyper.proflets.base import KINDS, Analyzer, ReportView, SessionView, Status, confidence_of

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


# --- monitor half -----------------------------------------------------------------------

#: per-thread row: samples by kind, then CPU seconds in the window and the window's length
_RUN, _CPU, _SECONDS = 0, len(KINDS), len(KINDS) + 1

#: a report's rows as kept: thread idents, their samples by kind (flat), their CPU seconds
#: (None: all 0), the window's length and sampling passes, and who blocked whom (None: nobody)
_Row = tuple[tuple[int, ...], "array[Any]", "array[float] | None", float, int, "dict[int, int] | None"]


def _seconds(row: list[float], window_s: float, samples: int) -> float:
    """How long a thread was seen in a window: its share of the sampling passes, of the window."""
    seen = sum(row[: len(KINDS)])
    return window_s * min(1.0, seen / samples) if samples else 0.0


class ThreadsAnalyzer(Analyzer):
    name = "threads"

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        #: ident -> last cumulative CPU seconds seen (to turn them into deltas)
        self._cpu_seen: dict[int, float] = {}
        self.names: dict[int, str] = {}
        #: whole run: ident -> [samples per kind..., cpu seconds, seconds observed]
        self.totals: dict[int, list[float]] = {}
        #: whole run: blocked ident -> {owner ident: reports seen blocked by it}
        self.blockers: dict[int, dict[int, int]] = {}
        #: whole run: ident -> [bursts seconds, ns on CPU, ns waiting for a CPU, voluntary, involuntary]
        self.detail: dict[int, list[float]] = {}
        self.samples = 0
        #: the collector has sent thread CPU clocks: without them (the proflet
        #: is off in the agent) running cannot be told from waiting for the GIL
        self.clocks = False
        #: the thread idents of the last report (the next one's rows share them when they are the same)
        self._idents: tuple[int, ...] = ()

    def merge(self, report: ReportView) -> None:
        self.names.update(report.threads)
        data = report.data or {}
        if "threads" in data:
            self.clocks = True
        cpu_delta: dict[int, float] = {}
        for row in data.get("threads") or ():
            ident, cpu = int(row[0]), float(row[2])
            last = self._cpu_seen.get(ident)
            # Cumulative since profiling began; less than last time is a new
            # thread under a reused ident (or a new agent), counted from zero.
            cpu_delta[ident] = cpu - last if last is not None and cpu >= last else cpu
            self._cpu_seen[ident] = cpu
        rows: dict[int, list[float]] = {}
        for ident, kinds in report.kinds.items():
            row = [float(kinds.get(k, 0)) for k in KINDS] + [cpu_delta.get(ident, 0.0), 0.0]
            row[_SECONDS] = _seconds(row, report.window_s, report.samples)
            rows[ident] = row
        for ident, delta in cpu_delta.items():
            rows.setdefault(ident, [0.0] * len(KINDS) + [delta, 0.0])
        blocked = {int(b): int(o) for b, o in data.get("blocked_by") or ()}
        self.rows.append((report.t, self._compact(rows, blocked, report)))
        self.samples += report.samples
        for ident, row in rows.items():
            total = self.totals.setdefault(ident, [0.0] * len(row))
            for i, v in enumerate(row):
                total[i] += v
        for b, o in blocked.items():
            per = self.blockers.setdefault(b, {})
            per[o] = per.get(o, 0) + 1

    def _compact(self, rows: dict[int, list[float]], blocked: dict[int, int], report: ReportView) -> _Row:
        """A report's rows as kept for windows (an hour of them): some 300 bytes instead of some 3,000."""
        idents = tuple(rows)
        if idents == self._idents:
            idents = self._idents  # the same threads, report after report: kept once
        self._idents = idents
        counts = [row[i] for row in rows.values() for i in range(len(KINDS))]
        kinds: array[Any]
        try:
            whole = [int(v) for v in counts]
            top = max(whole, default=0)
            code = "B" if top < 1 << 8 else "H" if top < 1 << 16 else "I"
            kinds = array(code, whole) if whole == counts else array("d", counts)
        except (ValueError, OverflowError):  # not sample counts (NaN, infinite, huge): kept as they are
            kinds = array("d", counts)
        cpu = [row[_CPU] for row in rows.values()]
        return idents, kinds, array("d", cpu) if any(cpu) else None, report.window_s, report.samples, blocked or None

    @staticmethod
    def _expand(kept: _Row) -> tuple[dict[int, list[float]], dict[int, int]]:
        """The rows and blockers :meth:`_compact` kept, as :meth:`merge` made them."""
        idents, kinds, cpu, window_s, samples, blocked = kept
        rows: dict[int, list[float]] = {}
        n = len(KINDS)
        for j, ident in enumerate(idents):
            row = [float(k) for k in kinds[j * n : (j + 1) * n]] + [cpu[j] if cpu is not None else 0.0, 0.0]
            row[_SECONDS] = _seconds(row, window_s, samples)
            rows[ident] = row
        return rows, blocked or {}

    def merge_detail(self, burst: Mapping[str, Any]) -> None:
        length = float(burst.get("length_s") or 0.0)
        for row in burst.get("threads") or ():
            ident = int(row[0])
            d = self.detail.setdefault(ident, [0.0] * 5)
            d[0] += length
            for i in range(4):
                d[i + 1] += float(row[i + 1])

    def _window(
        self, start: float | None, end: float | None
    ) -> tuple[dict[int, list[float]], dict[int, dict[int, int]]]:
        if start is None and end is None:
            return self.totals, self.blockers
        totals: dict[int, list[float]] = {}
        blockers: dict[int, dict[int, int]] = {}
        for kept in self.window_rows(start, end):
            rows, blocked = self._expand(kept)
            for ident, row in rows.items():
                total = totals.setdefault(ident, [0.0] * len(row))
                for i, v in enumerate(row):
                    total[i] += v
            for b, o in blocked.items():
                per = blockers.setdefault(b, {})
                per[o] = per.get(o, 0) + 1
        return totals, blockers

    def table(self, start: float | None = None, end: float | None = None) -> list[dict[str, Any]]:
        totals, blockers = self._window(start, end)
        out = []
        for ident, row in totals.items():
            seen = sum(row[: len(KINDS)])
            if seen <= 0:
                continue
            share = {k: row[i] / seen for i, k in enumerate(KINDS)}
            seconds = row[_SECONDS]
            cpu = row[_CPU]
            # Of the time it was not waiting, the CPU clock says how much it ran.
            ran = min(share["run"], cpu / seconds) if seconds > 0 and self.clocks else share["run"]
            by = blockers.get(ident)
            owner = max(by, key=lambda o: by[o]) if by else None
            entry: dict[str, Any] = {
                "name": self.names.get(ident, f"thread-{ident}"),
                "ident": ident,
                "run_pct": 100.0 * ran,
                "gil_pct": 100.0 * max(0.0, share["run"] - ran) if self.clocks else None,
                "block_pct": 100.0 * share["lock"],
                "wait_pct": 100.0 * share["wait"],
                "io_pct": 100.0 * share["io"],
                "sleep_pct": 100.0 * share["sleep"],
                "blocked_by": self.names.get(owner, f"thread-{owner}") if owner is not None else None,
                "run_s": cpu,
                "block_s": share["lock"] * seconds,
                "wait_s": share["wait"] * seconds,
                "io_s": share["io"] * seconds,
                "seconds": seconds,
                "samples": int(seen),
            }
            d = self.detail.get(ident)
            if d is not None and d[0] > 0:
                # Kernel figures over the bursts: the voluntary switches are the thread's waits
                # (of every kind), extrapolated to the whole time observed.
                entry["switches_per_s"] = d[3] / d[0]
                entry["waits"] = round(d[3] / d[0] * seconds)
                entry["runqueue_pct"] = 100.0 * d[2] / 1e9 / d[0]
            out.append(entry)
        out.sort(key=lambda r: -r["seconds"])
        return out

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        return {"threads": self.table(start, end)}

    def _lost(self) -> tuple[float, float]:
        """(share of the threads' not-sleeping time lost to locks and the GIL, samples behind it)."""
        lost = busy = 0.0
        for r in self.table():
            gil = r["gil_pct"] or 0.0
            lost += r["block_pct"] + gil
            busy += r["run_pct"] + r["block_pct"] + gil
        return (lost / busy if busy > 0 else 0.0), float(self.samples)

    def status(self) -> Status:
        lost, samples = self._lost()
        return Status(min(1.0, lost), confidence_of(samples))

    def priority(self) -> float | None:
        lost, _ = self._lost()
        return min(1.0, 0.1 + lost)

    def findings(self) -> list[str]:
        out = []
        for r in self.table():
            if r["samples"] < 20:
                continue
            if r["block_pct"] >= 20:
                by = f", held by {r['blocked_by']}" if r["blocked_by"] else ""
                out.append(f"thread {r['name']} is blocked on a lock {r['block_pct']:.0f}% of the time{by}")
            if (r["gil_pct"] or 0.0) >= 20:
                out.append(f"thread {r['name']} is ready to run but not running {r['gil_pct']:.0f}% of the time (GIL)")
        return out

    def state(self) -> dict[str, Any]:
        return {
            "names": {str(k): v for k, v in self.names.items()},
            "totals": {str(k): v for k, v in self.totals.items()},
            "blockers": {str(k): {str(o): n for o, n in v.items()} for k, v in self.blockers.items()},
            "detail": {str(k): v for k, v in self.detail.items()},
            "samples": self.samples,
            "clocks": self.clocks,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.names = {int(k): str(v) for k, v in (state.get("names") or {}).items()}
        self.totals = {int(k): [float(x) for x in v] for k, v in (state.get("totals") or {}).items()}
        self.blockers = {
            int(k): {int(o): int(n) for o, n in v.items()} for k, v in (state.get("blockers") or {}).items()
        }
        self.detail = {int(k): [float(x) for x in v] for k, v in (state.get("detail") or {}).items()}
        self.samples = int(state.get("samples") or 0)
        # histories written before this key had clocks whenever they had CPU seconds
        self.clocks = bool(state.get("clocks", any(v[_CPU] for v in self.totals.values())))


COLLECTOR = ThreadsCollector
ANALYZER = ThreadsAnalyzer
