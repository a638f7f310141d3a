"""dyper.agent._fastsample (the C stack walker) against the Python reference walker.

The reference is the agent's own ``Agent._sample_python``; the C walker must
produce the same counts, through the same ``new_loc`` calls, for threads in
every shape a service has: deep recursion, sleeping, blocked on a lock, inside
generators and coroutines, inside C code that calls back into Python, under a
trace function, in huge functions. Then: no leaks, exceptions from ``new_loc``
propagate the same way, and nothing crashes while threads come and go.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import importlib
import os
import sys
import threading
import time
import tracemalloc
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dyper.agent.core import Agent
from dyper.agent.tables import Tables

try:  # the C extension, when it was built
    _fastsample: Any = importlib.import_module("dyper.agent._fastsample")
except ImportError as exc:  # pragma: no cover - depends on the build
    _fastsample = None
    _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
else:
    _IMPORT_ERROR = ""

pytestmark = [
    pytest.mark.skipif(
        _fastsample is None,
        reason=(
            "dyper.agent._fastsample was not built for this interpreter "
            f"({sys.implementation.name} {sys.version.split()[0]}: "
            f"{_IMPORT_ERROR or 'not built'}); "
            "build it with `pip install -e .` on CPython 3.11-3.13"
        ),
    ),
    pytest.mark.timeout(120),
]

Counts = dict[tuple[int, tuple[Any, ...]], int]


# --- running both walkers ---------------------------------------------------------


def python_sample(counts: Counts, locs: dict[int, Any], new_loc: Callable[..., Any], me: int) -> None:
    """The reference: the agent's own pure-Python walker, on a stand-in agent."""
    stand_in = types.SimpleNamespace(
        tables=types.SimpleNamespace(locs=locs, new_loc=new_loc, waiting=bytearray()),
        counts=counts,
        _ident=me,
        _activity=None,
    )
    Agent._sample_python(stand_in)  # type: ignore[arg-type]


def c_sample(counts: Counts, locs: dict[int, Any], new_loc: Callable[..., Any], me: int) -> None:
    assert _fastsample is not None
    _fastsample.sample(counts, locs, new_loc, me)


Walker = Callable[[Counts, dict[int, Any], Callable[..., Any], int], None]
Frame = tuple[int, str, str, int, int, int]  # key, file, qualname, first line, line, flags


class Run:
    """One walker's run into fresh tables, with the new_loc calls it made."""

    def __init__(self, walker: Walker, fail_at: int | None = None) -> None:
        self.tables = Tables()
        self.counts: Counts = {}
        self.calls: list[tuple[int, int, int, int | None]] = []
        self.error: BaseException | None = None
        self.fail_at = fail_at

        def new_loc(key: int, code: types.CodeType, lasti: int, lineno: int | None) -> int:
            self.calls.append((key, id(code), lasti, lineno))
            if self.fail_at is not None and len(self.calls) == self.fail_at:
                raise LookupError(f"new_loc refused call {len(self.calls)}")
            return self.tables.new_loc(key, code, lasti, lineno)

        try:
            walker(self.counts, self.tables.locs, new_loc, threading.get_ident())
        except LookupError as exc:
            self.error = exc

    def stacks(self, tids: set[int] | None = None) -> dict[tuple[int, tuple[Frame, ...]], int]:
        """Counts with location ids replaced by what they mean (and their key)."""
        strings = {int(row[0]): str(row[1]) for row in self.tables.string_rows}
        key_of = {loc: key for key, loc in self.tables.locs.items()}
        meaning: dict[int, Frame] = {}
        for loc, file_sid, name_sid, first, line, flags in self.tables.loc_rows:
            meaning[loc] = (key_of[loc], strings[file_sid], strings[name_sid], first, line, flags)
        return {
            (tid, tuple(meaning[loc] for loc in stack)): n
            for (tid, stack), n in self.counts.items()
            if tids is None or tid in tids
        }

    def calls_for(self, tids: set[int]) -> list[tuple[int, int, int, int | None]]:
        """new_loc calls for the frames of the given threads, in call order."""
        wanted = {key for (tid, stack) in self.stacks(tids) for key, *_ in stack}
        return [call for call in self.calls if call[0] in wanted]


