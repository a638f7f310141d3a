"""The io proflet: time in I/O, by routine and by the application routine that called it (DYPER section 5.2).

What counts as I/O comes from a resource file, :file:`io_routines.toml`,
which an application extends with its own (``DYPER_IO_ROUTINES``, see
:func:`routines`). It lists C routines by the name a Python line calls them
with (``recv``, ``select``, ``read``...) and Python functions by module and
qualified name (``ssl.SSLSocket.read``, ``selectors.*.select``).

Basic analysis, from samples, mostly in the monitor: a thread is doing I/O
when a listed Python function is on its stack (the outermost names the
routine: what the application asked for), or else when its innermost Python
frame is calling a listed C routine (``socket.recv_into``). Only the agent
can tell what a frame's instruction calls, so the collector sends the
callee of each I/O leaf it sees. The caller is the first application frame
above the routine (standard library and installed packages skipped, as the
cpu proflet charges library time to the application line that called it).
Shares are of all the application threads' samples, and per thread.

Detailing, over a burst: how often the busiest routines are called, and how
long each call of a C routine takes, counted at their call sites only (the
line that enters the routine, as the samples show it): on 3.12+ through
``sys.monitoring`` CALL events local to the call sites' code objects, with
every other call instruction there switched off at its first event
(``DISABLE``), and C_RETURN to time C calls; on 3.11, which has no such
hook, through yappi, which slows every call, so only when the proflet is
named. Both slowdowns are calibrated and charged. Also the bytes each
thread read and wrote over the burst (``/proc/self/task/*/io``); the
process's own counters come with every report (``/proc/self/io``, the
agent's own threads left out).
"""

from __future__ import annotations

import bisect
import contextlib
import fnmatch
import os
import re
import sys
import sysconfig
import threading
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import TYPE_CHECKING, Any, ClassVar

from dyper.agent import procfs
from dyper.agent.proflet import Collector, DetailContext, ReportContext
from dyper.agent.protocol import LOC_AGENT, LOC_BLOCKING, LOC_IO
from dyper.monitor.model.libraries import library_roots

if TYPE_CHECKING:
    from dyper.monitor.model.frames import StackKey
from dyper.proflets.base import (
    Analyzer,
    ReportView,
    SessionView,
    Status,
    WindowView,
    YappiCharge,
    confidence_of,
    paired_best,
)

# --- the resource file -------------------------------------------------------------------

#: the application's own routine files, separated by os.pathsep
ENV = "DYPER_IO_ROUTINES"
SHIPPED = Path(__file__).with_name("io_routines.toml")
#: kind of a call the agent's tables judge to be I/O that no file lists
OTHER_KIND = "io"


@dataclass(frozen=True)
class Routines:
    """The I/O routines of the resource files: what a name or a function is, if it is I/O."""

    #: C routine name -> its kind (the table listing it first)
    calls: Mapping[str, str]
    #: (pattern, kind, the pattern as a whole name, the pattern as the end of a dotted path)
    functions: tuple[tuple[str, str, re.Pattern[str], re.Pattern[str]], ...]
    #: the files read, shipped first
    files: tuple[str, ...]

    def call(self, callee: str) -> tuple[str, str] | None:
        """(routine, kind) of a call of ``callee`` from Python, if it is listed."""
        kind = self.calls.get(callee)
        return (f"{kind}.{callee}", kind) if kind is not None else None

    def function(self, dotted: str, library: bool) -> tuple[str, str] | None:
        """(routine, kind) of the Python function ``dotted`` (module.qualname), if it is listed.

        A library function's module is known from its path, so its name must
        match whole; an application file's module is not (it depends on how
        the application is run), so a listed name may match the end of its
        dotted path ("db.Client.query" for .../myapp/db.py, Client.query).
        """
        for _, kind, whole, tail in self.functions:
            if whole.match(dotted):
                return dotted, kind
            if not library:
                m = tail.match(dotted)
                if m is not None:
                    return m.group("name"), kind
        return None


def _strings(table: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where}: {key} must be a list of names")
    return value


