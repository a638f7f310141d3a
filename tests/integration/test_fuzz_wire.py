"""Garbage on the wire, both ways, with real processes and real sockets.

An agent in a real target answered by a fake monitor (a ROUTER in this test)
that sends thousands of random and malformed frames among valid ones; and a
real ``dyper monitor`` flooded by a DEALER while it serves a real agent.
"""

from __future__ import annotations

import math
import os
import random
import socket
import time
from typing import Any

import msgpack
import psutil
import zmq

from dyper.agent import protocol
from tests.factories import TARGETS, start_with_agent, stop, wait_for

SEED = 20240611


def _envelope(version: Any, msg_type: Any, body: Any) -> bytes:
    return msgpack.packb(["dyper", version, msg_type, body], use_bin_type=True)


def _mutations(rng: random.Random, good: bytes) -> bytes:
    """One frame the protocol must refuse, in one of the ways a frame goes wrong."""
    kind = rng.randrange(8)
    if kind == 0:
        return os.urandom(rng.randrange(0, 2000))
    if kind == 1:
        return good[: rng.randrange(len(good))]
    if kind == 2:
        return good + os.urandom(rng.randrange(1, 20))
    if kind == 3:
        _, _, msg_type, body = msgpack.unpackb(good)
        return _envelope(rng.choice([0, 2, 99, True, 1.0, "1"]), msg_type, body)
    if kind == 4:
        return _envelope(1, rng.choice(["launch", "report", "hello", "ctl_reply", "", "DETACH"]), {})
    bad = rng.choice([math.nan, math.inf, -math.inf, -1, 2**64 - 1, "x", b"x", [], None, 0.0, 9.0])
    if kind == 5:
        return _envelope(1, "configure", {"budget": bad if bad is not None else "5%"})
    if kind == 6:
        key = rng.choice(["sample_delay_s", "report_delay_s", "detail_delay_s"])
        delay = rng.choice([math.nan, math.inf, -1, -3.0, 2**64 - 1, "0.1", b"x", [], {"cpu": -1.0}])
        return _envelope(1, "configure", {"plan": {key: {"cpu": delay} if key == "detail_delay_s" else delay}})
    return _envelope(1, "detail", {"proflet": bad if isinstance(bad, float | int) else [bad]})


def _agent_bound(rng: random.Random, n: int) -> list[tuple[bytes, bool]]:
    """(frame, refused?) for a monitor to send an agent: garbage, and valid messages it must obey."""
    valid = [
        protocol.encode(protocol.CONFIGURE, {"budget": 0.04}),
        protocol.encode(protocol.CONFIGURE, {"plan": {"sample_delay_s": 0.02, "report_delay_s": 1.0}}),
        protocol.encode(protocol.DETAIL, {"proflet": "no-such-proflet"}),
        protocol.encode(protocol.RESYNC, {}),
    ]
    frames = []
    for _ in range(n):
        if rng.random() < 0.2:
            frames.append((rng.choice(valid), False))
        else:
            frames.append((_mutations(rng, rng.choice(valid)), True))
    return frames


def _refused_by_agent(frame: bytes) -> bool:
    try:
        protocol.decode(frame, protocol.AGENT_ACCEPTS, protocol.MAX_CONTROL_BYTES)
    except protocol.DecodeError:
        return True
    return False


class FakeMonitor:
    """A ROUTER that keeps every report it hears."""

    def __init__(self, ctx: zmq.Context[Any]) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full pipe says so instead of dropping
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.ident = b""
        self.reports: list[dict[str, Any]] = []
        self.hellos: list[dict[str, Any]] = []

    def hear(self, timeout_ms: int = 0) -> None:
        while self.sock.poll(timeout_ms, zmq.POLLIN):
            timeout_ms = 0
            ident, data = self.sock.recv_multipart()
            msg_type, body = protocol.decode(data, protocol.MONITOR_ACCEPTS)  # the agent sends only valid frames
            self.ident = ident
            if msg_type == protocol.HELLO:
                self.hellos.append(body)
            elif msg_type == protocol.REPORT:
                self.reports.append(body)

    def send(self, frame: bytes) -> None:
        """Send without losing the frame: when the agent's queue is full, wait and listen."""
        deadline = time.monotonic() + 20
        while True:
            try:
                self.sock.send_multipart([self.ident, frame], zmq.NOBLOCK)
                return
            except zmq.Again:
                assert time.monotonic() < deadline, "the agent stopped taking messages"
                self.hear(5)