def compare(tids: set[int], attempts: int = 50) -> tuple[Run, Run]:
    """Run Python, C, Python; retry until the threads held still in between."""
    for _ in range(attempts):
        before = Run(python_sample)
        c_run = Run(c_sample)
        after = Run(python_sample)
        if before.stacks(tids) == after.stacks(tids) and len(before.stacks(tids)) == len(tids):
            assert c_run.stacks(tids) == before.stacks(tids)
            assert c_run.calls_for(tids) == before.calls_for(tids)
            return before, c_run
        time.sleep(0.02)
    raise AssertionError("the test threads never held still")


# --- threads parked in known places ---------------------------------------------


class Parked:
    """Threads that each run a target which ends in ``park()``, waiting there.

    ``park()`` announces itself and then blocks on the release event (or on a
    lock, or in time.sleep); ``wait_parked`` returns once every thread has
    announced and has been seen blocked (its innermost frame stopped moving).
    """

    def __init__(self) -> None:
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []
        self._arrived = threading.Semaphore(0)
        self.lock = threading.Lock()
        self.lock.acquire()

    def park(self) -> None:
        self._arrived.release()
        self.release.wait(60)

    def park_on_lock(self) -> None:
        self._arrived.release()
        if self.lock.acquire(timeout=60):
            self.lock.release()

    def park_in_sleep(self) -> None:
        self._arrived.release()
        time.sleep(2.0)  # ends on its own; the comparison is done well before

    def start(self, target: Callable[[], object], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        self.threads.append(t)
        t.start()

    @property
    def tids(self) -> set[int]:
        return {t.ident for t in self.threads if t.ident is not None}

    def wait_parked(self) -> None:
        for _ in self.threads:
            assert self._arrived.acquire(timeout=30), "a test thread never arrived"
        # Past the announcement a thread still runs a few bytecodes before it
        # blocks: wait until no innermost frame moves any more.
        last: dict[int, tuple[int, int]] = {}
        for _ in range(200):
            frames = sys._current_frames()
            now = {tid: (id(frames[tid].f_code), frames[tid].f_lasti) for tid in self.tids}
            if now == last:
                return
            last = now
            time.sleep(0.01)
        raise AssertionError("test threads did not settle")

    def finish(self) -> None:
        if self.release.is_set():
            return
        self.release.set()
        self.lock.release()
        for t in self.threads:
            t.join(10)


@pytest.fixture
def parked() -> Iterator[Parked]:
    p = Parked()
    try:
        yield p
    finally:
        p.finish()


def recurse(n: int, then: Callable[[], object]) -> object:
    if n <= 0:
        return then()
    return recurse(n - 1, then)


class Shape:
    """Stack shapes; each ends in the given ``park`` callable."""

    def __init__(self, park: Callable[[], object]) -> None:
        self.park = park

    def generator(self) -> None:
        def inner(n: int) -> Iterator[int]:
            if n:
                yield from inner(n - 1)
            else:
                self.park()
                yield 1

        def outer() -> Iterator[int]:
            yield from inner(5)

        for _ in outer():
            pass

    def coroutine_sent(self) -> None:
        async def leaf() -> None:
            self.park()

        async def middle(n: int) -> None:
            if n:
                await middle(n - 1)
            else:
                await leaf()

        coro = middle(4)
        with contextlib.suppress(StopIteration):
            coro.send(None)

    def asyncio_task(self) -> None:
        async def leaf() -> None:
            await asyncio.sleep(0)
            self.park()  # blocks the loop on purpose

        async def main() -> None:
            await asyncio.gather(leaf())

        asyncio.run(main())

    def sorted_key(self) -> None:
        def key(x: int) -> int:
            if x == 2:
                recurse(3, self.park)
            return x

        sorted([3, 2, 1], key=key)

    def c_callbacks(self) -> None:
        # reduce -> lambda -> __init__ -> property, all called from C. The
        # constructor call is warmed up first: once specialized, CPython 3.13
        # runs __init__ under an (incomplete) shim frame.
        class Thing:
            def __init__(self, park: Callable[[], object] | None) -> None:
                self._park = park
                _ = self.value

            @property
            def value(self) -> object:
                return self._park() if self._park is not None else None

        parks = [None] * 40 + [self.park]
        functools.reduce(lambda acc, park: Thing(park), parks, None)

    def finalizer_in_frame_setup(self) -> None:
        # A collection that runs while a frame is being set up (on 3.11 the
        # cell for `x` is allocated before the frame's first RESUME, and the
        # allocation can collect) runs a finalizer above an incomplete frame,
        # which f_back skips.
        park = self.park

        class Finalized:
            def __del__(self) -> None:
                park()

        def with_cell() -> Callable[[], int]:
            x = 1

            def inner() -> int:
                return x

            return inner

        was_enabled = gc.isenabled()
        threshold = gc.get_threshold()
        gc.disable()
        try:
            garbage = Finalized()
            garbage.cycle = garbage  # type: ignore[attr-defined]
            del garbage
            gc.set_threshold(1)
            gc.enable()
            with_cell()
        finally:
            gc.set_threshold(*threshold)
            if not was_enabled:
                gc.disable()

    def traced(self) -> None:
        # Park inside a trace function's 'line' event, right after making the
        # traced frame jump over a line: while the trace function runs, the
        # frame object carries the line it jumped to in f_lineno, which
        # f.f_lineno reports rather than the line of the instruction offset.
        target = traced_body.__code__
        first = target.co_firstlineno

        def tracer(frame: types.FrameType, event: str, arg: object) -> Any:
            if frame.f_code is target and event == "line" and frame.f_lineno == first + 2:
                frame.f_lineno = first + 3  # type: ignore[misc]  # skip `step = 2`
                sys.settrace(None)
                self.park()
                return None
            return tracer

        sys.settrace(tracer)
        try:
            assert traced_body() == 1  # the jump happened
        finally:
            sys.settrace(None)


def traced_body() -> int:
    step = 1
    step = 2
    return step


def test_module_basics() -> None:
    assert _fastsample is not None
    assert _fastsample.MAX_DEPTH == 2048
    assert _fastsample.BUILT_FOR.startswith("{}.{}.".format(*sys.version_info[:2]))
    assert 0x030B0000 <= sys.hexversion < 0x030E0000


def test_deep_recursion_matches(parked: Parked) -> None:
    for i in range(3):
        parked.start(lambda: recurse(30, parked.park), f"deep-{i}")
    parked.wait_parked()
    _, c = compare(parked.tids)
    for (_tid, stack), n in c.stacks(parked.tids).items():
        assert n == 1
        assert sum(1 for f in stack if f[2].endswith("recurse")) == 31


def test_blocked_threads_match(parked: Parked) -> None:
    parked.start(lambda: recurse(10, parked.park_in_sleep), "sleeper")
    parked.start(lambda: recurse(7, parked.park_on_lock), "lock-waiter")
    parked.start(lambda: recurse(12, parked.park), "event-waiter")
    parked.wait_parked()
    compare(parked.tids)


def test_activity_histogram_matches_the_reference(parked: Parked) -> None:
    """Both walkers count the threads that are not waiting, per sample, the same way."""
    parked.start(lambda: recurse(3, parked.park_in_sleep), "sleeper")
    parked.start(lambda: recurse(4, parked.park_on_lock), "lock-waiter")
    parked.start(lambda: recurse(5, parked.park), "event-waiter")
    parked.wait_parked()
    spinning = threading.Event()
    stop = threading.Event()

    def spin() -> None:
        spinning.set()
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin, name="spinner")
    spinner.start()
    spinning.wait()
    try:
        tables = Tables()
        me = threading.get_ident()
        counts: Counts = {}
        # First sample: no leaf is decided yet, so the sample waits in pending
        # (its threads' leaves) rather than guessing.
        first = [0] * 8
        pending: list[tuple[int, ...]] = []
        _fastsample.sample(counts, tables.locs, tables.new_loc, me, tables.waiting, first, pending)
        assert sum(first) == 0 and len(pending) == 1
        assert sorted(pending[0]) == sorted(stack[0] for _, stack in counts if stack)
        tables.flag_leaves(pending[0])

        def resolve(waiting: list[tuple[int, ...]], hist: list[int]) -> None:
            # The spinner's leaf moves between the loop's instructions, each its
            # own location, so a walker can still meet a new one: decided and
            # counted by the agent's own code.
            Agent._count_pending(types.SimpleNamespace(tables=tables, _activity=hist, _pending=waiting))  # type: ignore[arg-type]
            waiting.clear()

        c_hist, c_pending = [0] * 8, []
        for _ in range(5):
            _fastsample.sample({}, tables.locs, tables.new_loc, me, tables.waiting, c_hist, c_pending)
        resolve(c_pending, c_hist)
        py_hist = [0] * 8
        stand_in = types.SimpleNamespace(tables=tables, counts={}, _ident=me, _activity=py_hist, _pending=[])
        for _ in range(5):
            Agent._sample_python(stand_in)  # type: ignore[arg-type]
        resolve(stand_in._pending, py_hist)
        # The spinner runs; the sleeper, the lock waiter and the event waiter wait.
        # (Other threads of the test process, if any, count the same in both.)
        assert c_hist == py_hist
        assert sum(c_hist) == 5
        active = [k for k, n in enumerate(c_hist) if n]
        assert active == [active[0]] and active[0] >= 1
        # the three waiting threads are not counted: fewer active than threads with frames
        assert active[0] <= len(pending[0]) - 3
    finally:
        stop.set()
        spinner.join()


