"""The cpu proflet's agent half, loaded alone in the target (see :mod:`dyper.proflets.cpu`)."""

from __future__ import annotations

import contextlib
import importlib
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from types import CodeType
from typing import Any, ClassVar

from dyper.agent.budget import ProfletCosts
from dyper.agent.proflet import Collector, DetailContext, ReportContext
from dyper.proflets.base import YappiCharge, paired_best

# --- agent half: detailing ---------------------------------------------------------


#: Factor on the calibrated cost of one event (see CpuCollector._calibrate_monitoring).
EVENT_COST_MARGIN = 1.25

#: Declared costs of a burst that counts calls only (see CpuCollector.kind_costs):
#: SLOW a cautious guess its first burst replaces, and the burst's length.
CALLS_SLOW = 0.25
CALLS_ITVL_MS = 2000.0

#: Line bursts whose measured loss the charge follows: the median of the last ones
LOSS_RATIOS_KEPT = 9
#: ... once this many were measured
LOSS_RATIOS_NEEDED = 3
#: A line burst is measured only where its call bursts predict this many candidate
#: calls in it: fewer, and one call more or less moves the figure too far.
LOSS_MIN_CALLS = 20
#: The most the measured loss may raise a line burst's charge (a burst that
#: lost more than four times its charge was disturbed by something else).
LOSS_FACTOR_MAX = 4.0


#: A burst's counts cover at least this share of its length, however large its charge.
COUNTED_MIN = 0.25


#: a call burst's calls per candidate, and the seconds it ran unslowed
_CallBurst = tuple[dict[CodeType, int], float]


def loss_ratio(
    before: tuple[Mapping[CodeType, int], float],
    line: tuple[Mapping[CodeType, int], float, float],
    after: tuple[Mapping[CodeType, int], float],
) -> float | None:
    """What a line burst lost, over what it was charged, from the candidates' call rates.

    ``before`` and ``after`` are the call bursts beside it: calls per
    candidate and the seconds they ran unslowed (length less their charge);
    ``line`` is the line burst's calls, length and charge. A slowed candidate
    is called less often, and so is everything else in a process whose work
    goes round a loop: the line burst lost the time its missing calls would
    have taken at the mean rate of the bursts beside it (a linear drift of
    the rate cancels). None when the calls are too few to tell, when there is
    no charge to compare with, or where the rate is set from outside (a
    service waiting for requests loses nothing this way, and the ratio is
    near zero: the calibrated charge stands).
    """
    line_calls, length, charged = line
    common = [c for c in line_calls if c in before[0] and c in after[0]]
    if not common or charged <= 0 or length <= 0 or before[1] <= 0 or after[1] <= 0:
        return None
    rate = 0.5 * (sum(before[0][c] for c in common) / before[1] + sum(after[0][c] for c in common) / after[1])
    expected = rate * length
    if expected < LOSS_MIN_CALLS:
        return None
    lost = length * (1.0 - sum(line_calls[c] for c in common) / expected)
    return lost / charged


def _calibration_target(n: int) -> int:
    # A small loop of the shape hot code has: a call, then a few lines each time round.
    total = 0
    for i in range(n):
        total += i & 7
    return total


def _frame_calibration_leaf(i: int) -> int:
    return i & 7


def _frame_calibration_target(n: int) -> int:
    # What the 3.11 frame hook costs is per Python frame: a small call each time round.
    total = 0
    for i in range(n):
        total += _frame_calibration_leaf(i)
    return total


def frame_hook() -> Any | None:
    """dyper.agent._fastsample where it has 3.11's frame hook (built for 3.11), else None."""
    if sys.version_info >= (3, 12):
        return None
    try:
        fast = importlib.import_module("dyper.agent._fastsample")
    except ImportError:
        return None
    return fast if hasattr(fast, "frame_hook_start") else None


def _native_calibration_target(n: int) -> int:
    # The same with a C call each time round: what native bursts add is per call.
    total = 0
    for i in range(n):
        total += abs(i)
    return total


