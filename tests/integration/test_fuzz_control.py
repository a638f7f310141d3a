"""Fuzzing the agent's control path: what a broken or hostile monitor can make it do.

A real Agent (its thread not started, time injected) with a real proflet
whose bursts do nothing, and a real ZeroMQ ROUTER on an inproc endpoint in
the monitor's place: ``Agent._receive`` reads frames from its own DEALER as
the sampler's loop does. Properties, whatever the monitor sends: nothing
escapes the handler; each frame the protocol refuses is counted in
``dropped["bad_messages"]``; the budget stays in its range and under the
ceiling; the monitor's timings never make the agent sample, report or detail
faster than its own plan, nor stop it; a burst starts only when the guard
can pay for it; resyncs are served at most once a second; nothing received
is executed.
"""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dyper.agent import protocol
from dyper.agent.budget import MAX_DETAIL_DELAY_S, MAX_REPORT_DELAY_S, MAX_SAMPLE_DELAY_S
from dyper.agent.core import RESYNC_MIN_S, Agent
from dyper.agent.proflet import Collector

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BUDGET = 0.02
CEILING = 0.05


class QuietProflet(Collector):
    """A real proflet whose bursts cost nothing: the scheduling around it is what is tested."""

    name = "quiet"
    DETAILS = True
    OVHD_MS = 2.0
    SLOW = 0.5
    ITVL_MS = 100.0
    PRTY = 0.5

    def __init__(self) -> None:
        self.bursts = 0

    def start_detail(self, ctx: Any) -> None:
        self.bursts += 1


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Rig:
    """An agent, its DEALER, and a ROUTER standing in for the monitor (inproc: no network)."""

    def __init__(self, ctx: zmq.Context[Any], n: int) -> None:
        self.clock = FakeClock()
        self.proflet = QuietProflet()
        self.agent = Agent(f"inproc://fuzz-{n}", BUDGET, ceiling=CEILING, clock=self.clock, proflets=(self.proflet,))
        self.agent._start_collectors()
        self.monitor = ctx.socket(zmq.ROUTER)
        self.monitor.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.monitor.bind(self.agent.endpoint)
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTING_ID, self.agent.agent_id.encode())
        self.sock.connect(self.agent.endpoint)
        self.ident = self.agent.agent_id.encode()
        self.agent._hello_sent = self.agent._send_hello(self.sock)
        assert self.agent._hello_sent
        self.heard: list[tuple[str, dict[str, Any]]] = []
        self.drain_monitor()

    def send(self, frames: list[bytes]) -> None:
        """The monitor sends; the agent's loop would wake and call _receive until nothing is left."""
        for f in frames:
            self.monitor.send_multipart([self.ident, f])
        while self.sock.poll(100, zmq.POLLIN):
            self.agent._receive(self.sock)

    def drain_monitor(self) -> None:
        while self.monitor.poll(0, zmq.POLLIN):
            _, data = self.monitor.recv_multipart()
            self.heard.append(protocol.decode(data, protocol.MONITOR_ACCEPTS))

    def apply_pending_budget(self) -> None:
        """What the loop does with a budget at its next wake-up."""
        pending = self.agent._pending_budget
        if pending is not None:
            assert protocol.MIN_BUDGET <= pending <= protocol.MAX_BUDGET
            self.agent._pending_budget = None
            self.agent._apply_budget(pending)

    def check_invariants(self) -> None:
        a = self.agent
        self.apply_pending_budget()
        assert 0 < a.budget <= CEILING and a.guard.budget == a.budget
        # Never faster than our own plan, never stopped altogether.
        assert a.plan.sample_delay_s <= a.sample_delay_s <= MAX_SAMPLE_DELAY_S
        assert a.plan.report_delay_s <= a.report_delay_s <= MAX_REPORT_DELAY_S
        for name, delay in a.scheduler.delays.items():
            assert a.plan.detail_delay_s[name] <= delay <= MAX_DETAIL_DELAY_S
        assert not a._stopping.is_set()

    def run_detailing(self, seconds: float, step: float = 0.05) -> None:
        """The loop's detailing steps with time passing; a burst may start only when paid for."""
        a = self.agent
        end = self.clock.t + seconds
        while self.clock.t < end:
            now = self.clock()
            prices = {name: a._burst_price_s(name) for name in a.proflet_costs}
            tokens = a.guard.tokens(now)
            running = set(a._bursts)
            a._detail_step(now)
            for name in set(a._bursts) - running:
                assert tokens >= prices[name] - 1e-9, f"{name} started with {tokens} s in the guard for {prices[name]}"
            self.clock.t += step

    def close(self) -> None:
        self.sock.close(0)
        self.monitor.close(0)
        for fd in (self.agent._wake_r, self.agent._wake_w):
            os.close(fd)


