"""Fuzzing the monitor's intake: ``Monitor.handle`` fed garbage, broken and hostile frames.

Properties, for every frame: nothing escapes ``handle``; no bug is hidden by
its catch-all (no ``internal_error`` event); a frame the protocol refuses is
counted in ``bad_frames`` (as ``ping`` shows it) and changes nothing else; one
frame costs memory in proportion to its size (``protocol.MAX_EXPANSION``) and
keeps none of it. After the garbage the monitor still takes a real agent's
hello and report, and can still show every session it has.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dyper.agent import protocol
from dyper.agent.core import Agent
from dyper.monitor.server import Monitor
from tests.factories import AGENT, WRONG, broken_reports, never_valid, report_bodies

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: Memory one frame may cost beyond MAX_EXPANSION times its size: the handler's own
#: bookkeeping (a session, its analyzers, the reply) is a few hundred KiB at most.
SLACK_BYTES = 512 * 1024

IDENT = AGENT.encode()


@pytest.fixture(scope="module")
def real_hello() -> dict[str, Any]:
    """The hello a real agent sends (built by the agent, its thread never started)."""
    a = Agent("tcp://127.0.0.1:1", 0.01, proflets=())
    try:
        return a._hello_body()
    finally:
        for fd in (a._wake_r, a._wake_w):
            os.close(fd)


def hello(base: dict[str, Any], agent: str = AGENT, pid: int = 4242, start_time: float = 1.7e9) -> dict[str, Any]:
    return dict(base, agent=agent, pid=pid, host="fuzz-host", start_time=start_time)


# --- valid bodies, in the shapes agent/core.py sends -------------------------------------------


def sample_report(**over: Any) -> dict[str, Any]:
    """One valid report, the same every time."""
    body = {
        "agent": AGENT,
        "seq": 0,
        "epoch": 0,
        "t": 1.7e9,
        "window_s": 1.0,
        "strings": [[0, "/app/app.py"], [1, "main"], [2, "work"]],
        "locs": [[0, 0, 1, 1, 5, 0], [1, 0, 2, 10, 12, 0], [2, 0, 1, 1, 7, protocol.LOC_BLOCKING]],
        "stacks": [[1, 7, [1, 0]], [2, 3, [2]]],
        "samples": 8,
        "threads": [[1, "MainThread"], [2, "worker"]],
        "costs": {"sample": 0.001, "report": 0.0005, "detail": 0.0, "wake": 0.0001},
        "budget": 0.01,
        "proflets": {"cpu": {"ovhd_ms": 1.0, "slow": 0.5, "itvl_ms": 200.0, "prty": 0.5, "allows": []}},
    }
    body.update(over)
    return body


# --- what goes wrong ---------------------------------------------------------------------------

#: Plain data of every shape: what a newer agent might send in a field we do not know.
plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20) | st.binary(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


HELLO_WRONG: dict[str, list[Any]] = {
    "pid": [0, -1, 2**31, "1", 1.0],
    "start_time": [-1.0, "x", 1e300],
    "argv": ["python app.py", [1]],
    "budget": [0.0, 2.0, -1.0],
    "cpus": [0, -2, "4"],
    "paths": [{"stdlib": 1}, ["x"]],
    "capabilities": [[None]],
    "ceiling": [0.0, 7.0],
}


@st.composite
def broken_hellos(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    body = hello(base)
    kind = draw(st.sampled_from(["wrong", "missing", "never"]))
    if kind == "missing":
        del body[draw(st.sampled_from(["agent", "host", "pid", "start_time", "argv", "python", "budget"]))]
    else:
        field = draw(st.sampled_from(sorted(HELLO_WRONG)))
        body[field] = draw(st.sampled_from(HELLO_WRONG[field]) if kind == "wrong" else never_valid)
    return body


def envelope(version: Any, msg_type: Any, body: Any) -> bytes:
    return msgpack.packb(["dyper", version, msg_type, body], use_bin_type=True)


# --- the monitor under test ----------------------------------------------------------------------


class Intake:
    """A real Monitor (no socket: ``handle`` does no I/O) and what it reports about itself."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.monitor = Monitor("tcp://127.0.0.1:0", on_event=lambda kind, data: self.events.append((kind, data)))
        self._ids = iter(range(1, 10**9))

    def ctl(self, op: str, **args: Any) -> dict[str, Any]:
        rid = next(self._ids)
        replies = self.monitor.handle(b"cli", protocol.encode(protocol.CTL, {"id": rid, "op": op, "args": args}))
        assert len(replies) == 1, f"{op}: {len(replies)} replies"
        _, body = protocol.decode(replies[0][1], protocol.CLIENT_ACCEPTS)
        assert body["id"] == rid
        return body

    def counters(self) -> dict[str, int]:
        reply = self.ctl("ping")
        assert reply["ok"], reply
        return dict(reply["result"]["counters"])

    def state(self) -> tuple[int, int, int]:
        m = self.monitor
        return len(m.sessions), sum(s.samples for s in m.sessions.values()), sum(s.reports for s in m.sessions.values())

    def feed_bad(self, data: bytes, ident: bytes = IDENT) -> None:
        """A frame the protocol must refuse: counted once, nothing else changes."""
        before, state = self.counters(), self.state()
        assert self.monitor.handle(ident, data) == []
        after = self.counters()
        assert after["bad_frames"] == before["bad_frames"] + 1, data[:200]
        assert {k: v for k, v in after.items() if k != "bad_frames"} == {
            k: v for k, v in before.items() if k != "bad_frames"
        }
        assert self.state() == state
        self.no_bugs()

    def no_bugs(self) -> None:
        bugs = [data for kind, data in self.events if kind == "internal_error"]
        assert not bugs, bugs

    def still_serves(self, real_hello: dict[str, Any]) -> None:
        """Not poisoned: every session still renders, and a new real agent is taken in full."""
        sessions = self.ctl("sessions")
        assert sessions["ok"], sessions
        json.dumps(sessions["result"])  # plain data the web UI can serve
        for s in sessions["result"]:
            top = self.ctl("top", pid=s["pid"])
            assert top["ok"] or "not known" in top.get("error", ""), top
        agent = "fresh-host:777:feedfeedfeed"
        assert self.monitor.handle(agent.encode(), protocol.encode(protocol.HELLO, hello(real_hello, agent, 777))) == []
        report = {
            "agent": agent,
            "seq": 0,
            "epoch": 0,
            "t": 1.7e9 + 1,
            "window_s": 1.0,
            "strings": [[0, "/app/app.py"], [1, "main"], [2, "work"]],
            "locs": [[0, 0, 1, 1, 5, 0], [1, 0, 2, 10, 12, 0]],
            "stacks": [[1, 30, [1, 0]], [2, 12, [0]]],
            "samples": 31,
        }
        replies = self.monitor.handle(agent.encode(), protocol.encode(protocol.REPORT, report))
        assert [protocol.decode(r[1])[0] for r in replies] == [protocol.CONFIGURE]
        session = self.monitor.session_for(777)
        assert session is not None and session.samples == 31
        assert sum(wall for wall, _ in session.counts.values()) == 42
        top = self.ctl("top", pid=777)
        assert top["ok"] and {f["name"] for f in top["result"]["functions"]} >= {"main", "work"}, top
        self.no_bugs()