def test_an_agent_fed_garbage_keeps_running_reporting_and_counting_it():
    ctx: zmq.Context[Any] = zmq.Context()
    monitor = FakeMonitor(ctx)
    target = start_with_agent(monitor.endpoint, str(TARGETS / "split.py"), "60", budget=0.05)
    try:
        wait_for(lambda: monitor.hear(100) or monitor.hellos, what="the agent's hello")
        assert monitor.hellos[0]["pid"] == target.pid
        frames = _agent_bound(random.Random(SEED), 3000)
        assert [bad for _, bad in frames] == [_refused_by_agent(f) for f, _ in frames]
        n_bad = sum(bad for _, bad in frames)
        for frame, _ in frames:
            monitor.send(frame)
        seen = len(monitor.reports)

        def counted() -> bool:
            monitor.hear(100)
            return bool(monitor.reports) and monitor.reports[-1]["dropped"]["bad_messages"] == n_bad

        wait_for(counted, timeout=20, what=f"{n_bad} bad messages counted")
        # Reports kept coming all along and still come, and the valid messages were obeyed.
        wait_for(lambda: monitor.hear(100) or len(monitor.reports) >= seen + 2, timeout=15, what="more reports")
        last = monitor.reports[-1]
        assert last["budget"] == 0.04 and any(r["mode"] == "monitor" for r in monitor.reports)
        assert [r["seq"] for r in monitor.reports] == sorted({r["seq"] for r in monitor.reports})
        assert sum(r["samples"] for r in monitor.reports) > 0 and any(r["stacks"] for r in monitor.reports)
        assert target.poll() is None, target.stderr.read()
        # Reading the garbage cannot be put off (a detach may be in it) but is cheap: the agent's
        # whole spend stays within its budget plus what its guard may save up (10 s of it).
        assert last["spent_s"] <= 0.04 * last["elapsed_s"] + 0.05 * 10, (last["spent_s"], last["elapsed_s"])
    finally:
        stop(target)
        monitor.sock.close(0)
        ctx.term()


def _monitor_bound(rng: random.Random, agent_id: str, n: int) -> list[bytes]:
    """Frames a monitor must refuse, among them valid messages from a peer that is not the agent they name."""
    report = {
        "agent": agent_id,
        "seq": 10**6,
        "epoch": 0,
        "t": time.time(),
        "window_s": 1.0,
        "strings": [[10**5, "/evil.py"]],
        "locs": [[10**5, 10**5, 10**5, 1, 1, 0]],
        "stacks": [[1, 10**6, [10**5]]],
        "samples": 10**6,
    }
    good = [
        protocol.encode(protocol.REPORT, report),
        protocol.encode(protocol.BYE, {"agent": agent_id, "reason": "spoofed"}),
        protocol.encode(protocol.ERROR, {"agent": agent_id, "message": "spoofed"}),
    ]
    frames = []
    for i in range(n):
        pick = rng.random()
        if pick < 0.1:
            frames.append(rng.choice(good))  # valid, but the routing id is not the agent's
        elif pick < 0.5:
            frames.append(os.urandom(rng.randrange(0, 3000)))
        elif pick < 0.7:
            frame = rng.choice(good)
            frames.append(frame[: rng.randrange(len(frame))])
        else:
            field = rng.choice(sorted(report))
            bad = rng.choice([math.nan, math.inf, -1, 2**64 - 1, "x", b"x", None, [[-1]], {"a": 1}])
            frames.append(_envelope(1, "report", dict(report, **{field: bad})))
        if i % 500 == 0:
            # Dense: as many arrays as a frame may hold, and more.
            frames.append(b"\xdd" + (200_000).to_bytes(4, "big") + b"\x90" * 200_000)
    return frames


def test_a_monitor_flooded_with_garbage_still_serves_a_real_agent(standing_monitor):
    target = start_with_agent(standing_monitor.endpoint, str(TARGETS / "split.py"), "60", budget=0.05)
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        session = wait_for(lambda: standing_monitor.session(target.pid), what="session")
        before = standing_monitor.call("ping")["counters"]
        rss_before = psutil.Process(standing_monitor.proc.pid).memory_info().rss
        # Speaking for an agent of the target's process (taken in, they would be stashed and a resync sent).
        frames = _monitor_bound(random.Random(SEED), f"{socket.gethostname()}:{target.pid}:000000000000", 3000)
        junk = ctx.socket(zmq.DEALER)
        junk.setsockopt(zmq.LINGER, 5000)  # close() delivers what is queued
        junk.setsockopt(zmq.SNDTIMEO, 20_000)
        junk.connect(standing_monitor.endpoint)
        for frame in frames:
            junk.send(frame)
        junk.send_multipart([b"two", b"parts"])  # not one frame: counted too
        junk.close()
        expected = before["bad_frames"] + len(frames) + 1
        wait_for(
            lambda: standing_monitor.call("ping")["counters"]["bad_frames"] >= expected,
            timeout=30,
            what=f"{len(frames) + 1} bad frames counted",
        )
        after = standing_monitor.call("ping")["counters"]
        assert after["bad_frames"] == expected
        # Nothing of it went in: no stashed report, no spoofed bye, no sample from the flood.
        assert after["stashed_reports"] == before["stashed_reports"]
        samples = standing_monitor.session(target.pid)["samples"]
        assert samples < 10**6 and standing_monitor.session(target.pid)["connected"]
        # The real agent is still served: its reports go on, top answers.
        wait_for(lambda: standing_monitor.session(target.pid)["samples"] > samples, what="more samples")
        top = standing_monitor.call("top", pid=target.pid)
        assert "work" in {r["name"] for r in top["by_total"]}
        assert "/evil.py" not in str(top)
        # Bounded memory: the dense frames were dropped, not kept.
        rss_after = psutil.Process(standing_monitor.proc.pid).memory_info().rss
        assert rss_after - rss_before < 100 * 2**20, (rss_before, rss_after)
        assert session["pid"] == target.pid and target.poll() is None
    finally:
        ctx.term()
        stop(target)