def _counted_s(length: float, slowdown: float) -> float:
    """The application's own time a burst's counts cover: a slowed function is
    called less often (yappi halved the paced rate on 3.11), so the rates
    divide by this. At most a fourfold correction."""
    return max(length - slowdown, COUNTED_MIN * length)


def _thread_marks() -> tuple[float, dict[int, float]]:
    """Now, and each thread's CPU seconds (by ident; the agent's own threads left out)."""
    from dyper.proflets.threads.collector import read_clocks

    return time.perf_counter(), {ident: cpu for ident, (_, cpu) in read_clocks().items()}


#: Marks of the threads' CPU time kept (reports and burst ends), and how long
#: before a burst the one it uses must be, for a share to mean anything.
MARKS_KEPT = 4
MARKS_GAP_S = 0.25

#: The most a thread's calls are taken to have been slowed by a yappi burst:
#: a loop of tiny calls ran 40 times slower here; more is a thread that did
#: next to nothing during the burst, where the ratio is noise.
GAIN_MAX = 100.0


def thread_gains(
    before: tuple[float, dict[int, float]],
    start: tuple[float, dict[int, float]],
    end: tuple[float, dict[int, float]],
    loss: float,
    per_call_s: float,
    calls: Mapping[int, int],
) -> dict[int, float]:
    """Per thread, how many times fewer calls it made during a yappi burst than it would have without.

    yappi slows every thread, but whether a thread then calls its functions
    less often depends on the thread. One whose work sets its pace (a loop,
    or a share of a busy GIL) keeps its CPU share and gets less done with it;
    one paced from outside (a timer, a queue) with time to spare spends more
    CPU on the same calls. So: what a thread got done during the burst is its
    CPU time there less its ``calls`` at ``per_call_s`` each, with the slow
    path's ``loss`` taken off the rest; its gain is what its CPU share before
    the burst would have got done in that time, over that, within 1 and
    GAIN_MAX. ``before``, ``start`` and ``end`` are (wall time, CPU seconds by
    thread ident) at the end of the previous burst, and at this one's start and
    end. A thread with nothing to compare is left out.
    """
    (t0, cpu0), (t1, cpu1), (t2, cpu2) = before, start, end
    gains: dict[int, float] = {}
    if t1 - t0 < 0.05 or t2 - t1 <= 0:
        return gains
    for ident, c2 in cpu2.items():
        if ident not in cpu1 or ident not in cpu0:
            continue
        share_before = (cpu1[ident] - cpu0[ident]) / (t1 - t0)
        done = (c2 - cpu1[ident] - calls.get(ident, 0) * per_call_s) * (1.0 - loss)
        if share_before <= 0 or done <= 0:
            continue
        gains[ident] = min(GAIN_MAX, max(1.0, share_before * (t2 - t1) / done))
    return gains


class PyCallCounter:
    """dyper.agent._fastsample.CallCounter in Python, for an agent without its C extension.

    About four times the C counter's cost per event (a Python call each).
    """

    def __init__(self, codes: list[CodeType], native: bool = False) -> None:
        # native time needs a clock read per event: too dear in Python, so this counter does without
        self._codes = set(codes)
        self.calls: dict[CodeType, int] = {}
        self.lines: dict[tuple[CodeType, int], int] = {}

    def on_start(self, code: CodeType, offset: int) -> None:
        if code in self._codes:
            calls = self.calls
            calls[code] = calls.get(code, 0) + 1

    def on_line(self, code: CodeType, line: int) -> None:
        if code in self._codes:
            key = (code, line)
            lines = self.lines
            lines[key] = lines.get(key, 0) + 1

    def counts(self) -> tuple[dict[CodeType, int], dict[tuple[CodeType, int], int]]:
        return dict(self.calls), dict(self.lines)

    def total(self) -> int:
        return sum(self.calls.values()) + sum(self.lines.values())

    def events(self) -> tuple[int, int]:
        return self.total(), 0  # no native events: nothing reads a clock

    def reset(self) -> None:
        self.calls.clear()
        self.lines.clear()

    def native(self) -> tuple[dict[CodeType, float], list[tuple[CodeType, str, int, float]]]:
        return {}, []