@pytest.fixture
def intake() -> Intake:
    return Intake()


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def peak_of(m: Monitor, ident: bytes, data: bytes) -> int:
    """Bytes allocated at the peak of handling one frame, beyond what was allocated before it."""
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    m.handle(ident, data)
    return tracemalloc.get_traced_memory()[1] - before


# --- the properties ------------------------------------------------------------------------------


@SETTINGS
@given(frames=st.lists(st.binary(max_size=3000), min_size=1, max_size=20))
def test_random_bytes_are_counted_and_change_nothing(frames: list[bytes], real_hello: dict[str, Any]) -> None:
    intake = Intake()
    for data in frames:
        intake.feed_bad(data)
    intake.still_serves(real_hello)


@settings(max_examples=6, deadline=None)
@given(body=report_bodies())
def test_a_valid_report_truncated_at_every_length_is_counted_each_time(
    body: dict[str, Any], real_hello: dict[str, Any]
) -> None:
    intake = Intake()
    m = intake.monitor
    m.handle(IDENT, protocol.encode(protocol.HELLO, hello(real_hello)))
    data = protocol.encode(protocol.REPORT, body)
    before = intake.counters()["bad_frames"]
    for n in range(len(data)):
        assert m.handle(IDENT, data[:n]) == []
    assert intake.counters()["bad_frames"] == before + len(data)
    assert m.session_for(4242).samples == 0
    # The whole frame still goes in.
    m.handle(IDENT, data)
    assert m.session_for(4242).samples == body["samples"]
    intake.no_bugs()