@pytest.mark.parametrize(
    "shape",
    [
        "generator",
        "coroutine_sent",
        "asyncio_task",
        "sorted_key",
        "c_callbacks",
        "traced",
        "finalizer_in_frame_setup",
    ],
)
def test_shapes_match(parked: Parked, shape: str) -> None:
    parked.start(getattr(Shape(parked.park), shape), shape)
    parked.wait_parked()
    _, c = compare(parked.tids)
    names = [f[2] for stack in [s for (_t, s) in c.stacks(parked.tids)] for f in stack]
    expected = {
        "generator": "Shape.generator.<locals>.inner",
        "coroutine_sent": "Shape.coroutine_sent.<locals>.leaf",
        "asyncio_task": "Shape.asyncio_task.<locals>.leaf",
        "sorted_key": "Shape.sorted_key.<locals>.key",
        "c_callbacks": "Shape.c_callbacks.<locals>.Thing.value",
        "traced": "Shape.traced.<locals>.tracer",
        "finalizer_in_frame_setup": "Shape.finalizer_in_frame_setup.<locals>.Finalized.__del__",
    }[shape]
    assert expected in names


def test_traced_frame_reports_the_trace_line(parked: Parked) -> None:
    parked.start(Shape(parked.park).traced, "traced")
    parked.wait_parked()
    _, c = compare(parked.tids)
    ((_tid, stack),) = c.stacks(parked.tids)
    (body,) = [f for f in stack if f[2] == "traced_body"]
    assert body[4] == traced_body.__code__.co_firstlineno + 3  # the line jumped to