@pytest.fixture(scope="module")
def ctx() -> Iterator[zmq.Context[Any]]:
    c: zmq.Context[Any] = zmq.Context()
    try:
        yield c
    finally:
        c.term()


_rigs = iter(range(10**9))


def make_rig(ctx: zmq.Context[Any]) -> Rig:
    return Rig(ctx, next(_rigs))


def refused(frame: bytes) -> bool:
    try:
        protocol.decode(frame, protocol.AGENT_ACCEPTS, protocol.MAX_CONTROL_BYTES)
    except protocol.DecodeError:
        return True
    return False


def envelope(version: Any, msg_type: Any, body: Any) -> bytes:
    return msgpack.packb(["dyper", version, msg_type, body], use_bin_type=True)


# --- what a monitor might send -------------------------------------------------------------------

delays = st.one_of(
    st.floats(min_value=0.0, max_value=1e9),
    st.sampled_from([0.0, 1e-12, 1e300, 5e-324]),
    st.integers(0, 2**63 - 1),
)
plans = st.fixed_dictionaries(
    {},
    optional={
        "sample_delay_s": delays,
        "report_delay_s": delays,
        "detail_delay_s": st.dictionaries(st.sampled_from(["quiet", "cpu", "nope"]), delays, max_size=3),
        "fract": st.floats(-1.0, 2.0),
    },
)
budgets = st.floats(min_value=protocol.MIN_BUDGET, max_value=protocol.MAX_BUDGET)
valid_messages = st.one_of(
    st.fixed_dictionaries({}, optional={"budget": budgets, "ceiling": budgets, "plan": plans}).map(
        lambda b: protocol.encode(protocol.CONFIGURE, b)
    ),
    st.sampled_from(["quiet", "cpu", "", "../../etc/passwd"]).map(
        lambda p: protocol.encode(protocol.DETAIL, {"proflet": p})
    ),
)
#: Values no field of an agent-bound message takes.
never_valid = st.sampled_from(
    [math.nan, math.inf, -math.inf, -1.0, -(2**63), 2**64 - 1, b"bytes", "1%", [], {"x": 1}, True, None]
)
plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=10) | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def broken_messages(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "configure", "plan", "detail", "envelope", "truncated", "plain"]))
    if kind == "bytes":
        return draw(st.binary(max_size=500))
    if kind == "configure":
        key = draw(st.sampled_from(["budget", "ceiling", "plan"]))
        bad = draw(never_valid | st.sampled_from([0.0, 0.51, 1.5, 1e9, 5e-324]))
        return envelope(1, "configure", {key: bad})
    if kind == "plan":
        key = draw(st.sampled_from(["sample_delay_s", "report_delay_s", "detail_delay_s", "fract"]))
        bad = draw(never_valid.filter(lambda v: v is not None) if key != "detail_delay_s" else st.just({"quiet": -1.0}))
        return envelope(1, "configure", {"plan": {key: bad}})
    if kind == "detail":
        return envelope(1, "detail", draw(st.sampled_from([{}, {"proflet": 3}, {"proflet": None}, {"proflet": [1]}])))
    if kind == "envelope":
        good = draw(valid_messages)
        _, _, msg_type, body = msgpack.unpackb(good)
        return draw(
            st.sampled_from(
                [
                    envelope(2, msg_type, body),
                    envelope(True, msg_type, body),
                    envelope(1, "report", body),
                    envelope(1, "hello", body),
                    envelope(1, "ctl_reply", {"id": 1, "ok": True}),
                    envelope(1, "launch", body),
                    envelope(1, msg_type, [body]),
                    good + b"\x00",
                    envelope(1, "configure", {"plan": plain_deep(60)}),
                    b"\xdd" + (10**6).to_bytes(4, "big") + b"\x90" * 60_000,  # many arrays, under the size limit
                    envelope(1, "configure", {"junk": "x" * (protocol.MAX_CONTROL_BYTES + 1)}),  # over it
                ]
            )
        )
    if kind == "truncated":
        good = draw(valid_messages)
        return good[: draw(st.integers(0, len(good) - 1))]
    return envelope(1, draw(st.sampled_from(["configure", "detail"])), draw(plain))


def plain_deep(depth: int) -> Any:
    v: Any = {}
    for _ in range(depth):
        v = {"x": v}
    return v