@SETTINGS
@given(data=st.data())
def test_every_message_type_with_a_wrong_field_is_counted(data: st.DataObject, real_hello: dict[str, Any]) -> None:
    intake = Intake()
    intake.monitor.handle(IDENT, protocol.encode(protocol.HELLO, hello(real_hello)))
    for _ in range(8):
        kind = data.draw(st.sampled_from(["report", "hello", "bye", "error", "ctl", "envelope"]))
        if kind == "report":
            frame = envelope(1, "report", data.draw(broken_reports()))
        elif kind == "hello":
            frame = envelope(1, "hello", data.draw(broken_hellos(real_hello)))
        elif kind == "bye":
            frame = envelope(1, "bye", data.draw(st.sampled_from([{}, {"agent": 1}, {"agent": AGENT, "reason": 2}])))
        elif kind == "error":
            frame = envelope(1, "error", data.draw(st.sampled_from([{"agent": AGENT}, {"agent": AGENT, "message": 1}])))
        elif kind == "ctl":
            frame = envelope(
                1,
                "ctl",
                data.draw(
                    st.sampled_from(
                        [
                            {"op": "ping"},
                            {"id": "1", "op": "ping"},
                            {"id": 1, "op": 3},
                            {"id": 1, "op": "top", "args": 5},
                        ]
                    )
                ),
            )
        else:
            # A valid body in a wrong envelope: unknown or future versions, unknown or
            # agent-bound types, a body that is not a map, a magic that is not ours.
            body = data.draw(report_bodies())
            frame = data.draw(
                st.sampled_from(
                    [
                        envelope(2, "report", body),
                        envelope(0, "report", body),
                        envelope(True, "report", body),
                        envelope(1.0, "report", body),
                        envelope("1", "report", body),
                        envelope(1, "launch", body),
                        envelope(1, "configure", {"budget": 0.01}),
                        envelope(1, "detach", {}),
                        envelope(1, "ctl_reply", {"id": 1, "ok": True}),
                        envelope(1, "report", [body]),
                        msgpack.packb(["DYPER", 1, "report", body]),
                        msgpack.packb(["dyper", 1, "report", body, "extra"]),
                        protocol.encode(protocol.REPORT, body) + b"\x00",
                    ]
                )
            )
        intake.feed_bad(frame)
    intake.still_serves(real_hello)


@SETTINGS
@given(extra=st.dictionaries(st.text(min_size=1, max_size=10), plain, min_size=1, max_size=3), body=report_bodies())
def test_unknown_fields_are_kept_as_plain_data_or_refused_never_a_crash(
    extra: dict[str, Any], body: dict[str, Any], real_hello: dict[str, Any]
) -> None:
    """A newer agent's fields: passed over when they are plain data, refused (and counted) when not."""
    intake = Intake()
    m = intake.monitor
    extra = {k: v for k, v in extra.items() if k not in body and k not in real_hello}
    for msg_type, b in ((protocol.HELLO, dict(hello(real_hello), **extra)), (protocol.REPORT, dict(body, **extra))):
        frame = envelope(1, msg_type, b)
        try:
            protocol.decode(frame)
        except protocol.DecodeError:
            intake.feed_bad(frame)
        else:
            before = intake.counters()
            m.handle(IDENT, frame)
            assert intake.counters()["bad_frames"] == before["bad_frames"]
            intake.no_bugs()
    intake.still_serves(real_hello)