def load_routines(extra: Iterable[str | os.PathLike[str]] = ()) -> Routines:
    """The shipped routines, then those of ``extra`` files added (raises ValueError or OSError on a bad file)."""
    calls: dict[str, str] = {}
    functions: list[tuple[str, str, re.Pattern[str], re.Pattern[str]]] = []
    files = [str(SHIPPED), *(os.fspath(p) for p in extra)]
    for path in files:
        with open(path, "rb") as f:
            try:
                doc = tomllib.load(f)
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{path}: {exc}") from None
        for kind, table in doc.items():
            if not isinstance(table, dict):
                raise ValueError(f"{path}: {kind} must be a table ([{kind}])")
            unknown = set(table) - {"calls", "functions"}
            if unknown:
                raise ValueError(f"{path}: [{kind}] has unknown keys {sorted(unknown)} (calls, functions)")
            for name in _strings(table, "calls", f"{path} [{kind}]"):
                calls.setdefault(name, kind)
            for pattern in _strings(table, "functions", f"{path} [{kind}]"):
                rx = fnmatch.translate(pattern)
                functions.append((pattern, kind, re.compile(rx), re.compile(rf"(?:.*\.)?(?P<name>{rx})")))
    return Routines(calls, tuple(functions), tuple(files))


_loaded: dict[str, Routines] = {}


def routines() -> Routines:
    """The routines of the shipped file and of the files ``$DYPER_IO_ROUTINES`` names (read once per value)."""
    extra = os.environ.get(ENV, "")
    got = _loaded.get(extra)
    if got is None:
        got = _loaded[extra] = load_routines(p for p in extra.split(os.pathsep) if p)
    return got


# --- naming frames -----------------------------------------------------------------------


def _dotted_path(relative: str) -> str:
    stem = relative[:-3] if relative.endswith(".py") else relative
    parts = [p for p in stem.split(os.sep) if p]
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def dotted_name(file: str, qualname: str, roots: Sequence[str]) -> tuple[str, bool]:
    """(module.qualname, whether the file is library code) of a function."""
    if file.startswith("<frozen ") and file.endswith(">"):
        return f"{file[8:-1]}.{qualname}", True
    for root in roots:
        if file.startswith(root):
            return f"{_dotted_path(file[len(root) :])}.{qualname}", True
    return f"{_dotted_path(file)}.{qualname}", False


@dataclass(frozen=True)
class Hit:
    """Where a stack is doing I/O. Indexes are into the stack, root first."""

    routine: str
    kind: str
    #: the routine's frame; for a C routine, the frame calling it (the leaf)
    at: int
    #: the application frame that called the routine (the nearest library frame if there is none)
    caller: int
    #: the frame whose call instruction enters the routine (None: the thread began in it)
    site: int | None
    #: the routine is a C routine called by the leaf
    c_call: bool


def classify(
    functions: Sequence[tuple[str, str] | None],
    leaf_call: tuple[str, str] | None,
    library: Sequence[bool] | None = None,
) -> Hit | None:
    """The I/O a stack is doing, if any.

    ``functions``: per frame, root first, the listed Python routine it is
    (routine, kind) or None; ``leaf_call``: the listed C routine the leaf
    frame is calling, or None; ``library``: per frame, whether it is library
    code (None: all are, so the caller is the routine's nearest caller).
    """
    n = len(functions)
    for i, found in enumerate(functions):
        if found is not None:
            (routine, kind), at, site, c_call = found, i, (i - 1 if i > 0 else None), False
            break
    else:
        if leaf_call is None or n == 0:
            return None
        (routine, kind), at, site, c_call = leaf_call, n - 1, n - 1, True
    # A C routine is called by its own frame; a Python routine by the frame above it.
    start = at if c_call else at - 1
    caller = max(start, 0)
    if library is not None:
        for j in range(start, -1, -1):
            if not library[j]:
                caller = j
                break
    return Hit(routine, kind, at, caller, site, c_call)


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