@pytest.mark.skipif(
    sys.maxsize < 2**32 or hasattr(sys, "gettotalrefcount"),
    reason="writes PyFrameObject.f_lineno at its 64-bit release-build offset",
)
@pytest.mark.parametrize("value", [4242, -7, -1])
def test_line_left_in_the_frame_object_wins(parked: Parked, value: int) -> None:
    # A trace function can leave a line in the frame object (f_lineno, the C
    # field) that differs from the line of the instruction offset; f.f_lineno
    # then reports the field (3.13: if positive). Write the field directly.
    import ctypes

    parked.start(lambda: recurse(3, parked.park), "field")
    parked.wait_parked()
    (tid,) = parked.tids
    frame: types.FrameType | None = sys._current_frames()[tid]
    while frame is not None and frame.f_code is not recurse.__code__:
        frame = frame.f_back
    assert frame is not None
    field = ctypes.c_int.from_address(id(frame) + 40)
    assert field.value == 0 and frame.f_lineno > 0  # live frame: the line comes from f_lasti
    field.value = value
    try:
        _, c = compare(parked.tids)
    finally:
        field.value = 0
    ((_, stack),) = c.stacks(parked.tids)
    innermost = next(f for f in stack if f[2] == "recurse")
    if value > 0:
        assert innermost[4] == value
    else:
        assert innermost[4] != value


