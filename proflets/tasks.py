"""The tasks proflet: where the wall time of asyncio tasks goes, and how healthy each event loop is.

A thread's stack in an asyncio service shows the event loop and the one task
that happens to run; the waiting tasks, what they wait on and for how long,
are not on any stack. This proflet samples them.

The collector (in the target) makes its own sampling passes (``poll``),
paced so they cost about ``PASS_SHARE`` of the budget and charged as
sampling. In each pass, for every running event loop:

* the **running task**: its stack is the loop thread's stack from the leaf
  up to the task's coroutine frame (its await chain is on the thread's stack
  while it runs), charged as wall and cpu;
* up to ``SUSPENDED_PER_PASS`` **suspended tasks**, drawn at random from all
  the process's tasks: each one's await chain, followed through ``cr_await``
  (``gi_yieldfrom`` for generator-based coroutines) from the task's coroutine
  down to where it waits, with a last frame naming the task it awaits when
  it awaits one. Each is charged the pass's seconds times the number of
  tasks over the number drawn: an unbiased estimate of the wall time all
  suspended tasks spend at each chain, at a cost that does not grow with the
  number of tasks (the draw is from a C-level copy of asyncio's task set);
* **loop blocking**: the callback the loop runs (the ``Handle`` in
  ``Handle._run``'s frame). The same callback seen by passes spanning
  ``BLOCK_S`` or more is a blocked loop, reported with the callback's most
  frequent stack (the culprit) and the task it belongs to.

Once a second a census counts each loop's tasks and posts a probe callback
(``call_soon_threadsafe``) whose delay until it runs is the loop's lag.

Stacks are sent as frames (file, function, first line, line) rather than the
agent's location ids, so the task view is independent of the stack tables.
In the monitor, :meth:`TasksAnalyzer.profile` turns a window of them into a
:class:`monitor.profile.Profile` whose "threads" are task names (numbered
names such as ``Task-12`` lose their number), with milliseconds as counts:
the task view, which every export and the bottleneck search read as they
read the thread view.

Version notes (tested on 3.11, 3.12, 3.13): 3.11 keeps every task in
``asyncio.tasks._all_tasks``; 3.12 and 3.13 keep scheduled tasks in
``_scheduled_tasks`` and eager ones in ``_eager_tasks``. ``_current_tasks``
(loop -> running task) and ``Task._fut_waiter`` are the C module's own in
all three.
"""

from __future__ import annotations

import math
import os
import random
import re
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from dyper.agent.proflet import Collector, ReportContext
from dyper.monitor.model.libraries import library_predicate
from dyper.proflets.base import Analyzer, ReportView, SessionView, Status, confidence_of

if TYPE_CHECKING:
    from dyper.monitor.model.profile import Profile

#: Share of the budget the passes (and the agent's wake-ups for them) aim to cost: the rest stays
#: with stack sampling and detailing. In an asyncio service a task pass tells as much as a stack sample.
PASS_SHARE = 0.3
#: Passes at most this often and at least this often while there are tasks.
MIN_PASS_S = 0.01
MAX_PASS_S = 0.5
#: Without asyncio, or with no task, look again this often.
IDLE_S = 2.0
#: Suspended tasks whose await chains one pass follows.
SUSPENDED_PER_PASS = 8
#: Frames followed per chain or walked per thread stack, at most.
MAX_DEPTH = 128
#: A callback running this long or longer blocks the loop (asyncio's own slow_callback_duration).
BLOCK_S = float(os.environ.get("DYPER_LOOP_BLOCK_MS", "100")) / 1000.0
#: How often each loop's tasks are counted and its lag probed, at most; and the budget's share for it.
CENSUS_S = 1.0
CENSUS_SHARE = 0.05
#: At most this many tasks are looked at by one census (a sample of them beyond).
CENSUS_MAX = 5000
#: Bounds on what one report window keeps.
MAX_STACKS = 4000
MAX_BLOCKS = 64
MAX_BLOCK_STACKS = 32

_NUMBERED = re.compile(r"-\d+$")
ADDRESS_MASK = (1 << 48) - 1

#: A frame in a stack: instruction offset << 48 | id(code) (user-space addresses fit in 48 bits), as
#: the agent's own walker keys them: an int hashes at once, a code object is hashed from its contents
#: every time (two thirds of a pass's time, measured). Negative: a pseudo frame (an awaited task's name).
FrameKey = int