#: what /proc/<pid>/io counts: bytes through read/write-like calls (files, sockets, pipes),
#: those calls, and bytes that reached the storage layer
IO_FIELDS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes")
_IO_KEYS = tuple(k.encode() for k in IO_FIELDS)


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
    #: reports between looks for the agent's own native threads (its ticker, ZeroMQ's)
    OWN_TASKS_EVERY = 60

    def __init__(self) -> None:
        self._routines = routines()
        self._roots = library_roots({k: v for k, v in sysconfig.get_paths().items() if isinstance(v, str)})
        self._monitoring = sys.version_info >= (3, 12)
        self._me = threading.get_ident()  # built on the sampler thread
        self._my_native = threading.get_native_id()
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
        self._own_tasks: list[int] = [self._my_native]
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
        if where is not None and not flags & LOC_AGENT:
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
        if self._reports % self.OWN_TASKS_EVERY == 0:
            self._find_own_tasks()
        self._reports += 1
        total = read_io("/proc/self/io")
        if total is None:
            return None
        for tid in self._own_tasks:
            own = read_io(f"/proc/self/task/{tid}/io")
            if own is not None:
                total = [t - o for t, o in zip(total, own, strict=True)]
        return total

    def _find_own_tasks(self) -> None:
        try:
            tasks = [int(t) for t in os.listdir("/proc/self/task")]
        except (OSError, ValueError):
            return
        python = {t.native_id for t in list(threading._active.values())}  # type: ignore[attr-defined]
        # Only threads Python does not know need their names read: usually a handful.
        own = [self._my_native] + [t for t in tasks if t not in python and _comm(t).startswith(("ZMQbg", "dyper-"))]
        if sorted(own) != sorted(self._own_tasks):
            self._own_tasks = own
            # the counters subtracted changed: the monitor starts its differences again
            self._since = [self._since[0], self._since[1] + 1]

    # --- detailing ------------------------------------------------------------------------

    def _thread_io(self) -> dict[int, tuple[int, list[int]]]:
        out = {}
        for ident, native in procfs.app_threads(self._me).items():
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


# --- monitor half -----------------------------------------------------------------------

NOT_RUNNING = (
    "the io collector is not running in the target (name it: DYPER_PROFLETS=io,...): "
    "only listed Python routines are seen, not C calls such as a socket's recv"
)

#: a site: (file, qualname, first line, line)
SiteKey = tuple[str, str, int, int]


@dataclass
class _Row:
    """One (routine, calling function) pair's samples."""

    routine: str
    kind: str
    samples: int = 0
    #: the caller's frames (its lines) -> samples
    callers: dict[int, int] = field(default_factory=dict)
    #: thread ident -> samples
    threads: dict[int, int] = field(default_factory=dict)
    #: call site frame id -> samples
    sites: dict[int, int] = field(default_factory=dict)

    def caller(self) -> int:
        """The caller's line with the most samples (a frame id)."""
        return max(self.callers, key=lambda fid: self.callers[fid])


