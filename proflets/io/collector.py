"""The io proflet's agent half, loaded alone in the target (see :mod:`dyper.proflets.io`)."""

from __future__ import annotations

import bisect
import contextlib
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any, ClassVar

from dyper.agent import procfs
from dyper.agent.proflet import Collector, DetailContext, ReportContext
from dyper.agent.protocol import LOC_AGENT, LOC_BLOCKING, LOC_IO, LOC_WAIT
from dyper.monitor.model.libraries import library_roots
from dyper.proflets.base import YappiCharge, paired_best
from dyper.proflets.io.common import IO_FIELDS, OTHER_KIND, classify, dotted_name, routines

# --- the resource file -------------------------------------------------------------------


# --- naming calls --------------------------------------------------------------------------


def _line_of(code: CodeType, offset: int) -> int:
    for start, end, line in code.co_lines():
        if start <= offset < end and line is not None:
            return line
    return code.co_firstlineno


def call_offset(code: CodeType, lasti: int) -> int:
    """The offset of the instruction a frame's ``lasti`` is in.

    A frame calling a Python function can point past its CALL, at the
    CALL's inline cache (3.12), while sys.monitoring reports the CALL itself.
    """
    from dyper.agent.tables import _instructions

    offsets, _ = _instructions(code)
    at = bisect.bisect_right(offsets, lasti) - 1
    return offsets[at] if at >= 0 else lasti


def yappi_callee(name: str) -> str:
    """The plain name of a builtin as yappi names it ("<method 'recv' of '_socket.socket' objects>" -> "recv")."""
    if name.startswith("<method '"):
        return name.split("'")[1]
    return name


#: what yappi counts: a builtin by name, a Python function by (file, first line)
YappiKey = str | tuple[str, int]


def _add(into: dict[Any, list[float]], key: Any, n: float, t: float) -> None:
    slot = into.setdefault(key, [0, 0.0])
    slot[0] += n
    slot[1] += t


# --- /proc I/O counters ----------------------------------------------------------------

_IO_KEYS = tuple(k.encode() for k in IO_FIELDS)
_RCHAR, _SYSCR = IO_FIELDS.index("rchar"), IO_FIELDS.index("syscr")
#: The native sampler's thread (agent/_native.c): what it reads is counted by its module.
NATIVE_THREAD = "dyper-native"


def read_io(path: str) -> list[int] | None:
    """The counters of one /proc io file, in IO_FIELDS order (None if it cannot be read)."""
    try:
        data = procfs.read(path, 1024)
        values = {}
        for line in data.splitlines():
            key, _, value = line.partition(b":")
            values[key] = int(value)
        return [values.get(k, 0) for k in _IO_KEYS]
    except (OSError, ValueError):
        return None


def _comm(tid: int) -> str:
    try:
        return procfs.read(f"/proc/self/task/{tid}/comm", 64).decode(errors="replace").strip()
    except OSError:
        return ""


# --- agent half ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    """A call site of an I/O routine: the instruction detailing counts."""

    code: CodeType
    offset: int
    routine: str
    #: the C routine's name as called (None: a Python routine)
    callee: str | None
    #: the Python routine's (file, first line), as yappi names a function
    function: tuple[str, int] | None

    def key(self) -> int:
        # as agent.tables keys a location: one int, cheap to hash in the callback
        return (self.offset << 48) | id(self.code)


def _calibration_target(n: int) -> int:
    total = 0
    for i in range(n):
        total += abs(i)  # the site: a cheap C call
    return total


#: Factor on a calibrated per-call cost: the calibration loop is the cheapest code to hook.
CALL_COST_MARGIN = 1.25


class SiteCounter:
    """sys.monitoring callbacks: calls at the burst's sites, and the time of C calls there.

    They run on the application's threads. A call instruction that is not a
    site is switched off at its first event (DISABLE), so the rest of the
    call site's function runs at full speed.
    """

    def __init__(self, sites: Sequence[Site]) -> None:
        self.index = {s.key(): i for i, s in enumerate(sites)}
        self.calls = [0] * len(sites)
        self.seconds = [0.0] * len(sites)
        self.timed = [0] * len(sites)
        #: thread ident -> (site, when its call began)
        self.pending: dict[int, tuple[int, float]] = {}
        self.disable: Any = sys.monitoring.DISABLE if sys.version_info >= (3, 12) else None  # type: ignore[attr-defined,unused-ignore]

    def on_call(self, code: CodeType, offset: int, callable: object, arg0: object) -> Any:
        i = self.index.get((offset << 48) | id(code))
        if i is None:
            return self.disable
        self.calls[i] += 1
        self.pending[threading.get_ident()] = (i, time.perf_counter())
        return None

    def on_c_return(self, code: CodeType, offset: int, callable: object, arg0: object) -> None:
        started = self.pending.pop(threading.get_ident(), None)
        if started is not None and self.index.get((offset << 48) | id(code)) == started[0]:
            self.seconds[started[0]] += time.perf_counter() - started[1]
            self.timed[started[0]] += 1

    def total(self) -> int:
        return sum(self.calls)