def task_group(name: str) -> str:
    """A task's name without asyncio's running number: ``Task-12`` -> ``Task``."""
    return _NUMBERED.sub("", name) or name


class _LoopState:
    """What the collector knows of one event loop between reports."""

    __slots__ = (
        "block_stacks",
        "block_task",
        "busy_s",
        "first",
        "handle",
        "lags",
        "last",
        "loop",
        "passes",
        "probe_out",
        "seconds",
        "tasks",
        "thread",
    )

    def __init__(self, loop: Any) -> None:
        self.loop = weakref.ref(loop)
        self.thread: int | None = None
        self.passes = 0
        self.seconds = 0.0
        self.busy_s = 0.0
        self.tasks: list[int] = []
        #: lags measured by probes: appended from the loop's thread, taken by the agent's
        self.lags: deque[float] = deque(maxlen=256)
        self.probe_out = False
        #: the callback running at the last pass (a weak reference), and since when
        self.handle: Callable[[], Any] | None = None
        self.first = self.last = 0.0
        self.block_task = ""
        self.block_stacks: dict[tuple[FrameKey, ...], int] = {}


class TasksCollector(Collector):
    name = "tasks"

    def __init__(self) -> None:
        self._closed = False
        self._last: float | None = None
        self._interval = MIN_PASS_S
        self._pass_s = 0.0  # moving mean of a pass's own time
        self._next_census = 0.0
        self._loops: dict[int, _LoopState] = {}
        self._stacks: dict[tuple[str, tuple[FrameKey, ...]], list[float]] = {}
        self._dropped_s = 0.0
        self._blocks: list[dict[str, Any]] = []
        self._passes = 0  # this window's
        self._passes_total = 0
        self._handle_run: CodeType | None = None
        self._task_type: type | None = None
        self._rng = random.Random()
        self._wall_offset = 0.0
        #: the window's code objects by id (kept alive so an id is not reused before the report)
        self._codes: dict[int, CodeType] = {}
        #: pseudo frames: -1 - index -> text; group names by task name
        self._pseudo: dict[str, int] = {}
        self._groups: dict[str, str] = {}

    # --- the passes (agent's thread, GIL held) ---------------------------------------

    def poll(self, now: float, budget: float, wake_s: float = 0.0) -> float:
        tasks_mod = sys.modules.get("asyncio.tasks")
        if self._closed or tasks_mod is None:
            self._last = None
            return IDLE_S
        refs = _task_refs(tasks_mod)
        if now >= self._next_census:
            t0 = time.perf_counter()
            self._census(refs, tasks_mod)
            took = time.perf_counter() - t0
            # Counting every task costs in proportion to their number: as often as
            # CENSUS_SHARE of the budget pays for, once a second at most.
            rate = CENSUS_SHARE * budget
            self._next_census = now + max(CENSUS_S, took / rate if rate > 0 else CENSUS_S)
        if not self._loops:
            self._last = None
            return IDLE_S if not refs else CENSUS_S
        dt = 0.0 if self._last is None else min(now - self._last, 2.0 * self._interval)
        self._last = now
        self._wall_offset = time.time() - now  # blocks are reported in wall time, as reports are
        t0 = time.perf_counter()
        self._pass(now, dt, refs, tasks_mod)
        took = time.perf_counter() - t0
        self._passes_total += 1
        # A plain mean over the first passes, then a moving average.
        self._pass_s += (took - self._pass_s) / min(self._passes_total, 10)
        rate = PASS_SHARE * budget
        cost = self._pass_s + wake_s
        self._interval = min(MAX_PASS_S, max(MIN_PASS_S, cost / rate if rate > 0 else MAX_PASS_S))
        return self._interval

    def _census(self, refs: list[Any], tasks_mod: Any) -> None:
        """Count each loop's live tasks, find new loops, post the lag probes."""
        if self._task_type is None:
            self._task_type = getattr(sys.modules.get("asyncio"), "Task", None)
        if self._handle_run is None:
            events = sys.modules.get("asyncio.events")
            run = getattr(getattr(events, "Handle", None), "_run", None)
            self._handle_run = getattr(run, "__code__", None)
        picks = refs if len(refs) <= CENSUS_MAX else self._rng.sample(refs, CENSUS_MAX)
        scale = len(refs) / len(picks) if picks else 1.0
        counts: dict[int, int] = {}
        loops: dict[int, Any] = {}
        for ref in picks:
            task = ref()
            if task is None or task.done():
                continue
            loop = task.get_loop()
            key = id(loop)
            counts[key] = counts.get(key, 0) + 1
            loops[key] = loop
        for loop in list(getattr(tasks_mod, "_current_tasks", {})):
            loops.setdefault(id(loop), loop)
        for key, loop in loops.items():
            state = self._loops.get(key)
            if state is None or state.loop() is not loop:
                state = self._loops[key] = _LoopState(loop)
            state.thread = getattr(loop, "_thread_id", None)
            state.tasks.append(round(counts.get(key, 0) * scale))
        for key, state in list(self._loops.items()):
            loop = state.loop()
            if loop is None or loop.is_closed():
                del self._loops[key]
                continue
            if key not in loops:
                state.tasks.append(0)
            if not state.probe_out and loop.is_running():
                state.probe_out = True
                try:
                    loop.call_soon_threadsafe(_probe_done, state, time.perf_counter())
                except RuntimeError:  # closed since: nothing to measure
                    state.probe_out = False

    def _pass(self, now: float, dt: float, refs: list[Any], tasks_mod: Any) -> None:
        self._passes += 1
        current = dict(getattr(tasks_mod, "_current_tasks", {}))
        frames = sys._current_frames()
        running: set[int] = set()
        for state in list(self._loops.values()):
            loop = state.loop()
            if loop is None or state.thread is None:
                continue
            frame = frames.get(state.thread)
            if frame is None:
                continue
            task = current.get(loop)
            if task is not None:
                running.add(id(task))
            self._running(state, frame, task, now, dt)
        if dt <= 0 or not refs:
            return
        picks = refs if len(refs) <= SUSPENDED_PER_PASS else self._rng.sample(refs, SUSPENDED_PER_PASS)
        weight = dt * len(refs) / len(picks)
        for ref in picks:
            task = ref()
            if task is None or id(task) in running or task.done():
                continue
            self._add(self._group(task), tuple(self._await_chain(task)), weight, 0.0)

    def _running(self, state: _LoopState, frame: FrameType, task: Any, now: float, dt: float) -> None:
        """The loop thread's callback now: the running task's stack, and whether a callback holds the loop."""
        coro = task.get_coro() if task is not None else None
        top = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        stack: list[FrameKey] = []
        cut = 0
        handle = None
        handle_run = self._handle_run
        codes = self._codes
        f: FrameType | None = frame
        while f is not None and len(stack) < MAX_DEPTH:
            code = f.f_code
            if code is handle_run:
                try:
                    handle = f.f_locals.get("self")
                except Exception:  # a frame's locals that cannot be read: no callback identity
                    handle = None
                break
            key = id(code)
            if key not in codes:
                codes[key] = code
            stack.append(f.f_lasti << 48 | key)
            if f is top:
                cut = len(stack)
            f = f.f_back
        state.passes += 1
        state.seconds += dt
        if task is not None and cut and dt > 0:
            self._add(self._group(task), tuple(reversed(stack[:cut])), dt, dt)
        if handle is None:
            self._close_block(state)
            return
        state.busy_s += dt
        root_first = tuple(reversed(stack))
        seen = state.handle() if state.handle is not None else None
        if seen is handle:
            state.last = now
            if root_first in state.block_stacks or len(state.block_stacks) < MAX_BLOCK_STACKS:
                state.block_stacks[root_first] = state.block_stacks.get(root_first, 0) + 1
            if task is not None and not state.block_task:
                state.block_task = task.get_name()
            return
        self._close_block(state)
        try:
            state.handle = weakref.ref(handle)
        except TypeError:  # a loop whose callbacks cannot be weakly referenced: no block detection
            state.handle = None
            return
        state.first = state.last = now
        state.block_task = task.get_name() if task is not None else ""
        state.block_stacks = {root_first: 1}

    def _close_block(self, state: _LoopState) -> None:
        """The callback seen last has ended: a block if passes saw it run for BLOCK_S or more."""
        if state.handle is None:
            return
        state.handle = None
        seen = state.last - state.first
        passes = sum(state.block_stacks.values())
        if seen <= 0 or passes < 2:
            return
        # It began and ended somewhere in the gaps before its first and after its
        # last pass: on average one mean gap more than the passes saw.
        estimate = seen + seen / (passes - 1)
        if estimate < BLOCK_S or len(self._blocks) >= MAX_BLOCKS:
            return
        stack = max(state.block_stacks.items(), key=lambda kv: kv[1])[0]
        self._blocks.append(
            {
                "t": state.first + self._wall_offset,
                "thread": state.thread,
                "task": state.block_task,
                "seen_s": seen,
                "duration_s": estimate,
                "passes": passes,
                "stack": stack,
            }
        )

    def _await_chain(self, task: Any) -> list[FrameKey]:
        """A suspended task's await chain, root first: its coroutine, what that awaits, and so on."""
        out: list[FrameKey] = []
        codes = self._codes
        coro = task.get_coro()
        while coro is not None and len(out) < MAX_DEPTH:
            f = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if f is None:
                break
            code = f.f_code
            key = id(code)
            if key not in codes:
                codes[key] = code
            out.append(f.f_lasti << 48 | key)
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        waiter = getattr(task, "_fut_waiter", None)
        if waiter is not None and self._task_type is not None and isinstance(waiter, self._task_type):
            text = f"awaiting task {self._group(waiter)}"
            pseudo = self._pseudo.get(text)
            if pseudo is None:
                pseudo = self._pseudo[text] = -1 - len(self._pseudo)
            out.append(pseudo)
        return out

    def _group(self, task: Any) -> str:
        name = task.get_name()
        group = self._groups.get(name)
        if group is None:
            if len(self._groups) > 10_000:
                self._groups.clear()
            group = self._groups[name] = task_group(name)
        return group

    def _add(self, group: str, stack: tuple[FrameKey, ...], wall: float, cpu: float) -> None:
        self._dropped_s += _accumulate(self._stacks, (group, stack), wall, cpu, MAX_STACKS)

    # --- the report -------------------------------------------------------------------------

    def report(self, ctx: ReportContext) -> dict[str, Any] | None:
        if not self._loops and not self._stacks and not self._blocks:
            return None
        frames: list[list[Any]] = []
        index: dict[FrameKey, int] = {}
        texts = {v: k for k, v in self._pseudo.items()}

        def ids(stack: tuple[FrameKey, ...]) -> list[int]:
            out = []
            for key in stack:
                i = index.get(key)
                if i is None:
                    i = index[key] = len(frames)
                    if key < 0:
                        frames.append(["<asyncio>", texts.get(key, "awaiting"), 0, 0])
                    else:
                        code = self._codes[key & ADDRESS_MASK]
                        frames.append([code.co_filename, code.co_qualname, code.co_firstlineno, _line(code, key >> 48)])
                out.append(i)
            return out

        stacks = [[group, wall, cpu, ids(stack)] for (group, stack), (wall, cpu) in self._stacks.items()]
        blocks = [{**b, "stack": ids(b["stack"])} for b in self._blocks]
        names = {t.ident: t.name for t in threading.enumerate()}
        loops = []
        for state in self._loops.values():
            lags = []
            while state.lags:
                lags.append(state.lags.popleft())
            loops.append(
                {
                    "thread": state.thread,
                    "name": names.get(state.thread or -1, f"thread-{state.thread}"),
                    "passes": state.passes,
                    "seconds": state.seconds,
                    "busy_s": state.busy_s,
                    "tasks": state.tasks,
                    "lag_s": lags,
                }
            )
            state.passes = 0
            state.seconds = state.busy_s = 0.0
            state.tasks = []
        out = {
            "stacks": stacks,
            "frames": frames,
            "blocks": blocks,
            "loops": loops,
            "passes": self._passes,
            "pass_s": self._pass_s,
            "interval_s": self._interval,
            "dropped_s": self._dropped_s,
        }
        self._stacks = {}
        self._blocks = []
        # Still needed: the block being watched has keys of these (its stacks go in a later report).
        held = {k & ADDRESS_MASK for state in self._loops.values() for st in state.block_stacks for k in st if k >= 0}
        self._codes = {k: c for k, c in self._codes.items() if k in held}
        self._passes = 0
        self._dropped_s = 0.0
        return out

    def close(self) -> None:
        # Probes already posted still run, harmlessly: they only note a time in a state nobody reads.
        self._closed = True
        self._loops.clear()
        self._stacks.clear()
        self._blocks.clear()