# --- the properties ------------------------------------------------------------------------------


@SETTINGS
@given(batches=st.lists(st.lists(st.one_of(valid_messages, broken_messages()), max_size=12), min_size=1, max_size=5))
def test_whatever_the_monitor_sends_the_agent_counts_the_bad_and_keeps_its_budget(
    batches: list[list[bytes]], ctx: zmq.Context[Any]
) -> None:
    rig = make_rig(ctx)
    try:
        for frames in batches:
            before = rig.agent.dropped["bad_messages"]
            charged = rig.agent.guard.spent_by.get("wake", 0.0)
            rig.send(frames)
            assert rig.agent.dropped["bad_messages"] == before + sum(map(refused, frames))
            # Reading them was paid for from the budget, like any of the agent's work.
            assert not frames or rig.agent.guard.spent_by["wake"] > charged
            rig.check_invariants()
            rig.run_detailing(0.5)
            rig.check_invariants()
    finally:
        rig.close()


@pytest.mark.parametrize(
    "frame",
    [
        envelope(1, "configure", {"budget": math.nan}),
        envelope(1, "configure", {"budget": math.inf}),
        envelope(1, "configure", {"budget": 0.9}),
        envelope(1, "configure", {"budget": 0.0}),
        envelope(1, "configure", {"budget": "5%"}),
        envelope(1, "configure", {"plan": {"sample_delay_s": "0.001"}}),
        envelope(1, "configure", {"plan": {"sample_delay_s": math.inf}}),
        envelope(1, "configure", {"plan": {"report_delay_s": math.nan}}),
        envelope(1, "configure", {"plan": {"detail_delay_s": {"quiet": -1.0}}}),
        envelope(1, "configure", {"plan": {"detail_delay_s": ["quiet"]}}),
        envelope(1, "configure", {"plan": []}),
        envelope(1, "detail", {"proflet": ["quiet"]}),
        envelope(1, "detach", []),
        envelope(2, "detach", {}),
        envelope(1, "detach", {"x": plain_deep(40)}),
        msgpack.packb(["dyper", 1, "detach", {}], use_bin_type=True)[:-1],
        msgpack.packb(["dyper", 1, "detach", {}, 0], use_bin_type=True),
        msgpack.packb(["dyper", 1, "detach", msgpack.ExtType(1, b"")], use_bin_type=True),
    ],
)
def test_each_malformed_message_is_counted_and_changes_nothing(frame: bytes, ctx: zmq.Context[Any]) -> None:
    rig = make_rig(ctx)
    try:
        a = rig.agent
        state = (a.budget, a._pending_budget, a.sample_delay_s, a.report_delay_s, a._monitor_plan, a._bye_reason)
        rig.send([frame])
        assert a.dropped["bad_messages"] == 1
        assert (
            a.budget,
            a._pending_budget,
            a.sample_delay_s,
            a.report_delay_s,
            a._monitor_plan,
            a._bye_reason,
        ) == state
        rig.check_invariants()  # not stopped: a broken detach detaches nothing
    finally:
        rig.close()


def test_only_a_valid_detach_stops_the_agent(ctx: zmq.Context[Any]) -> None:
    rig = make_rig(ctx)
    try:
        rig.send([protocol.encode(protocol.DETACH, {})])
        assert rig.agent._stopping.is_set() and rig.agent._bye_reason == "detach"
        assert rig.agent.dropped["bad_messages"] == 0
    finally:
        rig.close()


def test_the_budget_follows_the_monitor_under_the_ceiling_and_a_ceiling_from_the_monitor_is_ignored(
    ctx: zmq.Context[Any],
) -> None:
    rig = make_rig(ctx)
    try:
        rig.send([protocol.encode(protocol.CONFIGURE, {"budget": 0.03})])
        rig.apply_pending_budget()
        assert rig.agent.budget == 0.03
        rig.send([protocol.encode(protocol.CONFIGURE, {"budget": 0.5, "ceiling": 0.5})])
        rig.apply_pending_budget()
        assert rig.agent.budget == CEILING and rig.agent.ceiling == CEILING
        assert rig.agent.guard.budget == CEILING
    finally:
        rig.close()