def call_counter(codes: list[CodeType], native: bool = False) -> Any:
    """The sys.monitoring callbacks' counter: the C one when the extension is built."""
    try:
        fast = importlib.import_module("dyper.agent._fastsample")
    except ImportError:
        return PyCallCounter(codes)
    return fast.CallCounter(codes, native=native)


_OTHER_EVALUATOR = (
    "another frame evaluator (PEP 523: a debugger or a JIT) is installed in the target; "
    "cpu detailing on 3.11 needs the hook to itself"
)

#: sys.monitoring events of native bursts and the counter method each calls
#: (C_RETURN and C_RAISE come with CALL: they cannot be set on their own)
_NATIVE_CALLBACKS = (
    ("PY_RESUME", "on_resume"),
    ("PY_RETURN", "on_return"),
    ("PY_YIELD", "on_return"),
    ("CALL", "on_call"),
    ("C_RETURN", "on_c_return"),
    ("C_RAISE", "on_c_return"),
)


class CpuCollector(Collector):
    """Exact call and line counts of the candidate functions over a burst.

    The slowdown is measured, not declared: the cost of one event is
    calibrated once (the same callbacks on a small loop, with and without
    the hooks, best of three), and a burst's slowdown is its event count
    times that cost. On 3.12+ the events are the candidates' calls and lines
    only; on 3.11 they are every Python frame evaluated in any thread (the
    frame hook), or with yappi every call, plus the slow path under all bytecode.
    """

    name = "cpu"
    OVHD_MS = 0.5
    # Line events in a tight loop cost several times the line itself: start
    # from a high guess, so the first burst is short rather than over budget.
    SLOW = 3.0
    ITVL_MS = 500.0
    PRTY = 0.5
    # Counting calls does not disturb what other proflets measure much more
    # than sampling does; timing-sensitive proflets leave cpu out of their own list.
    ALLOWS: ClassVar[frozenset[str]] = frozenset({"memory", "io", "heap"})
    DETAILS = True
    #: candidates instrumented per burst
    MAX_CANDIDATES = 8

    def __init__(self, use_frame_hook: bool = True) -> None:
        """``use_frame_hook=False``: on 3.11, count with yappi even where the C frame hook is built."""
        self._monitoring = sys.version_info >= (3, 12)
        self._tool: int | None = None
        self._codes: list[CodeType] = []
        #: the burst's counter (see call_counter), its methods the callbacks
        self._counter: Any = None
        self._event_cost_s: float | None = None
        #: the same for native bursts' clocked events (calls and returns, a clock read each)
        self._native_cost_s: float | None = None
        #: 3.11: the C frame hook (agent._fastsample), what one frame costs under
        #: it, and whether the running burst uses it
        self._hook = frame_hook() if use_frame_hook else None
        self._frame_cost_s: float | None = None
        self._hooked = False
        #: 3.11 without the hook: what a yappi burst costs (its calls, and the slow path under everything)
        self._yappi = YappiCharge(builtins=False)
        #: 3.11: each thread's CPU seconds at the last few reports and burst ends
        #: outside bursts (the CPU shares before a burst), and when this one
        #: began, with the wall times: see thread_gains
        self._marks: deque[tuple[float, dict[int, float]]] = deque(maxlen=MARKS_KEPT)
        self._burst_marks: tuple[float, dict[int, float]] | None = None
        self._end_marks: tuple[float, dict[int, float]] | None = None
        #: this burst times the candidates and their C calls (3.12+, with the line counts)
        self._native = False
        self._started = 0.0
        #: line events slow a hot loop several times over, and a slowed
        #: function is called less often: every other burst counts calls
        #: only, and the rates come from those (see Session._add_burst)
        self._bursts = 0
        self._with_lines = False
        #: the charge of a line burst follows what line bursts measurably
        #: lost here (loss_ratio): the calibration loop is one small function
        #: on one thread, and hot code elsewhere (four threads of it, cpu-4)
        #: lost up to 1.5 times its charge
        self._loss_ratios: deque[float] = deque(maxlen=LOSS_RATIOS_KEPT)
        self._last_calls: _CallBurst | None = None
        #: a line burst waiting for the call burst after it: (the one before, the line burst)
        self._pending_line: tuple[_CallBurst, tuple[dict[CodeType, int], float, float]] | None = None

    def unavailable(self) -> str | None:
        if self._hook is not None:
            return None
        if not self._monitoring and not self.explicit:
            return (
                "cpu detailing on Python 3.11 without dyper's C extension goes through yappi, which slows "
                "every call: name it to turn it on (DYPER_PROFLETS=cpu,threads,timing)"
            )
        if self._monitoring:
            mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
            if all(mon.get_tool(t) is not None for t in (mon.PROFILER_ID, 3, 4)):
                return "every sys.monitoring tool id a profiler may use is taken"
            return None
        try:
            import yappi
        except ImportError:
            return "yappi is not importable in the target"
        if yappi.is_running() or sys.getprofile() is not None or threading.getprofile() is not None:
            return "a profiler is already installed in the target"
        return None

    def prepare(self) -> None:
        """Calibrate the cost of an event on the thread that starts the agent (see Collector.prepare)."""
        if self._hook is not None:
            self._frame_cost_s = self._calibrate_frames()
            return
        if not self._monitoring:
            self._calibrate_yappi()
            self._marks.append(_thread_marks())
            return
        self._tool = self._claim_tool()
        try:
            self._event_cost_s = self._calibrate_monitoring(native=False)
            self._native_cost_s = self._calibrate_monitoring(native=True)
        finally:
            self._release_tool()

    # --- 3.12+: sys.monitoring local events on the candidates only ----------------

    def _claim_tool(self) -> int:
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        for tool in (mon.PROFILER_ID, 3, 4):
            if mon.get_tool(tool) is None:
                mon.use_tool_id(tool, "dyper")
                return int(tool)
        raise RuntimeError("no free sys.monitoring tool id")

    def _release_tool(self) -> None:
        tool = self._tool
        if tool is None:
            return
        self._tool = None
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        for code in self._codes:
            with contextlib.suppress(ValueError):
                mon.set_local_events(tool, code, 0)
        for event in ("PY_START", "LINE", *(e for e, _ in _NATIVE_CALLBACKS)):
            mon.register_callback(tool, getattr(mon.events, event), None)
        mon.free_tool_id(tool)

    def _register(self, counter: Any, native: bool) -> None:
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        mon.register_callback(self._tool, mon.events.PY_START, counter.on_start)
        mon.register_callback(self._tool, mon.events.LINE, counter.on_line)
        for event, method in _NATIVE_CALLBACKS:
            mon.register_callback(self._tool, getattr(mon.events, event), getattr(counter, method) if native else None)

    def _native_events(self) -> int:
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        e = mon.events
        return int(e.PY_RESUME | e.PY_RETURN | e.PY_YIELD | e.CALL)

    def _calibrate_monitoring(self, native: bool) -> float:
        """Seconds one event costs the application, measured here on a small hooked loop.

        Plain events (calls and lines) on a loop of lines; with ``native``,
        clocked events on a loop with a C call each time round, its plain
        events paid at the plain cost (calibrated first). The two differ by
        several times: one cost for both would overcharge a burst of lines
        (cpu-1's hot loop was charged twice what it lost) and undercharge
        one of calls.
        """
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        target = _native_calibration_target if native else _calibration_target
        code = target.__code__
        n, runs = 2000, 7
        assert self._tool is not None
        tool = self._tool
        counter = call_counter([code], native=native)
        self._register(counter, native)
        events = mon.events.PY_START | mon.events.LINE | (self._native_events() if native else 0)
        plain, hooked = paired_best(
            runs,
            lambda: target(n),
            lambda: mon.set_local_events(tool, code, events),
            lambda: mon.set_local_events(tool, code, 0),
        )
        # Every hooked call was counted: two per run (paired_best's untimed one and the timed one).
        plain_events, clocked = (float(k) / (2 * runs) for k in counter.events())
        lost = max(0.0, hooked - plain)
        # The loop is the cheapest code to hook (warm caches, one small frame);
        # real hot code paid about a fifth more per event here, so charge that.
        if not native:
            return EVENT_COST_MARGIN * lost / max(1.0, plain_events)
        plain_cost = (self._event_cost_s or 0.0) / EVENT_COST_MARGIN
        return EVENT_COST_MARGIN * max(0.0, lost - plain_events * plain_cost) / max(1.0, clocked)

    # --- 3.11: the frame hook -----------------------------------------------------------

    def _calibrate_frames(self) -> float:
        """Seconds one Python frame costs the application under the frame hook, measured on a loop of small calls.

        Every frame evaluated in any thread pays this while the hook is in,
        not only the candidates': that is the whole of the burst's slowdown.
        """
        fast = self._hook
        assert fast is not None
        counter = fast.CallCounter([])
        if not fast.frame_hook_start(counter):
            raise RuntimeError(_OTHER_EVALUATOR)
        fast.frame_hook_stop()
        n, runs = 2000, 7
        plain, hooked = paired_best(
            runs, lambda: _frame_calibration_target(n), lambda: fast.frame_hook_start(counter), fast.frame_hook_stop
        )
        return EVENT_COST_MARGIN * max(0.0, hooked - plain) / (n + 1)

    def _start_frames(self) -> None:
        fast = self._hook
        assert fast is not None
        if self._frame_cost_s is None:
            self._frame_cost_s = self._calibrate_frames()
        counter = fast.CallCounter(self._codes)
        if not fast.frame_hook_start(counter):
            raise RuntimeError(_OTHER_EVALUATOR)
        self._counter, self._hooked = counter, True

    def _frames_charge(self, frames: int) -> float:
        return frames * (self._frame_cost_s or 0.0)

    # --- 3.11 without the C extension: yappi for the burst ---------------------------------

    def _calibrate_yappi(self) -> None:
        def leaf() -> None:
            pass

        def calls() -> None:
            for _ in range(500):
                leaf()

        self._yappi.calibrate(calls, 500)

    # --- hooks ----------------------------------------------------------------------

    if sys.version_info < (3, 12):
        # Only where yappi counts: the agent calls a report hook only if the class has one.

        def report(self, ctx: ReportContext) -> dict[str, Any] | None:
            if self._hook is None and self._burst_marks is None:
                # The threads' CPU shares outside bursts, for the next burst's
                # rates (a thread started since the last burst is in them too).
                self._marks.append(_thread_marks())
            return None

    def burst_kinds(self) -> tuple[str, ...]:
        # Line bursts lose most of their length in a hot loop, call bursts
        # next to nothing: each kind is sized by its own cost.
        return ("calls", "lines") if self._monitoring else ("calls",)

    def kind_costs(self, kind: str) -> ProfletCosts:
        if (self._monitoring or self._hook is not None) and kind == "calls":
            # PY_START on a handful of code objects: at most a fifth slower on
            # call-heavy code (bench/detailing.py), next to nothing elsewhere.
            # The call rates come from these bursts, and a thread's calls come
            # in clumps as it takes turns with others for the GIL (over a
            # quarter of a second, a paced thread's rate ran from a tenth to
            # twice its mean): long bursts average the clumps out.
            return ProfletCosts(self.name, self.OVHD_MS, CALLS_SLOW, CALLS_ITVL_MS, self.PRTY)
        return self.costs()

    def burst_kind(self) -> str:
        return "lines" if self._monitoring and self._bursts % 2 == 1 else "calls"

    def start_detail(self, ctx: DetailContext) -> None:
        self._codes = list(ctx.candidates[: self.MAX_CANDIDATES])
        self._with_lines = self.burst_kind() == "lines"
        self._bursts += 1
        if self._monitoring:
            mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
            self._tool = self._claim_tool()
            # Native time comes with the line counts: both make the burst
            # dearer, and the call rates come from the other bursts.
            native = self._native = self._with_lines
            if self._event_cost_s is None:
                self._event_cost_s = self._calibrate_monitoring(native=False)
            if native and self._native_cost_s is None:
                self._native_cost_s = self._calibrate_monitoring(native=True)
            self._counter = call_counter(self._codes, native=native)
            self._register(self._counter, native)
            events = mon.events.PY_START
            if native:
                events |= mon.events.LINE | self._native_events()
            for code in self._codes:
                mon.set_local_events(self._tool, code, events)
        elif self._hook is not None:
            self._start_frames()
        else:
            import yappi

            if self._yappi.per_call_s is None:
                self._calibrate_yappi()
            yappi.set_clock_type("wall")
            yappi.clear_stats()
            self._burst_marks = _thread_marks()
            self._yappi.started()
            yappi.start(builtins=False, profile_threads=True)
        self._started = time.perf_counter()

    def _calibrated(self, counter: Any) -> float:
        """The slowdown of a sys.monitoring burst so far by the calibration: its events, each class at its cost."""
        if counter is None:
            return 0.0
        plain, clocked = counter.events()
        return int(plain) * (self._event_cost_s or 0.0) + int(clocked) * (self._native_cost_s or 0.0)

    @property
    def loss_factor(self) -> float:
        """What line bursts are charged over their calibrated cost: the median measured loss, at least 1."""
        if len(self._loss_ratios) < LOSS_RATIOS_NEEDED:
            return 1.0
        return min(LOSS_FACTOR_MAX, max(1.0, statistics.median(self._loss_ratios)))

    def _charged(self, counter: Any) -> float:
        charge = self._calibrated(counter)
        return charge * self.loss_factor if self._with_lines else charge

    def _measure_loss(self, calls: dict[CodeType, int], length: float, calibrated: float) -> None:
        """Keep the loss ratio of a line burst once the call bursts on both sides of it are in."""
        if self._with_lines:
            before = self._last_calls
            self._pending_line = (before, (calls, length, calibrated)) if before is not None else None
            return
        # A call burst's own slowdown is small (a call event each); its charge
        # is taken off at most down to half its length, so an overcharging
        # calibration cannot make the rate beside a line burst absurd.
        here = (calls, max(length - calibrated, 0.5 * length))
        if self._pending_line is not None:
            before, line = self._pending_line
            ratio = loss_ratio(before, line, here)
            if ratio is not None:
                self._loss_ratios.append(min(LOSS_FACTOR_MAX, max(0.0, ratio)))
        self._pending_line = None
        self._last_calls = here

    def slowdown_s(self) -> float:
        if self._hooked:
            assert self._hook is not None
            return self._frames_charge(self._hook.frame_hook_frames())
        if not self._monitoring:
            # yappi's stats cost a walk over every function seen: too dear to
            # read during the burst, so its calls are charged at the end; the
            # slow path under every instruction is the larger part, and it is known now.
            return self._yappi.slowdown_s(0)
        return self._charged(self._counter)

    def stop_detail(self) -> dict[str, Any]:
        length = time.perf_counter() - self._started
        counted_by: dict[CodeType, float] = {}
        if self._monitoring:
            self._release_tool()
            counter = self._counter
            counts, lines = counter.counts() if counter is not None else ({}, {})
            calls = {c: counts.get(c, 0) for c in self._codes}
            slowdown = self._charged(counter)
            counted = _counted_s(length, slowdown)
            self._measure_loss(calls, length, self._calibrated(counter))
        elif self._hooked:
            assert self._hook is not None
            frames = self._hook.frame_hook_stop()
            self._hooked = False
            counts, lines = self._counter.counts() if self._counter is not None else ({}, {})
            calls = {c: counts.get(c, 0) for c in self._codes}
            slowdown = self._frames_charge(frames)
            counted = _counted_s(length, slowdown)
        else:
            calls, events, per_thread, thread_calls = self._stop_yappi()
            lines = {}
            slowdown = self._yappi.slowdown_s(events)
            counted = _counted_s(length, slowdown)
            counted_by = self._counted_by_thread(per_thread, thread_calls, length, counted)
        result: dict[str, Any] = {
            "length_s": length,
            "slowdown_s": slowdown,
            "counted_s": counted,
            "functions": [
                [c.co_filename, c.co_qualname, c.co_firstlineno, n, *([counted_by[c]] if c in counted_by else [])]
                for c, n in calls.items()
            ],
            "lines": [[c.co_filename, c.co_qualname, c.co_firstlineno, line, n] for (c, line), n in lines.items()],
            "lines_counted": self._with_lines,
        }
        if self._monitoring and self._with_lines:
            result["loss_factor"] = self.loss_factor
        if self._native and self._counter is not None:
            own, callees = self._counter.native()
            result["native"] = {
                "functions": [[c.co_filename, c.co_qualname, c.co_firstlineno, sec] for c, sec in own.items()],
                "callees": [
                    [c.co_filename, c.co_qualname, c.co_firstlineno, name, n, sec] for c, name, n, sec in callees
                ],
            }
        self._counter, self._codes, self._native = None, [], False
        return result

    def _stop_yappi(self) -> tuple[dict[CodeType, int], int, dict[int, dict[CodeType, int]], dict[int, int]]:
        """Calls per candidate, every call yappi saw, and per thread ident the candidates' calls and every call."""
        import yappi

        yappi.stop()
        # Before the stats walk below, which runs at full speed: the burst ends here.
        self._end_marks = _thread_marks()
        try:
            # yappi names methods its own way; file and first line name a function alike.
            wanted = {(c.co_filename, c.co_firstlineno): c for c in self._codes}
            calls = dict.fromkeys(self._codes, 0)
            events = 0
            for stat in yappi.get_func_stats():
                events += stat.ncall
                code = wanted.get((stat.module, stat.lineno))
                if code is not None:
                    calls[code] += stat.ncall
            per_thread: dict[int, dict[CodeType, int]] = {}
            thread_calls: dict[int, int] = {}
            if any(calls.values()):
                for thread in yappi.get_thread_stats():
                    ident = int(thread.tid)
                    mine = per_thread.setdefault(ident, {})
                    for stat in yappi.get_func_stats(filter={"ctx_id": thread.id}):
                        thread_calls[ident] = thread_calls.get(ident, 0) + stat.ncall
                        code = wanted.get((stat.module, stat.lineno))
                        if code is not None:
                            mine[code] = mine.get(code, 0) + stat.ncall
        finally:
            yappi.clear_stats()
        return calls, events, per_thread, thread_calls

    def _counted_by_thread(
        self,
        per_thread: Mapping[int, Mapping[CodeType, int]],
        thread_calls: Mapping[int, int],
        length: float,
        counted: float,
    ) -> dict[CodeType, float]:
        """Per candidate, the seconds of unslowed running its calls amount to (see thread_gains).

        A thread with no gain of its own is taken as slowed like the whole
        process (``counted`` of the burst's ``length``).
        """
        start, end = self._burst_marks, self._end_marks
        self._burst_marks = self._end_marks = None
        if start is None or end is None:
            return {}
        # The latest mark far enough before the burst to give each thread's share there.
        earlier = [m for m in self._marks if start[0] - m[0] >= MARKS_GAP_S]
        self._marks.append(end)
        if not earlier:
            return {}
        before = earlier[-1]
        gains = thread_gains(before, start, end, self._yappi.loss, self._yappi.per_call_s or 0.0, thread_calls)
        fallback = length / counted
        weighted: dict[CodeType, float] = {}
        raw: dict[CodeType, int] = {}
        for ident, calls in per_thread.items():
            gain = gains.get(ident, fallback)
            for code, n in calls.items():
                weighted[code] = weighted.get(code, 0.0) + n * gain
                raw[code] = raw.get(code, 0) + n
        return {c: length * raw[c] / weighted[c] for c in raw if weighted[c] > 0}

    def close(self) -> None:
        if self._monitoring:
            self._release_tool()
        elif self._hook is not None:
            self._hook.frame_hook_stop()
            self._hooked = False
            self._counter = None
        elif "yappi" in sys.modules:
            yappi = sys.modules["yappi"]
            if yappi.is_running():
                yappi.stop()
                yappi.clear_stats()
        self._codes = []


COLLECTOR = CpuCollector