def _accumulate(into: dict[Any, list[float]], key: Any, wall: float, cpu: float, limit: int) -> float:
    """Add [wall, cpu] under ``key``; a new key past ``limit`` keys is not kept: returns the wall time dropped."""
    row = into.get(key)
    if row is None:
        if len(into) >= limit:
            return wall
        row = into[key] = [0.0, 0.0]
    row[0] += wall
    row[1] += cpu
    return 0.0


def _line(code: CodeType, lasti: int) -> int:
    """The line of the instruction at byte offset ``lasti`` (the code's first line when unknown)."""
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


def _probe_done(state: _LoopState, posted: float) -> None:
    """Runs in the loop's own thread: how long a callback posted at ``posted`` waited to run."""
    try:
        state.lags.append(time.perf_counter() - posted)
    finally:
        state.probe_out = False


def _task_refs(tasks_mod: Any) -> list[Any]:
    """Weak references to every task of the process (dead ones included), copied at C speed."""
    refs: list[Any] = []
    for name in ("_all_tasks", "_scheduled_tasks"):  # 3.11; 3.12+
        weak = getattr(tasks_mod, name, None)
        data = getattr(weak, "data", None)
        if data is not None:
            refs = list(data)
    eager = getattr(tasks_mod, "_eager_tasks", None)  # 3.12+: tasks that run at once when created
    if eager:
        refs.extend(weakref.ref(t) for t in list(eager))
    return refs