class IoAnalyzer(Analyzer):
    """I/O routines and their callers from the session's stacks; call counts and bytes from the collector."""

    name = "io"
    #: a thread doing I/O at least this share of its time is a finding
    FINDING_PCT = 50.0

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        self._routines = routines()
        self._roots = library_roots(self.session.paths)
        #: leaf line -> (callee, whether the agent judged the call blocking)
        self.calls: dict[SiteKey, tuple[str, bool]] = {}
        #: per frame id: (listed Python routine or None, library code)
        self._frames: dict[int, tuple[tuple[str, str] | None, bool]] = {}
        #: per stack (root first): (hit, blocking C call), valid while self.calls is unchanged
        self._stacks: dict[tuple[int, ...], tuple[Hit | None, bool]] = {}
        #: the collector's (agent start, generation) -> its last cumulative counters
        self._io_last: dict[tuple[float, int], list[int]] = {}
        #: whole run: [seconds, *IO_FIELDS]
        self.io_total = [0.0] * (1 + len(IO_FIELDS))
        #: site -> [calls, seconds timed, calls timed, seconds counted]
        self.sites: dict[SiteKey, list[float]] = {}
        #: thread ident -> [seconds detailed, *IO_FIELDS]
        self.thread_io: dict[int, list[float]] = {}
        #: whether the collector ever reported: without it C routines go unseen
        self.collector_seen = False
        #: what detailing cost over the run (the last calibrated cost of one counted call)
        self.detailing: dict[str, float] = {"bursts": 0, "seconds": 0.0, "slowdown_s": 0.0, "fixed_s": 0.0}

    # --- merging ----------------------------------------------------------------------

    def merge(self, report: ReportView) -> None:
        if report.data is not None:
            self.collector_seen = True
        data = report.data or {}
        for row in data.get("calls") or ():
            try:
                key = (str(row[0]), str(row[1]), int(row[2]), int(row[3]))
                value = (str(row[4]), bool(row[5]))
            except (IndexError, TypeError, ValueError):
                continue
            if self.calls.get(key) != value:
                self.calls[key] = value
                self._stacks.clear()
                self.session.forget_recent("io")
        io, since = data.get("io"), data.get("since")
        if isinstance(io, list) and isinstance(since, list) and len(io) == len(IO_FIELDS) and len(since) == 2:
            key2 = (float(since[0]), int(since[1]))
            last = self._io_last.get(key2)
            self._io_last[key2] = [int(v) for v in io]
            if last is not None:
                # The first report of a collector only sets where the counting starts.
                row2 = [float(report.window_s)] + [max(0, int(v) - w) for v, w in zip(io, last, strict=True)]
                self.rows.append((report.t, row2))
                for i, v in enumerate(row2):
                    self.io_total[i] += v

    def merge_detail(self, burst: Mapping[str, Any]) -> None:
        length = float(burst.get("length_s") or 0.0)
        if length <= 0:
            return
        d = self.detailing
        d["bursts"] += 1
        d["seconds"] += length
        d["slowdown_s"] += float(burst.get("slowdown_s") or 0.0)
        d["fixed_s"] += float(burst.get("fixed_s") or 0.0)
        if burst.get("call_cost_s") is not None:
            d["call_cost_s"] = float(burst["call_cost_s"])
        if burst.get("counted"):
            for row in burst.get("sites") or ():
                try:
                    key = (str(row[0]), str(row[1]), int(row[2]), int(row[3]))
                    calls, seconds, timed = float(row[5]), float(row[6]), float(row[7])
                except (IndexError, TypeError, ValueError):
                    continue
                slot = self.sites.setdefault(key, [0.0, 0.0, 0.0, 0.0])
                slot[0] += calls
                slot[1] += seconds
                slot[2] += timed
                slot[3] += length
        for row in burst.get("threads") or ():
            if len(row) != 1 + len(IO_FIELDS):
                continue
            t = self.thread_io.setdefault(int(row[0]), [0.0] * (1 + len(IO_FIELDS)))
            t[0] += float(burst.get("threads_s") or length)
            for i, v in enumerate(row[1:]):
                t[i + 1] += max(0.0, float(v))

    # --- the analysis -----------------------------------------------------------------

    def _frame(self, fid: int) -> tuple[tuple[str, str] | None, bool]:
        got = self._frames.get(fid)
        if got is None:
            f = self.session.frames.frames[fid]
            dotted, library = dotted_name(f.file, f.name, self._roots)
            got = self._frames[fid] = (self._routines.function(dotted, library), library)
        return got

    def hit(self, stack: tuple[int, ...]) -> tuple[Hit | None, bool]:
        """Where a stack (frame ids, root first) does I/O, and whether its leaf's call is a blocking one."""
        known = self._stacks.get(stack)
        if known is not None:
            return known
        frames = self.session.frames.frames
        info = [self._frame(fid) for fid in stack]
        leaf = frames[stack[-1]]
        entry = self.calls.get((leaf.file, leaf.name, leaf.firstline, leaf.line))
        leaf_call = None
        if entry is not None:
            leaf_call = self._routines.call(entry[0]) or (entry[0], OTHER_KIND)
        hit = classify([i[0] for i in info], leaf_call, [i[1] for i in info])
        known = (hit, entry is not None and entry[1])
        if len(self._stacks) >= 100_000:
            self._stacks.clear()
        self._stacks[stack] = known
        return known

    def _counts(self, start: float | None, end: float | None) -> tuple[Mapping[StackKey, list[int]], int, float]:
        session = self.session
        if start is None and end is None:
            return session.counts, session.samples, session.duration_s()
        part = session.slice(start, end)
        return part.counts, part.samples, part.seconds

    def _rows(
        self, counts: Mapping[Any, list[int]]
    ) -> tuple[dict[tuple[str, tuple[str, str, int]], _Row], dict[int, list[int]], int]:
        """(rows by (routine, caller function), thread ident -> [I/O samples, samples], all samples)."""
        frames = self.session.frames.frames
        rows: dict[tuple[str, tuple[str, str, int]], _Row] = {}
        threads: dict[int, list[int]] = {}
        grand = 0
        for (tid, stack), (wall, cpu) in counts.items():
            if not stack or wall <= 0:
                continue
            grand += wall
            per = threads.setdefault(tid, [0, 0])
            per[1] += wall
            hit, blocking = self.hit(stack)
            if hit is None:
                continue
            # A blocking call's samples are those not counted as CPU (the
            # leaf's instruction is the call); any other listed routine's are all.
            n = wall - cpu if hit.c_call and blocking else wall
            if n <= 0:
                continue
            per[0] += n
            caller = stack[hit.caller]
            key = (hit.routine, frames[caller].function)
            row = rows.get(key)
            if row is None:
                row = rows[key] = _Row(hit.routine, hit.kind)
            row.samples += n
            row.callers[caller] = row.callers.get(caller, 0) + n
            row.threads[tid] = row.threads.get(tid, 0) + n
            if hit.site is not None:
                row.sites[stack[hit.site]] = row.sites.get(stack[hit.site], 0) + n
        return rows, threads, grand

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        counts, passes, seconds = self._counts(start, end)
        rows, threads, grand = self._rows(counts)
        frames = self.session.frames.frames
        names = self.session.threads
        per_pass = seconds / passes if passes > 0 else 0.0
        # every row's samples at a site: the site's counted calls are shared by them
        at_site: dict[int, int] = {}
        for row in rows.values():
            for fid, n in row.sites.items():
                at_site[fid] = at_site.get(fid, 0) + n
        out_rows = []
        for row in sorted(rows.values(), key=lambda r: -r.samples):
            caller = frames[row.caller()]
            rate: float | None = None
            timed_s = timed_n = 0.0
            for fid, n in row.sites.items():
                f = frames[fid]
                site = self.sites.get((f.file, f.name, f.firstline, f.line))
                if site is None or site[3] <= 0:
                    continue
                share = n / at_site[fid]
                rate = (rate or 0.0) + share * site[0] / site[3]
                timed_s += share * site[1]
                timed_n += share * site[2]
            row_s = row.samples * per_pass
            calls = round(rate * seconds) if rate is not None else None
            if timed_n > 0:
                s_per_call: float | None = timed_s / timed_n
            else:
                s_per_call = row_s / calls if calls else None
            by_thread = sorted(row.threads.items(), key=lambda kv: -kv[1])
            out_rows.append(
                {
                    "routine": row.routine,
                    "kind": row.kind,
                    "caller": caller.name,
                    "caller_file": caller.file,
                    "caller_line": caller.line,
                    "threads": [names.get(tid, f"thread-{tid}") for tid, _ in by_thread],
                    "pct": 100.0 * row.samples / grand if grand else 0.0,
                    "samples": row.samples,
                    "seconds": row_s,
                    "calls_per_s": rate,
                    "calls": calls,
                    "s_per_call": s_per_call,
                    "s_per_call_measured": timed_n > 0,
                }
            )
        io_samples = sum(r.samples for r in rows.values())
        result: dict[str, Any] = {
            "io_pct": 100.0 * io_samples / grand if grand else 0.0,
            "routines": out_rows,
            "threads": self._threads(rows.values(), threads, names),
            "samples": grand,
            "seconds": seconds,
            "detailing": dict(self.detailing),
        }
        if not self.collector_seen:
            result["note"] = NOT_RUNNING
        result.update(self._bytes(start, end))
        return result

    def _threads(
        self, rows: Iterable[_Row], threads: Mapping[int, list[int]], names: Mapping[int, str]
    ) -> list[dict[str, Any]]:
        frames = self.session.frames.frames
        top: dict[int, _Row] = {}
        for row in rows:
            for tid, n in row.threads.items():
                best = top.get(tid)
                if best is None or n > best.threads.get(tid, 0):
                    top[tid] = row
        out: list[dict[str, Any]] = []
        for tid, (io, samples) in threads.items():
            busiest = top.get(tid)
            detail = self.thread_io.get(tid)
            d = detail[0] if detail else 0.0
            out.append(
                {
                    "name": names.get(tid, f"thread-{tid}"),
                    "ident": tid,
                    "io_pct": 100.0 * io / samples if samples else 0.0,
                    "samples": samples,
                    "routine": busiest.routine if busiest is not None else None,
                    "caller": frames[busiest.caller()].name if busiest is not None else None,
                    "read_bytes_per_s": detail[1] / d if detail and d > 0 else None,
                    "write_bytes_per_s": detail[2] / d if detail and d > 0 else None,
                }
            )
        out.sort(key=lambda r: (-float(r["io_pct"]), str(r["name"])))
        return out

    def _bytes(self, start: float | None, end: float | None) -> dict[str, Any]:
        if start is None and end is None:
            total = self.io_total
        else:
            total = [0.0] * (1 + len(IO_FIELDS))
            for row in self.window_rows(start, end):
                for i, v in enumerate(row):
                    total[i] += v
        secs = total[0]

        def rate(field: str) -> float | None:
            return total[1 + IO_FIELDS.index(field)] / secs if secs > 0 else None

        return {
            "read_bytes_per_s": rate("rchar"),
            "write_bytes_per_s": rate("wchar"),
            "read_calls_per_s": rate("syscr"),
            "write_calls_per_s": rate("syscw"),
            "disk_read_bytes_per_s": rate("read_bytes"),
            "disk_write_bytes_per_s": rate("write_bytes"),
        }

    # --- status, priority, findings ---------------------------------------------------

    def _share(self, window_s: float | None) -> tuple[float, int, int]:
        """(I/O share of the threads' samples, routines seen, samples) over the last ``window_s`` seconds."""
        if window_s is not None:
            # Asked after every report: running sums of the windows' rows, not a merge of their stacks.
            sums, _ = self.session.recent("io", window_s, self._window_rows)
            grand = sums.get(None, 0)
            io = sum(sums.values()) - grand
            return (io / grand if grand else 0.0), len(sums) - (None in sums), grand
        counts, _ = self.session.window_counts(window_s)
        rows, _, grand = self._rows(counts)
        io = sum(r.samples for r in rows.values())
        return (io / grand if grand else 0.0), len(rows), grand

    def _window_rows(self, window: WindowView) -> dict[tuple[str, tuple[str, str, int]] | None, int]:
        """One window's I/O samples by (routine, caller function), as :meth:`_rows` counts them; None: all samples."""
        frames = self.session.frames.frames
        table = window.table
        out: dict[tuple[str, tuple[str, str, int]] | None, int] = {}
        grand = 0
        for i, wall, cpu in window.items():
            stack = table[i][1]
            if not stack or wall <= 0:
                continue
            grand += wall
            hit, blocking = self.hit(stack)
            if hit is None:
                continue
            n = wall - cpu if hit.c_call and blocking else wall
            if n <= 0:
                continue
            key = (hit.routine, frames[stack[hit.caller]].function)
            out[key] = out.get(key, 0) + n
        if grand:
            out[None] = grand
        return out

    def status(self) -> Status:
        share, _, samples = self._share(None)
        # Without the collector only Python routines are seen: a share, but not one to trust.
        return Status(share, confidence_of(samples) if self.collector_seen else 0.0)

    def priority(self) -> float | None:
        # DYPER: from the amount of I/O seen and the number of routines doing it
        share, routines_seen, _ = self._share(10.0)
        if routines_seen == 0:
            return 0.1
        return min(1.0, 0.1 + share * (0.5 + 0.5 * min(1.0, routines_seen / 4)))

    def findings(self) -> list[str]:
        result = self.results()
        out = []
        for t in result["threads"]:
            if t["samples"] >= 20 and t["io_pct"] >= self.FINDING_PCT and t["routine"]:
                out.append(
                    f"thread {t['name']} spends {t['io_pct']:.0f}% of its time in I/O, "
                    f"mostly {t['routine']} called from {t['caller']}"
                )
        return out[:3]

    # --- history ----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "calls": [[*k, callee, int(blocking)] for k, (callee, blocking) in self.calls.items()],
            "io_total": list(self.io_total),
            "sites": [[*k, *v] for k, v in self.sites.items()],
            "thread_io": {str(k): v for k, v in self.thread_io.items()},
            "detailing": dict(self.detailing),
            "collector_seen": self.collector_seen,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.calls = {
            (str(r[0]), str(r[1]), int(r[2]), int(r[3])): (str(r[4]), bool(r[5])) for r in state.get("calls") or ()
        }
        self._stacks.clear()
        total = [float(v) for v in state.get("io_total") or ()]
        if len(total) == len(self.io_total):
            self.io_total = total
        self.sites = {
            (str(r[0]), str(r[1]), int(r[2]), int(r[3])): [float(v) for v in r[4:8]] for r in state.get("sites") or ()
        }
        self.thread_io = {int(k): [float(x) for x in v] for k, v in (state.get("thread_io") or {}).items()}
        self.detailing.update({str(k): float(v) for k, v in (state.get("detailing") or {}).items()})
        self.collector_seen = bool(state.get("collector_seen"))


COLLECTOR = IoCollector
ANALYZER = IoAnalyzer