def test_many_shapes_at_once(parked: Parked) -> None:
    shape = Shape(parked.park)
    names = ["generator", "coroutine_sent", "asyncio_task", "sorted_key", "c_callbacks", "traced"]
    for name in names:
        parked.start(getattr(shape, name), name)
    for i in range(3):
        parked.start(lambda: recurse(30, parked.park), f"deep-{i}")
    parked.wait_parked()
    compare(parked.tids)


def test_huge_function_offsets_past_64k(parked: Parked) -> None:
    # f_lasti above 0xFFFF no longer fits below the id in 64 bits: the key is
    # then built with Python's arbitrary-precision arithmetic, as the reference does.
    body = "".join(f"    x{i % 50} = {i}\n" for i in range(40_000))
    source = f"def huge(park):\n{body}    park()\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, "<huge>", "exec"), namespace)
    parked.start(lambda: namespace["huge"](parked.park), "huge")
    parked.wait_parked()
    py, _ = compare(parked.tids)
    ((_tid, stack),) = py.stacks(parked.tids)
    (huge,) = [f for f in stack if f[2] == "huge"]
    assert huge[0] >> 48 > 0xFFFF
    assert huge[0] > 2**64


def test_depth_limit_keeps_the_leaf_most_frames(parked: Parked) -> None:
    limit = _fastsample.MAX_DEPTH
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 500)
    try:
        parked.start(lambda: recurse(limit + 100, parked.park), "very-deep")
        parked.wait_parked()
        py = Run(python_sample)
        c = Run(c_sample)
        parked.finish()
    finally:
        sys.setrecursionlimit(old)
    ((_, py_stack),) = py.stacks(parked.tids)
    ((_, c_stack),) = c.stacks(parked.tids)
    assert len(py_stack) > limit
    assert len(c_stack) == limit
    assert c_stack == py_stack[:limit]


def test_calling_thread_shows_its_caller_on_top() -> None:
    me = threading.get_ident()
    tables = Tables()
    counts: Counts = {}
    line = sys._getframe().f_lineno + 1
    _fastsample.sample(counts, tables.locs, tables.new_loc, None)
    mine = [stack for (tid, stack) in counts if tid == me]
    assert len(mine) == 1
    top = tables.loc_rows[mine[0][0]]
    strings = {sid: text for sid, text in tables.string_rows}
    assert strings[top[2]] == "test_calling_thread_shows_its_caller_on_top"
    assert top[4] == line


def test_skip_ident_values() -> None:
    me = threading.get_ident()
    for skip in (-1, 2**70, 0):
        counts: Counts = {}
        t = Tables()
        _fastsample.sample(counts, t.locs, t.new_loc, skip)
        assert me in {tid for tid, _ in counts}
    counts = {}
    t = Tables()
    _fastsample.sample(counts, t.locs, t.new_loc, me)
    assert me not in {tid for tid, _ in counts}


def test_bad_arguments_raise_type_error() -> None:
    sample = _fastsample.sample
    t = Tables()
    with pytest.raises(TypeError):
        sample({}, t.locs, t.new_loc)
    with pytest.raises(TypeError):
        sample([], t.locs, t.new_loc, 0)
    with pytest.raises(TypeError):
        sample({}, list(t.locs), t.new_loc, 0)
    with pytest.raises(TypeError):
        sample({}, t.locs, t.new_loc, "me")
    with pytest.raises(TypeError):
        sample({}, {}, None, None)  # not callable: raised on the first miss, like the reference