# --- the monitor's half -----------------------------------------------------------------------

#: Whole-run stacks kept, at most: beyond, new chains are counted in "dropped_s" only.
MAX_TOTAL_STACKS = 50_000
#: Blocks kept for the whole run (the newest).
BLOCKS_KEPT = 1000
#: Lags kept for the whole run's percentiles (the newest).
LAGS_KEPT = 20_000
#: Rows of a results' timeline, at most.
TIMELINE_POINTS = 120

StackKey = tuple[int, tuple[int, ...]]  # (task group id, frame ids root first)


class _LoopTotals:
    __slots__ = (
        "blocked_s",
        "blocks",
        "busy_s",
        "lags",
        "name",
        "passes",
        "seconds",
        "tasks_max",
        "tasks_n",
        "tasks_sum",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.passes = 0
        self.seconds = self.busy_s = self.blocked_s = 0.0
        self.tasks_sum = self.tasks_n = self.tasks_max = self.blocks = 0
        self.lags: deque[float] = deque(maxlen=LAGS_KEPT)

    def add(self, loop: Mapping[str, Any], blocks: list[dict[str, Any]]) -> None:
        self.name = str(loop.get("name") or self.name)
        self.passes += int(loop.get("passes") or 0)
        self.seconds += float(loop.get("seconds") or 0.0)
        self.busy_s += float(loop.get("busy_s") or 0.0)
        tasks = [int(n) for n in loop.get("tasks") or ()]
        self.tasks_sum += sum(tasks)
        self.tasks_n += len(tasks)
        self.tasks_max = max([self.tasks_max, *tasks])
        self.lags.extend(float(x) for x in loop.get("lag_s") or ())
        self.blocks += len(blocks)
        self.blocked_s += sum(float(b["duration_s"]) for b in blocks)

    def to_json(self, thread: int) -> dict[str, Any]:
        lags = sorted(self.lags)
        return {
            "thread": self.name,
            "ident": thread,
            "tasks_mean": self.tasks_sum / self.tasks_n if self.tasks_n else 0.0,
            "tasks_max": self.tasks_max,
            "busy_pct": 100.0 * self.busy_s / self.seconds if self.seconds > 0 else 0.0,
            "lag_ms_p50": 1000.0 * _quantile(lags, 0.5),
            "lag_ms_p99": 1000.0 * _quantile(lags, 0.99),
            "lag_ms_max": 1000.0 * lags[-1] if lags else 0.0,
            "lag_probes": len(lags),
            "blocks": self.blocks,
            "blocked_s": self.blocked_s,
            "blocked_pct": 100.0 * self.blocked_s / self.seconds if self.seconds > 0 else 0.0,
            "passes": self.passes,
            "seconds": self.seconds,
        }


class TasksAnalyzer(Analyzer):
    name = "tasks"

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        #: frames (file, function, first line, line) and task groups, interned
        self.frames: list[tuple[str, str, int, int]] = []
        self._frame_ids: dict[tuple[str, str, int, int], int] = {}
        self.groups: list[str] = []
        self._group_ids: dict[str, int] = {}
        #: whole run: (group, stack) -> [wall s, cpu s]
        self.total: dict[StackKey, list[float]] = {}
        self.loops: dict[int, _LoopTotals] = {}
        self.blocks: deque[dict[str, Any]] = deque(maxlen=BLOCKS_KEPT)
        self.passes = 0
        self.dropped_s = 0.0
        self.pass_s = 0.0
        self.interval_s = 0.0

    def _frame(self, f: Any) -> int:
        key = (str(f[0]), str(f[1]), int(f[2]), int(f[3]))
        i = self._frame_ids.get(key)
        if i is None:
            i = self._frame_ids[key] = len(self.frames)
            self.frames.append(key)
        return i

    def _group(self, name: str) -> int:
        i = self._group_ids.get(name)
        if i is None:
            i = self._group_ids[name] = len(self.groups)
            self.groups.append(name)
        return i

    def merge(self, report: ReportView) -> None:
        data = report.data
        if not data:
            return
        fids = [self._frame(f) for f in data.get("frames") or ()]
        stacks: dict[StackKey, list[float]] = {}
        for group, wall, cpu, ids in data.get("stacks") or ():
            key = (self._group(str(group)), tuple(fids[i] for i in ids))
            row = stacks.setdefault(key, [0.0, 0.0])
            row[0] += float(wall)
            row[1] += float(cpu)
        blocks = []
        for b in data.get("blocks") or ():
            blocks.append(
                {
                    "t": float(b["t"]),
                    "thread": b.get("thread"),
                    "task": str(b.get("task") or ""),
                    "duration_s": float(b["duration_s"]),
                    "passes": int(b.get("passes") or 0),
                    "stack": tuple(fids[i] for i in b.get("stack") or ()),
                }
            )
        loops = {}
        for loop in data.get("loops") or ():
            thread = int(loop.get("thread") or 0)
            loops[thread] = loop
            mine = [b for b in blocks if b["thread"] == loop.get("thread")]
            self.loops.setdefault(thread, _LoopTotals(str(loop.get("name") or thread))).add(loop, mine)
        self.blocks.extend(blocks)
        for key, (wall, cpu) in stacks.items():
            self.dropped_s += _accumulate(self.total, key, wall, cpu, MAX_TOTAL_STACKS)
        self.passes += int(data.get("passes") or 0)
        self.dropped_s += float(data.get("dropped_s") or 0.0)
        self.pass_s = float(data.get("pass_s") or 0.0)
        self.interval_s = float(data.get("interval_s") or 0.0)
        self.rows.append((report.t, (stacks, loops, blocks, report.window_s)))

    # --- windows -------------------------------------------------------------------------------

    def window(
        self, start: float | None, end: float | None
    ) -> tuple[dict[StackKey, list[float]], dict[int, _LoopTotals], list[dict[str, Any]]]:
        """The stacks, loops and blocks of the reports ending in (start, end] (whole run: both None)."""
        if start is None and end is None:
            return self.total, self.loops, list(self.blocks)
        stacks: dict[StackKey, list[float]] = {}
        loops: dict[int, _LoopTotals] = {}
        blocks: list[dict[str, Any]] = []
        for part, per_loop, blocks_of, _ in self.window_rows(start, end):
            for key, (wall, cpu) in part.items():
                row = stacks.setdefault(key, [0.0, 0.0])
                row[0] += wall
                row[1] += cpu
            for thread, loop in per_loop.items():
                mine = [b for b in blocks_of if b["thread"] == loop.get("thread")]
                loops.setdefault(thread, _LoopTotals(str(loop.get("name") or thread))).add(loop, mine)
            blocks.extend(blocks_of)
        return stacks, loops, blocks

    def _is_library(self) -> Callable[[str], bool]:
        return library_predicate(self.session.paths)

    def _where(self, fid: int) -> dict[str, Any]:
        file, name, _, line = self.frames[fid]
        return {"function": name, "file": file, "line": line}

    def handlers(self, stacks: Mapping[StackKey, list[float]], limit: int = 10) -> list[dict[str, Any]]:
        """Per handler (a chain's outermost application coroutine): its wall time and what it awaited.

        "awaiting" splits the handler's wall time by where its suspended chains
        waited: the innermost application frame, and the library call below it
        it was in (``via``); time running is "running".
        """
        is_library = self._is_library()
        app = [not is_library(f[0]) and not f[0].startswith("<") for f in self.frames]
        total = sum(w for w, _ in stacks.values())
        by: dict[tuple[str, str, int], dict[str, Any]] = {}
        for (gid, frames), (wall, cpu) in stacks.items():
            if not frames:
                continue
            mine = [i for i, fid in enumerate(frames) if app[fid]]
            outer = mine[0] if mine else 0
            hf = self.frames[frames[outer]]
            h = by.setdefault(
                (hf[0], hf[1], hf[2]),
                {
                    "handler": hf[1],
                    "file": hf[0],
                    "line": hf[2],
                    "task": self.groups[gid],
                    "app": bool(mine),
                    "wall_s": 0.0,
                    "running_s": 0.0,
                    "awaiting": {},
                },
            )
            h["wall_s"] += wall
            h["running_s"] += cpu
            waiting = wall - cpu
            if waiting <= 0:
                continue
            inner = mine[-1] if mine else len(frames) - 1
            what = self.frames[frames[inner]]
            via = self.frames[frames[inner + 1]][1] if inner + 1 < len(frames) else ""
            key = (what[1], what[0], what[3], via)
            h["awaiting"][key] = h["awaiting"].get(key, 0.0) + waiting
        out = []
        for h in sorted(by.values(), key=lambda h: -h["wall_s"])[:limit]:
            wall = h["wall_s"]
            awaiting = [
                {"function": fn, "file": file, "line": line, "via": via, "pct": 100.0 * s / wall, "wall_s": s}
                for (fn, file, line, via), s in sorted(h["awaiting"].items(), key=lambda kv: -kv[1])[:5]
            ]
            out.append(
                {
                    **{k: h[k] for k in ("handler", "file", "line", "task", "app", "wall_s")},
                    "share_pct": 100.0 * wall / total if total > 0 else 0.0,
                    "running_pct": 100.0 * h["running_s"] / wall if wall > 0 else 0.0,
                    "awaiting": awaiting,
                }
            )
        return out

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        stacks, loops, blocks = self.window(start, end)
        if not stacks and not loops:
            return {}
        shown = sorted(blocks, key=lambda b: -b["duration_s"])[:20]
        out: dict[str, Any] = {
            "loops": [totals.to_json(thread) for thread, totals in loops.items()],
            "handlers": self.handlers(stacks),
            "blocks": [
                {
                    "t": b["t"],
                    "thread": loops[int(b["thread"] or 0)].name if int(b["thread"] or 0) in loops else b["thread"],
                    "task": b["task"],
                    "duration_ms": 1000.0 * b["duration_s"],
                    "stack": [self._where(fid) for fid in b["stack"]],
                }
                for b in shown
            ],
            "task_wall_s": sum(w for w, _ in stacks.values()),
            "passes": self.passes,
            "pass_us": 1e6 * self.pass_s,
            "interval_ms": 1000.0 * self.interval_s,
            "block_threshold_ms": 1000.0 * BLOCK_S,
            "dropped_s": self.dropped_s,
        }
        out["timeline"] = self.timeline(start, end)
        out["findings"] = _findings(out)
        return out

    def timeline(self, start: float | None, end: float | None, points: int = TIMELINE_POINTS) -> list[list[float]]:
        """The window over time, per report: [end time, tasks, seconds blocked, worst lag in seconds].

        Tasks: every loop's, the mean of its censuses in the report.

        Consecutive reports are merged to at most ``points`` rows (tasks: their
        mean; blocked: the sum; lag: the worst).
        """
        rows = []
        for t, (_, loops, blocks, _) in (
            r for r in self.rows if (start is None or r[0] > start) and (end is None or r[0] <= end)
        ):
            tasks = 0.0
            for loop in loops.values():
                counts = [int(n) for n in loop.get("tasks") or ()]
                tasks += sum(counts) / len(counts) if counts else 0.0
            lags = [float(x) for loop in loops.values() for x in loop.get("lag_s") or ()]
            rows.append(
                [
                    t,
                    tasks,
                    sum(b["duration_s"] for b in blocks),
                    max(lags, default=0.0),
                ]
            )
        step = max(1, math.ceil(len(rows) / points))
        merged = []
        for i in range(0, len(rows), step):
            part = rows[i : i + step]
            merged.append(
                [part[-1][0], sum(r[1] for r in part) / len(part), sum(r[2] for r in part), max(r[3] for r in part)]
            )
        return merged

    def profile(self, start: float | None = None, end: float | None = None) -> Profile:
        """The task view of the window as a :class:`~dyper.monitor.model.profile.Profile` (milliseconds as counts)."""
        # here, not at the top: the target loads this module with the collector, and needs no profiles
        from dyper.monitor.model.frames import Frame
        from dyper.monitor.model.profile import Profile

        stacks, _, _ = self.window(start, end)
        counts = {key: [round(1000.0 * wall), round(1000.0 * cpu)] for key, (wall, cpu) in stacks.items()}
        frames = [Frame(*f) for f in self.frames]
        threads = {gid: f"task {name}" for gid, name in enumerate(self.groups)}
        profile = Profile.from_counts(frames, {k: v for k, v in counts.items() if v[0] > 0}, threads, {}, {})
        return profile

    def status(self) -> Status:
        loops = [t.to_json(k) for k, t in self.loops.items()]
        if not loops:
            return Status()
        blocked = max(r["blocked_pct"] for r in loops) / 100.0
        lag = max(r["lag_ms_p99"] for r in loops) / 1000.0
        problem = min(1.0, max(10.0 * blocked, lag / (5.0 * BLOCK_S)))
        return Status(problem, confidence_of(self.passes))

    def findings(self) -> list[str]:
        if self.passes < 20:
            return []
        return _findings(self.results())

    def state(self) -> dict[str, Any]:
        return {
            "frames": [list(f) for f in self.frames],
            "groups": self.groups,
            "total": [[g, list(s), w, c] for (g, s), (w, c) in self.total.items()],
            "passes": self.passes,
            "dropped_s": self.dropped_s,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.frames = [(str(f[0]), str(f[1]), int(f[2]), int(f[3])) for f in state.get("frames") or ()]
        self._frame_ids = {f: i for i, f in enumerate(self.frames)}
        self.groups = [str(g) for g in state.get("groups") or ()]
        self._group_ids = {g: i for i, g in enumerate(self.groups)}
        self.total = {
            (int(g), tuple(int(i) for i in s)): [float(w), float(c)] for g, s, w, c in state.get("total") or ()
        }
        self.passes = int(state.get("passes") or 0)
        self.dropped_s = float(state.get("dropped_s") or 0.0)


def _quantile(values: list[float], q: float) -> float:
    """``values`` sorted; the nearest-rank quantile (0 for none)."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def _findings(r: Mapping[str, Any]) -> list[str]:
    """What the task view says in words: blocked loops, lag, and where handlers wait."""
    out = []
    for loop in r.get("loops") or ():
        if loop["blocks"]:
            worst = max(
                (b for b in r["blocks"] if b["thread"] == loop["thread"]), key=lambda b: b["duration_ms"], default=None
            )
            where = ""
            if worst is not None and worst["stack"]:
                leaf = worst["stack"][-1]
                task = f" in task {worst['task']}" if worst["task"] else ""
                where = (
                    f"; the longest, {worst['duration_ms']:.0f} ms{task}, "
                    f"in {leaf['function']} ({leaf['file']}:{leaf['line']})"
                )
            out.append(
                f"the event loop in thread {loop['thread']} was blocked {loop['blocks']} time(s) for "
                f"{loop['blocked_s']:.2f} s by callbacks of {r['block_threshold_ms']:.0f} ms or more{where}"
            )
        elif loop["lag_ms_p99"] >= r["block_threshold_ms"]:
            out.append(
                f"the event loop in thread {loop['thread']} lags: 99% of callbacks start within "
                f"{loop['lag_ms_p99']:.0f} ms"
            )
    for h in (r.get("handlers") or ())[:3]:
        if h["share_pct"] < 10 or not h["awaiting"] or not h.get("app"):
            continue
        top = h["awaiting"][0]
        if top["pct"] >= 50:
            via = f" in {top['via']}" if top["via"] and top["via"] != top["function"] else ""
            what = top["function"] if top["file"] == "<asyncio>" else f"awaiting {top['function']}"
            out.append(
                f"{h['handler']} spent {top['pct']:.0f}% of its wall time {what}{via} ({top['file']}:{top['line']})"
            )
    return out


COLLECTOR = TasksCollector
ANALYZER = TasksAnalyzer
