"""The tasks proflet's agent half, loaded alone in the target (see :mod:`dyper.proflets.tasks`)."""

from __future__ import annotations

import random
import re
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

from dyper.agent.proflet import Collector, ReportContext
from dyper.proflets.tasks.common import BLOCK_S, _accumulate

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


COLLECTOR = TasksCollector
