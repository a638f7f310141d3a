"""A monitor with a backlog of reports still answers commands at once, over real sockets.

The receive loop takes control requests first among the frames it has
received, and lets the event loop run (and the replies go out) every few
milliseconds however many reports wait.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from dyper.agent import protocol
from dyper.monitor.client import MonitorClient
from dyper.monitor.server import RECEIVE_AHEAD, Monitor, Received, Reply
from tests.factories import HELLO, make_report, wait_for

AGENT = HELLO["agent"]
#: monitor CPU a report costs here (a big service's report on a busy monitor)
REPORT_COST_S = 0.005
BACKLOG = 300


class SlowMonitor(Monitor):
    """A real monitor whose reports cost REPORT_COST_S each to take in."""

    def handle(self, ident: bytes, data: bytes) -> list[Reply]:
        if not data.startswith(protocol.encode(protocol.CTL, {})[:-1]):
            time.sleep(REPORT_COST_S)
        return super().handle(ident, data)


class Running:
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.endpoint = monitor.bind()
        self.loop = asyncio.new_event_loop()
        self.stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, name="test-monitor", daemon=True)
        self.thread.start()
        wait_for(lambda: self.stop is not None, what="monitor loop")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            self.stop = asyncio.Event()
            await self.monitor.serve(self.stop)

        self.loop.run_until_complete(main())

    def close(self) -> None:
        assert self.stop is not None
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)
        self.monitor.close()
        self.loop.close()


@pytest.fixture
def slow_monitor() -> Iterator[Running]:
    running = Running(SlowMonitor("tcp://127.0.0.1:0"))
    try:
        yield running
    finally:
        running.close()


def agent_socket(ctx: zmq.Context[Any], endpoint: str) -> zmq.Socket[Any]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, AGENT.encode())
    sock.connect(endpoint)
    return sock


def test_ping_is_answered_while_a_backlog_of_reports_waits(slow_monitor: Running) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    agent = agent_socket(ctx, slow_monitor.endpoint)
    try:
        agent.send(protocol.encode(protocol.HELLO, HELLO))
        for seq in range(BACKLOG):
            agent.send(protocol.encode(protocol.REPORT, make_report([(7, 3, [1, 0])], seq=seq, t=1000.0 + seq)))
        with MonitorClient(slow_monitor.endpoint, timeout=20.0) as client:
            wait_for(lambda: client.call("ping")["counters"]["reports"] > 0, what="the first reports")
            start = time.monotonic()
            info = client.call("ping")
            latency = time.monotonic() - start
            # Answered in the middle of the backlog (BACKLOG * REPORT_COST_S = 1.5 s of work), not after it.
            assert info["counters"]["reports"] < BACKLOG - 50, info["counters"]
            assert latency < 0.5, f"ping took {latency:.2f} s behind the reports"
            # The reports' own answers went out as they were taken in, not at the end of a batch.
            assert agent.poll(2000), "no answer to a report while the backlog is taken in"
            wait_for(lambda: client.call("ping")["counters"]["reports"] == BACKLOG, timeout=30, what="the backlog")
    finally:
        agent.close(linger=0)
        ctx.term()


def test_control_requests_are_taken_ahead_of_the_reports_received_with_them() -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("inproc://intake")
    agent = agent_socket(ctx, "inproc://intake")
    client = ctx.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect("inproc://intake")
    try:
        reports = [protocol.encode(protocol.REPORT, make_report([(7, 1, [1, 0])], seq=k)) for k in range(10)]
        for data in reports[:5]:
            agent.send(data)
        ping = protocol.encode(protocol.CTL, {"id": 1, "op": "ping"})
        client.send(ping)
        for data in reports[5:]:
            agent.send(data)
        pending = Received()
        wait_for(lambda: pending.fill(router) or len(pending) == 11, timeout=5, what="all frames")
        assert pending.pop()[1] == ping
        assert [pending.pop()[1] for _ in range(10)] == reports  # the reports in the order sent
        assert not pending and pending.bytes == 0
        # Never more than RECEIVE_AHEAD held at once.
        for k in range(RECEIVE_AHEAD + 10):
            agent.send(reports[k % 10])
        wait_for(lambda: pending.fill(router) or len(pending) == RECEIVE_AHEAD, timeout=5, what="a full buffer")
        time.sleep(0.1)
        pending.fill(router)
        assert len(pending) == RECEIVE_AHEAD
    finally:
        for sock in (agent, client, router):
            sock.close(linger=0)
        ctx.term()