def test_none_in_locs_and_odd_locations(parked: Parked) -> None:
    # A None value is a miss (`if loc is None`); new_loc's result is used as is.
    parked.start(lambda: recurse(5, parked.park), "odd")
    parked.wait_parked()

    def run(walker: Walker) -> Counts:
        counts: Counts = {}
        locs: dict[int, Any] = {}
        calls = [0]

        def new_loc(key: int, code: types.CodeType, lasti: int, lineno: int | None) -> object:
            calls[0] += 1
            locs[key] = None if calls[0] % 2 else (code.co_name, lineno)
            return ("loc", code.co_qualname, lasti, lineno)

        walker(counts, locs, new_loc, threading.get_ident())
        walker(counts, locs, new_loc, threading.get_ident())
        return {k: v for k, v in counts.items() if k[0] in parked.tids}

    assert run(c_sample) == run(python_sample)


@pytest.mark.parametrize("fail_at", [1, 2, 7, 40])
def test_new_loc_exception_propagates_like_the_reference(parked: Parked, fail_at: int) -> None:
    for i in range(3):
        parked.start(lambda: recurse(6, parked.park), f"t{i}")
    parked.wait_parked()
    for _ in range(20):
        py = Run(python_sample, fail_at)
        c = Run(c_sample, fail_at)
        if py.stacks() == Run(python_sample, fail_at).stacks():
            break
    assert type(c.error) is type(py.error)
    assert str(c.error) == str(py.error)
    if fail_at <= 7:
        assert c.error is not None
    assert c.stacks(parked.tids) == py.stacks(parked.tids)
    # The tables stay usable: the next sample completes and counts every thread.
    _fastsample.sample(c.counts, c.tables.locs, c.tables.new_loc, threading.get_ident())
    assert parked.tids <= {tid for tid, _ in c.counts}


def test_counts_with_odd_values() -> None:
    # `counts.get(k, 0) + 1` whatever the value is: floats add, None raises.
    tables = Tables()
    counts: Counts = {}

    def once() -> None:  # the calling thread is sampled too, always from here
        _fastsample.sample(counts, tables.locs, tables.new_loc, None)

    outcomes = []
    for step in range(3):
        if step == 1:
            for k in counts:
                counts[k] = 2.5  # type: ignore[assignment]
        if step == 2:
            assert 3.5 in counts.values()
            for k in counts:
                counts[k] = None  # type: ignore[assignment]
        try:
            once()  # one call site, so the caller's stack is the same every time
        except TypeError:
            outcomes.append("TypeError")
        else:
            outcomes.append("ok")
    assert outcomes == ["ok", "ok", "TypeError"]


# --- the C walker's caches must be invisible ---------------------------------------------
#
# The C walker remembers locations between samples (valid while `locs` is the
# same, unmodified dict) and reuses last sample's key tuple for a thread whose
# stack did not change. Script the same mutations for both walkers and demand
# identical dicts after every step; new_loc hands out the same ids in the same
# order for both, so counts and locs can be compared as they are.


class _Scripted:
    """One walker, its tables and the locs dict it is handed (which a step may swap)."""

    def __init__(self, walker: Walker, tids: set[int]) -> None:
        self.walker = walker
        self.tids = tids
        self.tables = Tables()
        self.counts: Counts = {}
        self.locs: dict[int, Any] = self.tables.locs
        self.calls = 0

    def new_loc(self, key: int, code: types.CodeType, lasti: int, lineno: int | None) -> int:
        self.calls += 1
        return self.tables.new_loc(key, code, lasti, lineno)

    def step(self) -> tuple[Counts, dict[int, Any], int]:
        self.walker(self.counts, self.locs, self.new_loc, threading.get_ident())
        mine = {k: v for k, v in self.counts.items() if k[0] in self.tids}
        return mine, dict(self.locs), self.calls

    def some_key(self, i: int) -> int:
        keys = sorted(self.locs)
        return keys[i % len(keys)]