class IoCollector(Collector):
    """Callee names of I/O leaves, the process's I/O counters, and detailing bursts at I/O call sites."""

    name = "io"
    # A burst reads two /proc files per thread and instruments a few code objects.
    OVHD_MS = 1.0
    # Two callbacks per call of a busy I/O routine, each call of which waits far longer.
    SLOW = 0.02
    ITVL_MS = 2000.0
    PRTY = 0.3
    # Counting only I/O calls slows nothing that other proflets measure; on
    # 3.11 yappi slows every call, and cpu would want yappi too.
    ALLOWS: ClassVar[frozenset[str]] = (
        frozenset({"cpu", "threads", "timing", "memory", "heap"})
        if sys.version_info >= (3, 12)
        else frozenset({"memory", "heap"})
    )
    DETAILS = True
    #: call sites instrumented per burst, the hottest
    MAX_SITES = 16
    #: stacks remembered with their verdict; past this the memory starts again
    MAX_STACKS = 20_000
    #: reports between looks for the agent's own native threads (its ticker, the native sampler, ZeroMQ's) ...
    OWN_TASKS_EVERY = 60
    #: ... after a look at each of the first reports: those threads start with the agent's loop,
    #: and one missed for a minute would put its /proc reads in the application's bytes
    OWN_TASKS_FIRST = 3

    def __init__(self) -> None:
        self._routines = routines()
        self._roots = library_roots({k: v for k, v in sysconfig.get_paths().items() if isinstance(v, str)})
        self._monitoring = sys.version_info >= (3, 12)
        self._epoch = -1
        #: (file, qualname) -> the listed Python routine it is, or None
        self._functions: dict[tuple[str, str], tuple[str, str] | None] = {}
        #: leaf location -> (routine, kind, the entry the monitor gets) if it calls an I/O routine
        self._leaves: dict[int, tuple[str, str, list[Any]] | None] = {}
        #: stack (leaf first) -> (its call site, or -1, and the site; the leaf's entry)
        self._stacks: dict[tuple[int, ...], tuple[int, Site | None, list[Any] | None]] = {}
        #: call site location -> thread ident -> recent samples, decayed each report; and what the site is
        self._heat: dict[int, dict[int, float]] = {}
        self._sites: dict[int, Site] = {}
        self._reports = 0
        #: kernel ids of dyper's own threads (found at the first report: the
        #: collector is built on the thread that starts the agent, not on dyper's)
        self._own_tasks: list[int] = []
        self._since = [time.time(), 0]
        # the burst
        self._tool: int | None = None
        self._counter: SiteCounter | None = None
        #: the burst's call sites: (location, site)
        self._burst: list[tuple[int, Site]] = []
        self._codes: list[CodeType] = []
        self._yappi = False
        self._call_cost_s: float | None = None
        #: 3.11: what a yappi burst costs (its calls, and the slow path under everything)
        self._yappi_charge = YappiCharge(builtins=True, margin=CALL_COST_MARGIN)
        self._started = 0.0
        #: when the threads' counters were read at the burst's start, and what they said
        self._threads_read = 0.0
        self._threads_before: dict[int, tuple[int, list[int]]] = {}

    # --- basic: what the monitor cannot see for itself ------------------------------------

    def report(self, ctx: ReportContext) -> dict[str, Any] | None:
        if ctx.epoch != self._epoch:
            # location ids start again: what was remembered by them means nothing now
            self._epoch = ctx.epoch
            self._leaves.clear()
            self._stacks.clear()
            self._heat.clear()
            self._sites.clear()
        heat = self._heat
        for loc, per in list(heat.items()):
            for tid in list(per):
                per[tid] *= 0.5
                if per[tid] < 0.5:
                    del per[tid]
            if not per:
                del heat[loc]
                self._sites.pop(loc, None)
        entries: dict[int, list[Any]] = {}
        for (tid, stack), n in ctx.counts.items():
            if not stack or tid == ctx.agent_ident:
                continue
            known = self._stacks.get(stack)
            if known is None:
                if len(self._stacks) >= self.MAX_STACKS:
                    self._stacks.clear()
                known = self._stacks[stack] = self._classify(stack, ctx)
            site, info, entry = known
            if entry is not None:
                entries[stack[0]] = entry
            if info is not None:
                per = heat.setdefault(site, {})
                per[tid] = per.get(tid, 0.0) + n
                self._sites[site] = info
        out: dict[str, Any] = {}
        # Every window's I/O leaves, not only new ones: a report that never
        # arrives, or a monitor that restarts, loses nothing for long.
        if entries:
            out["calls"] = list(entries.values())
        io = self._process_io()
        if io is not None:
            out["io"] = io
            out["since"] = self._since
        return out or None

    def _leaf(self, loc: int, ctx: ReportContext) -> tuple[str, str, list[Any]] | None:
        if loc in self._leaves:
            return self._leaves[loc]
        from dyper.agent.tables import callee_name

        found = None
        where = ctx.code_at(loc)
        flags = ctx.loc_flags(loc)
        # A wait (a child process, a condition) is not I/O whatever the call's name:
        # Popen's start reads the pipe its child closes at exec.
        if where is not None and not flags & (LOC_AGENT | LOC_WAIT):
            code, lasti = where
            callee = callee_name(code, lasti)
            if callee is not None:
                named = self._routines.call(callee)
                if named is None and flags & LOC_IO:
                    named = (callee, OTHER_KIND)
                if named is not None:
                    entry = [
                        code.co_filename,
                        code.co_qualname,
                        code.co_firstlineno,
                        _line_of(code, lasti),
                        callee,
                        1 if flags & LOC_BLOCKING else 0,
                    ]
                    found = (named[0], named[1], entry)
        self._leaves[loc] = found
        return found

    def _function(self, code: CodeType) -> tuple[str, str] | None:
        key = (code.co_filename, code.co_qualname)
        if key not in self._functions:
            dotted, library = dotted_name(code.co_filename, code.co_qualname, self._roots)
            self._functions[key] = self._routines.function(dotted, library)
        return self._functions[key]

    def _classify(self, stack: tuple[int, ...], ctx: ReportContext) -> tuple[int, Site | None, list[Any] | None]:
        leaf = self._leaf(stack[0], ctx)
        where = [ctx.code_at(loc) for loc in reversed(stack)]  # root first
        functions = [self._function(w[0]) if w is not None else None for w in where]
        hit = classify(functions, leaf[:2] if leaf is not None else None)
        entry = leaf[2] if leaf is not None else None
        if hit is None or hit.site is None:
            return -1, None, entry
        at_site = where[hit.site]
        if at_site is None:
            return -1, None, entry
        code, offset = at_site[0], call_offset(*at_site)
        if hit.c_call:
            info = Site(code, offset, hit.routine, entry[4] if entry is not None else None, None)
        else:
            routine = where[hit.at]
            function = (routine[0].co_filename, routine[0].co_firstlineno) if routine is not None else None
            info = Site(code, offset, hit.routine, None, function)
        return stack[len(stack) - 1 - hit.site], info, entry

    def _process_io(self) -> list[int] | None:
        """The process's I/O counters without the agent's own threads' (the sampler's, its ticker's, ZeroMQ's)."""
        if self._reports < self.OWN_TASKS_FIRST or self._reports % self.OWN_TASKS_EVERY == 0:
            self._find_own_tasks()
        self._reports += 1
        total = read_io("/proc/self/io")
        if total is None:
            return None
        for tid in self._own_tasks:
            own = read_io(f"/proc/self/task/{tid}/io")
            if own is not None:
                total = [t - o for t, o in zip(total, own, strict=True)]
        # The native sampler's /proc reads, by its own count: its thread's
        # counters end with it (a stop before the last report), the count not.
        native = sys.modules.get("dyper.agent._native")
        if native is not None:
            with contextlib.suppress(Exception):
                s = native.stats()
                total[_RCHAR] -= int(s["proc_read_bytes"])
                total[_SYSCR] -= int(s["proc_reads"])
        return total

    def _find_own_tasks(self) -> None:
        try:
            tasks = [int(t) for t in os.listdir("/proc/self/task")]
        except (OSError, ValueError):
            return
        threads = list(threading._active.values())  # type: ignore[attr-defined]
        python = {t.native_id for t in threads}
        # dyper's Python threads by name; of the others (usually a handful) the kernel's name is read
        own = [t.native_id for t in threads if t.name.startswith("dyper-") and t.native_id is not None]
        own += [
            t
            for t in tasks
            if t not in python and (comm := _comm(t)).startswith(("ZMQbg", "dyper-")) and comm != NATIVE_THREAD
        ]
        if sorted(own) != sorted(self._own_tasks):
            if self._reports > 0:  # not the first look: the first report's counters already leave them out
                # the counters subtracted changed: the monitor starts its differences again
                self._since = [self._since[0], self._since[1] + 1]
            self._own_tasks = own

    # --- detailing ------------------------------------------------------------------------

    def _thread_io(self) -> dict[int, tuple[int, list[int]]]:
        out = {}
        for ident, native in procfs.app_threads(0).items():  # none by ident: dyper's go by name
            io = read_io(f"/proc/self/task/{native}/io")
            if io is not None:
                out[ident] = (native, io)
        return out

    def _can_yappi(self) -> bool:
        if self._monitoring or not self.explicit:
            return False
        try:
            import yappi
        except ImportError:
            return False
        return not (yappi.is_running() or sys.getprofile() is not None or threading.getprofile() is not None)

    def start_detail(self, ctx: DetailContext) -> None:
        self._threads_read = time.perf_counter()
        self._threads_before = self._thread_io()
        hottest = sorted(self._heat, key=lambda loc: -sum(self._heat[loc].values()))[: self.MAX_SITES]
        self._burst = [(loc, self._sites[loc]) for loc in hottest if loc in self._sites]
        if self._burst and self._monitoring:
            self._start_monitoring()
        elif self._burst and self._can_yappi():
            self._start_yappi()
        self._started = time.perf_counter()

    def _start_monitoring(self) -> None:
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        tool = next((t for t in (4, 3, 5) if mon.get_tool(t) is None), None)
        if tool is None:
            return  # every tool id is taken: this burst counts bytes only
        mon.use_tool_id(tool, "dyper-io")
        self._tool = tool
        try:
            if self._call_cost_s is None:
                self._call_cost_s = self._calibrate_monitoring()
            self._counter = SiteCounter([site for _, site in self._burst])
            self._register(self._counter)
            self._codes = list({id(site.code): site.code for _, site in self._burst}.values())
            for code in self._codes:
                mon.set_local_events(tool, code, mon.events.CALL)
        except BaseException:
            self._release_tool()
            raise

    def _register(self, counter: SiteCounter | None) -> None:
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        ev = mon.events
        mon.register_callback(self._tool, ev.CALL, counter.on_call if counter else None)
        mon.register_callback(self._tool, ev.C_RETURN, counter.on_c_return if counter else None)
        mon.register_callback(self._tool, ev.C_RAISE, counter.on_c_return if counter else None)

    def _calibrate_monitoring(self) -> float:
        """Seconds one counted call at a site costs (both callbacks), from the same hooks on a small loop."""
        from dyper.agent.tables import _instructions, callee_name

        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        code = _calibration_target.__code__
        offsets, _ = _instructions(code)
        offset = next(o for o in offsets if callee_name(code, o) == "abs")
        n = 300
        tool = self._tool
        self._register(SiteCounter([Site(code, offset, "abs", "abs", None)]))
        try:
            plain, hooked = paired_best(
                3,
                lambda: _calibration_target(n),
                lambda: mon.set_local_events(tool, code, mon.events.CALL),
                lambda: mon.set_local_events(tool, code, 0),
            )
        finally:
            self._register(None)
        return CALL_COST_MARGIN * max(0.0, hooked - plain) / n

    def _release_tool(self) -> None:
        tool = self._tool
        if tool is None:
            return
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        for code in self._codes:
            with contextlib.suppress(ValueError):
                mon.set_local_events(tool, code, 0)
        self._register(None)
        self._tool = None
        self._codes = []
        mon.free_tool_id(tool)

    def _start_yappi(self) -> None:
        import yappi

        if self._call_cost_s is None:
            n = 300
            self._yappi_charge.calibrate(lambda: _calibration_target(n), n)
            self._call_cost_s = self._yappi_charge.per_call_s
        yappi.set_clock_type("wall")
        yappi.clear_stats()
        self._yappi_charge.started()
        yappi.start(builtins=True, profile_threads=True)
        self._yappi = True

    def slowdown_s(self) -> float:
        if self._yappi:
            # yappi's stats cost a walk over every function seen: its calls are
            # charged at the end; the slow path under everything is known now.
            return self._yappi_charge.slowdown_s(0)
        counter = self._counter
        return counter.total() * (self._call_cost_s or 0.0) if counter is not None else 0.0

    def stop_detail(self) -> dict[str, Any]:
        length = time.perf_counter() - self._started
        slowdown = 0.0
        counted = False
        calls: list[int] = []
        seconds: list[float] = []
        timed: list[int] = []
        events = 0
        if self._counter is not None:
            self._release_tool()
            counter, self._counter = self._counter, None
            calls, seconds, timed = counter.calls, counter.seconds, counter.timed
            events, counted = counter.total(), True
            slowdown = events * (self._call_cost_s or 0.0)
        elif self._yappi:
            calls, seconds, timed, events = self._stop_yappi()
            counted = True
            slowdown = self._yappi_charge.slowdown_s(events)
        sites = [
            [
                s.code.co_filename,
                s.code.co_qualname,
                s.code.co_firstlineno,
                _line_of(s.code, s.offset),
                s.routine,
                calls[i],
                seconds[i],
                timed[i],
            ]
            for i, (_, s) in enumerate(self._burst)
            if counted
        ]
        threads = []
        for ident, (native, after) in self._thread_io().items():
            before = self._threads_before.get(ident)
            if before is not None and before[0] == native:
                threads.append([ident, *(a - b for a, b in zip(after, before[1], strict=True))])
        threads_s = time.perf_counter() - self._threads_read
        self._burst, self._threads_before = [], {}
        return {
            "length_s": length,
            "slowdown_s": slowdown,
            "counted": counted,
            "call_cost_s": self._call_cost_s if counted else None,
            # [file, qualname, first line, line, routine, calls, seconds timed, calls timed]
            "sites": sites,
            # [ident, *IO_FIELDS grown over the burst], over threads_s seconds
            "threads": threads,
            "threads_s": threads_s,
        }

    def _stop_yappi(self) -> tuple[list[int], list[float], list[int], int]:
        """Each site's calls from yappi's stats, per thread.

        yappi counts per function, not per call site, and a caller already
        running when the burst began (a long loop) has no stats of its own;
        but it counts per thread, and the samples say which threads each site
        is seen in. In a thread, a routine's calls are shared among its sites
        there by their samples.
        """
        import yappi

        yappi.stop()
        self._yappi = False

        def key_of(stat: Any) -> YappiKey:
            return yappi_callee(stat.name) if stat.builtin else (stat.module, stat.lineno)

        per_ctx: dict[int, dict[YappiKey, list[float]]] = {}
        try:
            ctx_of = {t.tid: t.id for t in yappi.get_thread_stats()}
            events = sum(stat.ncall for stat in yappi.get_func_stats())
            for ctx in {ctx_of[t] for loc, _ in self._burst for t in self._heat.get(loc, {}) if t in ctx_of}:
                table = per_ctx[ctx] = {}
                for stat in yappi.get_func_stats(filter={"ctx_id": ctx}):
                    _add(table, key_of(stat), stat.ncall, stat.ttot)
        finally:
            yappi.clear_stats()
        # (thread's context, routine) -> the heat of the sites drawing on its calls
        draws: list[list[tuple[tuple[int, YappiKey], float]]] = []
        weight: dict[tuple[int, YappiKey], float] = {}
        for loc, site in self._burst:
            key: YappiKey = site.callee if site.callee is not None else (site.function or ("", 0))
            mine = []
            for tid, h in self._heat.get(loc, {}).items():
                if tid in ctx_of:
                    pool = (ctx_of[tid], key)
                    mine.append((pool, h))
                    weight[pool] = weight.get(pool, 0.0) + h
            draws.append(mine)
        calls, seconds, timed = [], [], []
        for (_, site), mine in zip(self._burst, draws, strict=True):
            n, t = 0.0, 0.0
            for pool, h in mine:
                counted = per_ctx.get(pool[0], {}).get(pool[1])
                if counted is not None and weight[pool] > 0:
                    n += counted[0] * h / weight[pool]
                    t += counted[1] * h / weight[pool]
            calls.append(round(n))
            # a builtin's time is its own; a Python routine's comes from the samples
            seconds.append(t if site.callee is not None else 0.0)
            timed.append(round(n) if site.callee is not None else 0)
        return calls, seconds, timed, events

    def close(self) -> None:
        if self._counter is not None or self._tool is not None:
            self._counter = None
            self._release_tool()
        if self._yappi and "yappi" in sys.modules:
            yappi = sys.modules["yappi"]
            if yappi.is_running():
                yappi.stop()
            yappi.clear_stats()
            self._yappi = False
        self._burst = []


COLLECTOR = IoCollector