def test_timings_that_would_overspend_are_clamped_to_the_agents_own_plan(ctx: zmq.Context[Any]) -> None:
    rig = make_rig(ctx)
    try:
        a = rig.agent
        ours = a.plan
        fast = {"sample_delay_s": 1e-9, "report_delay_s": 0.0, "detail_delay_s": {"quiet": 1e-6}}
        rig.send([protocol.encode(protocol.CONFIGURE, {"plan": fast})])
        assert a._monitor_plan is not None  # the monitor's plan is in force ...
        assert a.sample_delay_s == ours.sample_delay_s  # ... but not where it spends more than ours
        assert a.report_delay_s == ours.report_delay_s
        assert a.scheduler.delays["quiet"] == ours.detail_delay_s["quiet"]
        # Slower is taken, up to the planner's own bounds: a monitor cannot silence the agent.
        slow = {"sample_delay_s": 1e300, "report_delay_s": 1e300, "detail_delay_s": {"quiet": 1e300}}
        rig.send([protocol.encode(protocol.CONFIGURE, {"plan": slow})])
        assert a.sample_delay_s == MAX_SAMPLE_DELAY_S and a.report_delay_s == MAX_REPORT_DELAY_S
        assert a.scheduler.delays["quiet"] == MAX_DETAIL_DELAY_S
        # And the plan lapses: with a 30-s report delay, at most 75 s later the agent is on its own again.
        rig.clock.t += 80
        a._replan()
        assert a._monitor_plan is None and a.report_delay_s == a.plan.report_delay_s
        rig.check_invariants()
    finally:
        rig.close()


def test_a_flood_of_detail_requests_starts_bursts_only_as_the_guard_pays(ctx: zmq.Context[Any]) -> None:
    rig = make_rig(ctx)
    try:
        a = rig.agent
        rig.send([protocol.encode(protocol.CONFIGURE, {"plan": {"detail_delay_s": {"quiet": 1.0}}})])
        for _ in range(20):
            rig.send([protocol.encode(protocol.DETAIL, {"proflet": "quiet"})] * 50)
            rig.run_detailing(0.5)
        # A thousand requests, and bursts only as the guard could pay for each (run_detailing
        # checked every start): 10 s at 2% is 200 ms, a burst reserves some 20 ms and is refunded
        # what it did not cost (nothing, here), so bursts come as fast as they end, not per request.
        assert 1 <= rig.proflet.bursts < 200, rig.proflet.bursts
        assert a.guard.spent_s <= BUDGET * 10.0 + a.guard.capacity_s * BUDGET
        rig.check_invariants()
    finally:
        rig.close()


def test_resyncs_are_served_at_most_once_a_second(ctx: zmq.Context[Any]) -> None:
    rig = make_rig(ctx)
    try:
        a = rig.agent
        rig.heard.clear()  # the first hello
        for _ in range(10):
            rig.send([protocol.encode(protocol.RESYNC, {})] * 100)
            rig.clock.t += 0.25
        rig.drain_monitor()
        hellos = [m for m in rig.heard if m[0] == protocol.HELLO]
        # 2.5 s of fake time: the first, then one per RESYNC_MIN_S.
        assert len(hellos) == 1 + int(2.5 / RESYNC_MIN_S)
        # The rest were refused and counted (once per wake-up's batch: a batch asks for one resync).
        assert a.dropped["resyncs"] >= 10 - len(hellos) and a.dropped["bad_messages"] == 0
        # The full tables went at once when the guard could pay for a report: not at the start
        # (nothing saved up yet: they wait for the next report), then each time.
        assert [m[0] for m in rig.heard] == [protocol.HELLO] + [protocol.HELLO, protocol.REPORT] * (len(hellos) - 1)
    finally:
        rig.close()


def test_nothing_received_is_executed(ctx: zmq.Context[Any], tmp_path: Path) -> None:
    sentinel = tmp_path / "executed"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {sentinel}",))

    code = f"__import__('os').system('touch {sentinel}')"
    pickled = pickle.dumps(Payload())
    frames = [
        pickled,
        envelope(1, "configure", {"plan": {"detail_delay_s": {code: 1.0}}, "monitor": code}),
        envelope(1, "detail", {"proflet": code}),
        envelope(1, "configure", {"budget": msgpack.ExtType(1, pickled)}),
        msgpack.packb(["dyper", 1, "configure", {"x": msgpack.ExtType(42, pickled)}], use_bin_type=True),
        envelope(1, "configure", {"plan": {"sample_delay_s": code}}),
        envelope(1, code, {}),
        envelope(1, "configure", {"monitor": pickled}),
    ]
    rig = make_rig(ctx)
    try:
        rig.send(frames)
        rig.run_detailing(1.0)
        assert not sentinel.exists()
        assert rig.agent.dropped["bad_messages"] == sum(map(refused, frames)) == 6
        rig.check_invariants()
    finally:
        rig.close()