def _script(walker: Walker, tids: set[int]) -> list[tuple[Counts, dict[int, Any], int]]:
    run = _Scripted(walker, tids)
    out = [run.step(), run.step(), run.step()]
    run.locs[run.some_key(0)] = 10_000  # replace a value
    out.append(run.step())
    out.append(run.step())
    del run.locs[run.some_key(1)]  # forget one: new_loc again
    out.append(run.step())
    run.locs[run.some_key(2)] = None  # None is a miss too
    out.append(run.step())
    run.counts.clear()  # a report went out
    out.append(run.step())
    out.append(run.step())
    run.locs = dict(run.locs)  # an equal dict, another object
    run.tables.locs = run.locs
    out.append(run.step())
    run.locs[run.some_key(3)] = 20_000
    out.append(run.step())
    run.locs.clear()  # everything again
    out.append(run.step())
    out.append(run.step())
    run.tables.restart()  # what the agent does past MAX_LOCATIONS
    run.locs = run.tables.locs
    out.append(run.step())
    out.append(run.step())
    return out


def test_location_cache_and_key_reuse_are_invisible(parked: Parked) -> None:
    for i in range(3):
        parked.start(lambda: recurse(12, parked.park), f"deep-{i}")
    parked.start(Shape(parked.park).generator, "generator")
    parked.wait_parked()
    # Other threads (pytest-xdist's, a test's that is still winding down) are walked
    # too: their locations go into the same tables, so the two scripts agree only
    # while those threads stand still. Compared again when one moved.
    others = set(sys._current_frames()) - parked.tids - {threading.get_ident()}
    for _ in range(5):
        before = _where(others)
        c_script, python_script = _script(c_sample, parked.tids), _script(python_sample, parked.tids)
        if _where(others) == before:
            break
    else:
        pytest.fail(f"{len(others)} other threads never stood still for the comparison")
    assert c_script == python_script


def _where(tids: set[int]) -> dict[int, list[tuple[types.CodeType, int]]]:
    """Where each thread in ``tids`` is: its frames' code and last instruction, leaf first."""
    where: dict[int, list[tuple[types.CodeType, int]]] = {}
    for tid, frame in sys._current_frames().items():
        if tid in tids:
            chain = where[tid] = []
            f: types.FrameType | None = frame
            while f is not None:
                chain.append((f.f_code, f.f_lasti))
                f = f.f_back
    return where


def test_locs_mutated_by_new_loc_mid_sample(parked: Parked) -> None:
    # new_loc itself rewrites earlier entries: later frames in the same sample
    # must see that, exactly as the reference's locs.get does.
    for i in range(2):
        parked.start(lambda: recurse(9, parked.park), f"deep-{i}")
    parked.wait_parked()

    def run(walker: Walker) -> list[Counts]:
        tables = Tables()
        counts: Counts = {}
        n = [0]

        def new_loc(key: int, code: types.CodeType, lasti: int, lineno: int | None) -> int:
            n[0] += 1
            loc = tables.new_loc(key, code, lasti, lineno)
            for k in list(tables.locs)[:-1]:
                tables.locs[k] += 1000 * n[0]  # moves every earlier entry
            return loc

        out = []
        for _ in range(4):
            walker(counts, tables.locs, new_loc, threading.get_ident())
            out.append({k: v for k, v in counts.items() if k[0] in parked.tids})
        return out

    assert run(c_sample) == run(python_sample)


def test_reentrant_sampling_from_new_loc(parked: Parked) -> None:
    # new_loc runs Python code: it may sample again (another table), and other
    # threads may sample concurrently. Neither may disturb the outer call.
    parked.start(lambda: recurse(6, parked.park), "deep")
    parked.wait_parked()
    inner_tables = Tables()
    inner_counts: Counts = {}

    def run(walker: Walker) -> Counts:
        tables = Tables()
        counts: Counts = {}

        def new_loc(key: int, code: types.CodeType, lasti: int, lineno: int | None) -> int:
            _fastsample.sample(inner_counts, inner_tables.locs, inner_tables.new_loc, None)
            helper = threading.Thread(target=lambda: _fastsample.sample({}, {}, Tables().new_loc, None))
            helper.start()
            helper.join()
            return tables.new_loc(key, code, lasti, lineno)

        for _ in range(3):
            walker(counts, tables.locs, new_loc, threading.get_ident())
        return {k: v for k, v in counts.items() if k[0] in parked.tids}

    assert run(c_sample) == run(python_sample)
    assert inner_counts