def test_values_the_protocol_must_refuse_are_refused(real_hello: dict[str, Any]) -> None:
    """Each WRONG value, alone in an otherwise valid frame, is counted (deterministic, every one)."""
    intake = Intake()
    intake.monitor.handle(IDENT, protocol.encode(protocol.HELLO, hello(real_hello)))
    body = sample_report()
    for field, values in WRONG.items():
        for value in values:
            intake.feed_bad(envelope(1, "report", dict(body, **{field: value})))
    for field, values in HELLO_WRONG.items():
        for value in values:
            intake.feed_bad(envelope(1, "hello", dict(hello(real_hello), **{field: value})))
    intake.still_serves(real_hello)


def test_reports_before_hello_wait_for_it_and_resync_is_asked_once_a_second(real_hello: dict[str, Any]) -> None:
    intake = Intake()
    m = intake.monitor
    body = sample_report()
    replies = m.handle(IDENT, protocol.encode(protocol.REPORT, body))
    assert [protocol.decode(r[1])[0] for r in replies] == [protocol.RESYNC]
    for seq in range(1, 10):
        assert m.handle(IDENT, protocol.encode(protocol.REPORT, dict(body, seq=seq))) == []
    c = intake.counters()
    # Four kept, the rest dropped and counted: none crashed, none lost silently.
    assert c["stashed_reports"] == 10 and c["dropped_reports"] == 6 and c["resyncs"] == 1
    m.handle(IDENT, protocol.encode(protocol.HELLO, hello(real_hello)))
    assert m.session_for(4242).samples == 4 * body["samples"]
    assert m._stash_rows == 0
    intake.still_serves(real_hello)


def test_stacks_naming_locations_never_sent_change_no_counts(real_hello: dict[str, Any]) -> None:
    intake = Intake()
    m = intake.monitor
    m.handle(IDENT, protocol.encode(protocol.HELLO, hello(real_hello)))
    body = sample_report()
    holes = [
        dict(body, stacks=[[1, 5, [len(body["locs"]) + 3]]]),  # a location never sent
        dict(body, locs=[[0, 999, 0, 1, 1, 0]], stacks=[[1, 5, [0]]]),  # a string never sent
    ]
    for report in holes:
        before = intake.counters()
        m.handle(IDENT, protocol.encode(protocol.REPORT, report))
        after = intake.counters()
        assert (
            after["stashed_reports"] + after["dropped_reports"] > before["stashed_reports"] + before["dropped_reports"]
        )
        assert m.session_for(4242).samples == 0 and not m.session_for(4242).counts
    intake.no_bugs()
    intake.still_serves(real_hello)


def test_a_second_hello_moving_an_agent_to_another_process_is_refused(real_hello: dict[str, Any]) -> None:
    intake = Intake()
    m = intake.monitor
    m.handle(IDENT, protocol.encode(protocol.HELLO, hello(real_hello)))
    intake.feed_bad(protocol.encode(protocol.HELLO, hello(real_hello, pid=4243)))
    intake.feed_bad(protocol.encode(protocol.HELLO, hello(real_hello, start_time=1.8e9)))
    assert m.session_for(4243) is None
    first = m.session_for(4242)
    assert first is not None and first.connected
    # Its reports still go where they belong.
    m.handle(IDENT, protocol.encode(protocol.REPORT, dict(sample_report(), samples=9)))
    assert first.samples == 9
    intake.still_serves(real_hello)


def test_a_peer_speaking_for_another_agent_is_refused(real_hello: dict[str, Any]) -> None:
    intake = Intake()
    m = intake.monitor
    m.handle(IDENT, protocol.encode(protocol.HELLO, hello(real_hello)))
    for msg_type, body in (
        (protocol.REPORT, sample_report()),
        (protocol.HELLO, hello(real_hello)),
        (protocol.BYE, {"agent": AGENT}),
        (protocol.ERROR, {"agent": AGENT, "message": "spoofed"}),
    ):
        intake.feed_bad(protocol.encode(msg_type, body), ident=b"\x00junk")
    assert m.routing[AGENT] == IDENT and m.session_for(4242).connected and not m.session_for(4242).errors
    intake.still_serves(real_hello)


@SETTINGS
@given(op=st.sampled_from(["ping", "sessions", "top", "profile", "timeline", "report", "detail", "budget", "detach",
                           "history", "nope"]),
       args=st.dictionaries(st.sampled_from(["pid", "window_s", "window", "bucket_s", "budget", "proflet",
                                             "start_time", "libraries", "service"]), plain, max_size=4))  # fmt: skip
