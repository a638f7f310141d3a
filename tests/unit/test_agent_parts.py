"""The agent's subsystems as the sampler loop composes them (agent/core.py and the modules it splits into).

Each subsystem says when it is next due and the loop wakes at the earliest;
they call back into the agent only weakly, so that an agent nobody holds is
freed at once, as a single object was, even in a process that disabled the gc.
"""

from __future__ import annotations

import gc
import math
import os
import weakref
from collections.abc import Iterator

import pytest

from dyper.agent.core import Agent
from dyper.agent.ledger import weakly


@pytest.fixture
def agent() -> Iterator[Agent]:
    a = Agent("tcp://127.0.0.1:1", 0.01, proflets=())
    yield a
    for fd in (a._wake_r, a._wake_w):
        if fd >= 0:
            os.close(fd)  # never started: its wake-up pipe is all it holds


def test_an_agent_nobody_holds_is_freed_without_the_cyclic_gc() -> None:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        a = Agent("tcp://127.0.0.1:1", 0.01, proflets=())
        for fd in (a._wake_r, a._wake_w):
            os.close(fd)
        ref = weakref.ref(a)
        del a
        assert ref() is None, "a reference cycle keeps the agent (and its tables) until the gc runs"
    finally:
        if was_enabled:
            gc.enable()


def test_a_weak_callback_answers_its_default_once_its_object_is_gone() -> None:
    class Owner:
        def twice(self, n: int) -> int:
            return 2 * n

    owner = Owner()
    call = weakly(owner.twice, -1)
    assert call(21) == 42
    del owner
    assert call(21) == -1


def test_the_loop_wakes_at_the_earliest_thing_due(agent: Agent) -> None:
    # Before the loop starts nothing is due but what the subsystems begin with.
    assert agent._next_due() == math.inf
    agent.sampling.begin(100.0)
    agent.reports.begin(100.0)
    due = agent._next_due()
    assert due == min(agent.sampling.next_due(), agent.reports.next_due())
    agent.reports.due_by(100.001)
    assert agent._next_due() == 100.001
    agent.control.boost_until = 100.0005
    assert agent._next_due() == 100.0005


def test_paused_the_loop_does_not_wake_for_bursts_or_polls(agent: Agent) -> None:
    agent.sampling.next_sample = math.inf
    agent.reports.next_report = 50.0
    agent.polls.next_poll["someone"] = 10.0
    assert agent._next_due() == 10.0
    agent.paused = True
    assert agent._next_due() == 50.0