# --- resources ------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_no_leaks_over_10000_samples(parked: Parked) -> None:
    for i in range(4):
        parked.start(lambda: recurse(30, parked.park), f"deep-{i}")
    shape = Shape(parked.park)
    for name in ["generator", "coroutine_sent", "sorted_key", "c_callbacks"]:
        parked.start(getattr(shape, name), name)
    parked.wait_parked()

    tables = Tables()
    counts: Counts = {}
    me = threading.get_ident()
    sample = _fastsample.sample
    codes = [recurse.__code__, Parked.park.__code__, threading.Event.wait.__code__]

    for _ in range(200):  # warm-up: every location interned
        sample(counts, tables.locs, tables.new_loc, me)
    gc.collect()
    refs = [sys.getrefcount(c) for c in codes]
    n_objects = len(gc.get_objects())
    n_locs = len(tables.loc_rows)
    keys = set(counts)
    rss = _rss_bytes()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for _ in range(10_000):
            sample(counts, tables.locs, tables.new_loc, me)
        gc.collect()
        grown, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert [sys.getrefcount(c) for c in codes] == refs
    assert len(tables.loc_rows) == n_locs
    assert set(counts) == keys
    assert all(n == 10_200 for (tid, _), n in counts.items() if tid in parked.tids)
    assert abs(len(gc.get_objects()) - n_objects) < 50
    assert grown - base < 64 * 1024
    assert _rss_bytes() - rss < 8 * 1024 * 1024


# --- robustness ---------------------------------------------------------------------


def deep_key(x: int) -> int:
    recurse(x % 7, int)
    return x


def test_threads_coming_and_going_while_sampling() -> None:
    """No crash while threads start, die and switch inside new_loc.

    new_loc releases the GIL (time.sleep(0)) on every call, so threads run and
    exit between the C walker's snapshot and its use: the snapshot must not
    refer to anything they own.
    """
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():

            def gen(n: int) -> Iterator[int]:
                if n:
                    yield from gen(n - 1)
                yield n

            workers = [
                threading.Thread(target=lambda: list(gen(20))),
                threading.Thread(target=lambda: sorted(range(50), key=deep_key)),
                threading.Thread(target=lambda: asyncio.run(asyncio.sleep(0))),
            ]
            for w in workers:
                w.start()
            for w in workers:
                w.join()

    churners = [threading.Thread(target=churn, daemon=True) for _ in range(3)]
    for t in churners:
        t.start()

    tables = Tables()
    counts: Counts = {}

    def new_loc(key: int, code: types.CodeType, lasti: int, lineno: int | None) -> int:
        time.sleep(0)
        gc.collect(0)
        return tables.new_loc(key, code, lasti, lineno)

    deadline = time.monotonic() + 2.0
    n = 0
    try:
        while time.monotonic() < deadline:
            if n % 50 == 0:
                tables = Tables()  # keep the slow path busy
            _fastsample.sample(counts, tables.locs, new_loc, threading.get_ident())
            n += 1
    finally:
        stop.set()
        for t in churners:
            t.join(10)
    assert n > 50
    assert counts


def test_sampling_from_another_thread_matches_its_own_view(parked: Parked) -> None:
    # The agent samples from its own thread; skip that one and see the rest,
    # including the main thread blocked in join().
    for i in range(2):
        parked.start(lambda: recurse(8, parked.park), f"deep-{i}")
    parked.wait_parked()
    results: list[tuple[Run, Run]] = []
    tids = parked.tids | {threading.get_ident()}
    sampler = threading.Thread(target=lambda: results.append(compare(tids)))
    sampler.start()
    sampler.join(60)
    assert results