def test_every_ctl_request_gets_exactly_one_answer(op: str, args: dict[str, Any], real_hello: dict[str, Any]) -> None:
    intake = Intake()
    m = intake.monitor
    m.handle(IDENT, protocol.encode(protocol.HELLO, hello(real_hello)))
    m.handle(IDENT, protocol.encode(protocol.REPORT, sample_report()))
    args = {k: (4242 if k == "pid" and v is None else v) for k, v in args.items()}
    frame = envelope(1, "ctl", {"id": 77, "op": op, "args": args})
    try:
        protocol.decode(frame)
    except protocol.DecodeError:
        intake.feed_bad(frame)
        return
    replies = m.handle(b"cli", frame)
    assert len(replies) == 1
    _, reply = protocol.decode(replies[0][1], protocol.CLIENT_ACCEPTS)
    assert reply["id"] == 77 and (reply["ok"] or reply["error"])
    intake.no_bugs()


# --- memory ---------------------------------------------------------------------------------------


def _array(n: int, item: bytes) -> bytes:
    return b"\xdd" + n.to_bytes(4, "big") + item * n


#: Frames built to decode to as much memory as they can: empty and nested arrays
#: and maps, small and large integers, floats, short strings, extension types.
DENSE = {
    "empty arrays": _array(100_000, b"\x90"),
    "empty maps": _array(100_000, b"\x80"),
    "nested pairs": _array(50_000, b"\x91\x90"),
    "fixints": _array(100_000, b"\x05"),
    "uint64s": _array(25_000, b"\xcf" + (2**63 + 5).to_bytes(8, "big")),
    "floats": _array(25_000, b"\xcb" + b"\x3f\xf0\x00\x00\x00\x00\x00\x01"),
    "short strings": _array(50_000, b"\xa1x"),
    "timestamps": _array(15_000, b"\xd6\xff\x00\x00\x00\x01"),
    "ext": _array(30_000, b"\xd4\x05x"),
    "report of empty stacks": envelope(1, "report", {"stacks": [[0, 1, []]] * 30_000}),
    "deep": b"\x91" * 1000 + b"\x90",
}


@pytest.mark.parametrize("name", sorted(DENSE))
def test_one_frame_costs_memory_in_proportion_to_its_size(name: str, intake: Intake, traced: None) -> None:
    frames = [DENSE[name]]
    if name != "deep":
        # The same inside a valid report, as a field this version does not know.
        frames.append(envelope(1, "report", sample_report(extra=msgpack.unpackb(DENSE[name], strict_map_key=False))))
    for frame in frames:
        peak = peak_of(intake.monitor, IDENT, frame)
        assert peak <= protocol.MAX_EXPANSION * len(frame) + SLACK_BYTES, f"{name}: {peak} bytes for {len(frame)}"
    intake.no_bugs()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_bad_frames_cost_bounded_memory_and_keep_none(data: st.DataObject, real_hello: dict[str, Any]) -> None:
    intake = Intake()
    m = intake.monitor
    m.handle(IDENT, protocol.encode(protocol.HELLO, hello(real_hello)))
    frames = [data.draw(st.binary(max_size=4000)), envelope(1, "report", data.draw(broken_reports()))]
    frames.append(envelope(1, "report", dict(data.draw(report_bodies()), extra=data.draw(plain))))
    tracemalloc.start()
    try:
        for frame in frames:
            m.handle(IDENT, frame)  # once first: interned strings and caches are not the frame's cost
        kept = tracemalloc.get_traced_memory()[0]
        for frame in frames:
            peak = peak_of(m, IDENT, frame)
            assert peak <= protocol.MAX_EXPANSION * len(frame) + SLACK_BYTES
        for _ in range(20):
            m.handle(IDENT, frames[0])
            m.handle(IDENT, frames[1])
        # Bad frames are dropped, not kept (a little slack for counters and free lists).
        assert tracemalloc.get_traced_memory()[0] - kept < 64 * 1024
    finally:
        tracemalloc.stop()
    intake.no_bugs()
