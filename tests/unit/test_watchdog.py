"""The watchdog gives up a collector hook that does not run or that spins, not one that runs slowly.

A hook waiting its turn for the GIL behind busy application threads runs at a
fraction of its speed: five GIL-bound threads stretched the io proflet's
report hook past the one-second limit and it was switched off as "hung" in a
run of the planted program on 3.12. Its thread's CPU clock moves, though;
a hook blocked in C (a lock, a sleep) leaves it still, and a spinning one
burns its whole limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from dyper.agent import watchdog as wd

LIMIT_S = 0.2


@pytest.fixture
def dog(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[wd.Watchdog, list[float]]]:
    monkeypatch.setattr(wd, "HANG_MIN_S", LIMIT_S)
    monkeypatch.setattr(wd, "HANG_WALL_S", 1.5)
    monkeypatch.setattr(wd, "WATCH_MIN_S", 0.1)
    given_up: list[float] = []

    def give_up(call: wd.HookCall, elapsed: float) -> None:
        given_up.append(elapsed)
        call.settled = True  # not interrupted: the hook's return ends its thread (Abandoned)

    stopping, stopped = threading.Event(), threading.Event()
    dog = wd.Watchdog(
        stopping=stopping,
        stopped=stopped,
        errors=[],
        planned_s=lambda name: 0.0,
        period_s=lambda: 0.1,
        handoff_s=lambda: 0.0,
        give_up=give_up,
    )
    dog.start()
    try:
        yield dog, given_up
    finally:
        stopped.set()
        dog.poke.set()
        assert dog.thread is not None
        dog.thread.join(5)


def _run_hook(dog: wd.Watchdog, hook: Callable[[], None]) -> str:
    """Run ``hook`` under the watchdog on a thread of its own; how it ended."""
    ended: list[str] = []

    def body() -> None:
        try:
            dog.call("planted", hook)
            ended.append("returned")
        except wd.Abandoned:
            ended.append("abandoned")

    t = threading.Thread(target=body)
    t.start()
    t.join(10)
    return ended[0] if ended else "still running"


def _busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_hook_that_runs_slowly_past_its_limit_is_left_to_finish(dog):
    watchdog, given_up = dog

    def slowly() -> None:  # 2 ms of work in every 10 ms, for 0.8 s: as behind four GIL-bound threads
        end = time.monotonic() + 0.8
        while time.monotonic() < end:
            _busy(0.002)
            time.sleep(0.008)

    assert _run_hook(watchdog, slowly) == "returned"
    assert given_up == []


def test_a_hook_blocked_in_c_is_given_up_soon_after_its_limit(dog):
    watchdog, given_up = dog
    assert _run_hook(watchdog, lambda: time.sleep(1.2)) == "abandoned"
    # At its limit and a look or two later, far before the wall limit (1.5 s) would have it.
    assert len(given_up) == 1 and LIMIT_S <= given_up[0] < 1.0, given_up


def test_a_spinning_hook_is_given_up_once_it_burned_its_limit(dog, monkeypatch):
    watchdog, given_up = dog
    monkeypatch.setattr(wd, "HANG_WALL_S", 60.0)  # only its CPU can give it away
    assert _run_hook(watchdog, lambda: _busy(1.0)) == "abandoned"
    assert len(given_up) == 1 and LIMIT_S <= given_up[0] < 1.0, given_up


def test_a_hook_that_runs_slowly_for_too_long_is_given_up_at_the_wall_limit(dog, monkeypatch):
    watchdog, given_up = dog
    monkeypatch.setattr(wd, "HANG_WALL_S", 1.0)

    def forever_slowly() -> None:  # never the 0.2 s of CPU a spin would burn before the wall limit
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            _busy(0.0005)
            time.sleep(0.0095)

    assert _run_hook(watchdog, forever_slowly) == "abandoned"
    assert len(given_up) == 1 and 1.0 <= given_up[0] < 2.5, given_up
