"""DYMON: the monitor process many agents stream to.

One ZeroMQ ROUTER socket serves agents (DEALER sockets that connect out to
us) and clients (the CLI's ``top``, ``ps``, ``detach``...; also DEALERs). The
socket is created and used only by the asyncio task in :meth:`Monitor.serve`;
other code asks for sends through :meth:`Monitor.post`, which queues.

Why ROUTER/DEALER rather than PUSH/PULL plus a control channel: one
connection per agent carries both directions, the routing id names the agent
so the monitor can answer it (resync, configure, detach), and an agent needs
only one outgoing connection, which is all a firewall or container usually
allows.

:meth:`Monitor.handle` is the whole protocol logic and does no I/O, so tests
drive it directly as well as over real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from agent import protocol
from monitor.profile import Profile
from monitor.scheduler import AgentSchedule
from monitor.session import AgentState, FrameTable, Session, SessionKey, UnknownLocation
from proflets import cpu as cpu_proflet

#: Reports kept per unknown agent while we wait for its hello and tables.
MAX_STASHED_REPORTS = 4
MAX_STASHED_AGENTS = 1000
RESYNC_INTERVAL_S = 1.0

Reply = tuple[bytes, bytes]


class Monitor:
    def __init__(self, endpoint: str, *, on_event: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.endpoint = endpoint
        self.frames = FrameTable()
        self.sessions: dict[SessionKey, Session] = {}
        self.by_agent: dict[str, tuple[Session, AgentState]] = {}
        self.routing: dict[str, bytes] = {}  # agent id -> routing id
        self.counters: dict[str, int] = {
            "frames": 0,
            "bad_frames": 0,
            "reports": 0,
            "stashed_reports": 0,
            "dropped_reports": 0,
            "resyncs": 0,
        }
        #: DYMON's plan and detailing queue per agent
        self.schedules: dict[str, AgentSchedule] = {}
        self._stash: dict[bytes, deque[dict[str, Any]]] = {}
        self._last_resync: dict[bytes, float] = {}
        self._outbox: asyncio.Queue[Reply] | None = None
        self._on_event = on_event
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self.started = time.time()

    # --- socket lifecycle -------------------------------------------------------------

    def bind(self) -> str:
        """Bind the ROUTER socket; return the endpoint actually bound (port 0 resolved)."""
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting agent takes its id back
        sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_FRAME_BYTES)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        sock.setsockopt(zmq.SNDHWM, 1_000)
        try:
            if self.endpoint.endswith(":0"):
                port = sock.bind_to_random_port(self.endpoint.rsplit(":", 1)[0])
                self.endpoint = f"{self.endpoint.rsplit(':', 1)[0]}:{port}"
            else:
                sock.bind(self.endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            self._ctx.term()
            raise OSError(f"cannot listen on {self.endpoint}: {exc.strerror}") from None
        self._sock = sock
        return self.endpoint

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def serve(self, stop: asyncio.Event) -> None:
        """Receive and answer until ``stop`` is set."""
        assert self._sock is not None, "bind() first"
        sock = self._sock
        self._outbox = asyncio.Queue()
        sender = asyncio.create_task(self._send_loop(sock))
        try:
            while not stop.is_set():
                # Poll, then receive only what is ready: cancelling a pending
                # recv (asyncio.wait_for on recv_multipart) can consume a
                # message and then drop it (pyzmq and CPython race).
                if not await sock.poll(200):  # POLLIN
                    continue
                for _ in range(1000):  # bounded, so stop and sends get their turn
                    if not int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                        break
                    parts = await sock.recv_multipart(copy=True)
                    self.counters["frames"] += 1
                    if len(parts) != 2:
                        self.counters["bad_frames"] += 1
                        continue
                    for reply in self.handle(parts[0], parts[1]):
                        self._outbox.put_nowait(reply)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender

    async def _send_loop(self, sock: zmq.asyncio.Socket) -> None:
        assert self._outbox is not None
        while True:
            ident, data = await self._outbox.get()
            # An agent that went away makes this fail; that is its problem, not ours.
            with contextlib.suppress(zmq.ZMQError):
                await sock.send_multipart([ident, data], flags=zmq.NOBLOCK)

    def post(self, ident: bytes, msg_type: str, body: dict[str, Any]) -> None:
        if self._outbox is not None:
            self._outbox.put_nowait((ident, protocol.encode(msg_type, body)))

    # --- protocol logic (no I/O) -----------------------------------------------------

    def handle(self, ident: bytes, data: bytes) -> list[Reply]:
        """Process one frame from ``ident``; return the frames to send back."""
        try:
            msg_type, body = protocol.decode(data, protocol.MONITOR_ACCEPTS)
        except protocol.DecodeError:
            self.counters["bad_frames"] += 1
            return []
        try:
            if msg_type == protocol.REPORT:
                return self._on_report(ident, body)
            if msg_type == protocol.HELLO:
                return self._on_hello(ident, body)
            if msg_type == protocol.BYE:
                self._on_bye(body)
                return []
            if msg_type == protocol.ERROR:
                entry = self.by_agent.get(body["agent"])
                if entry is not None:
                    entry[0].errors.append(body["message"])
                self._event("agent_error", {"agent": body["agent"], "message": body["message"]})
                return []
            if msg_type == protocol.CTL:
                return [(ident, self._on_ctl(body))]
        except Exception as exc:  # a bug must cost one message, not the monitor
            self.counters["bad_frames"] += 1
            self._event("internal_error", {"message": f"{type(exc).__name__}: {exc}"})
        return []

    def _event(self, kind: str, data: dict[str, Any]) -> None:
        if self._on_event is not None:
            self._on_event(kind, data)

    def _on_hello(self, ident: bytes, body: dict[str, Any]) -> list[Reply]:
        key: SessionKey = (body["host"], body["pid"], float(body["start_time"]))
        session = self.sessions.get(key)
        if session is None:
            session = self.sessions[key] = Session(key, body, self.frames)
            self._event("session", {"pid": body["pid"], "argv": body["argv"]})
        state = session.add_agent(body)
        self.by_agent[state.agent_id] = (session, state)
        self.routing[state.agent_id] = ident
        self._event("hello", {"pid": body["pid"], "agent": state.agent_id})
        replies: list[Reply] = []
        # Reports that arrived before the hello (we restarted) go in now.
        for report in list(self._stash.pop(ident, ())):
            replies += self._on_report(ident, report, stashed=True)
        return replies

    def _on_report(self, ident: bytes, body: dict[str, Any], stashed: bool = False) -> list[Reply]:
        entry = self.by_agent.get(body["agent"])
        if entry is None:
            return self._stash_and_resync(ident, body)
        session, state = entry
        state.connected = True
        self.routing[state.agent_id] = ident
        if body["epoch"] < state.epoch:
            self.counters["dropped_reports"] += 1
            return []
        try:
            session.ingest(state, body)
        except UnknownLocation:
            # We lost this agent's tables (restart while it kept running).
            return self._stash_and_resync(ident, body)
        self.counters["reports"] += 1
        replies: list[Reply] = []
        if not stashed:
            replies += self._schedule(ident, session, state, body)
        if not stashed and ident in self._stash:
            for report in list(self._stash.pop(ident)):
                replies += self._on_report(ident, report, stashed=True)
        return replies

    def _schedule(self, ident: bytes, session: Session, state: AgentState, body: dict[str, Any]) -> list[Reply]:
        """DYMON: timings and detailing requests for the agent that just reported."""
        schedule = self.schedules.get(state.agent_id)
        if schedule is None:
            schedule = self.schedules[state.agent_id] = AgentSchedule(budget=state.budget)

        def priorities(name: str) -> float | None:
            return cpu_proflet.priority(session) if name == "cpu" else None

        out = schedule.on_report(body, time.monotonic(), priorities)
        return [(ident, protocol.encode(msg_type, msg)) for msg_type, msg in out]

    def _stash_and_resync(self, ident: bytes, body: dict[str, Any]) -> list[Reply]:
        if ident not in self._stash and len(self._stash) >= MAX_STASHED_AGENTS:
            self.counters["dropped_reports"] += 1
        else:
            queue = self._stash.setdefault(ident, deque(maxlen=MAX_STASHED_REPORTS))
            if len(queue) == queue.maxlen:
                self.counters["dropped_reports"] += 1
            queue.append(body)
            self.counters["stashed_reports"] += 1
        now = time.monotonic()
        if now - self._last_resync.get(ident, 0.0) < RESYNC_INTERVAL_S:
            return []
        self._last_resync[ident] = now
        self.counters["resyncs"] += 1
        return [(ident, protocol.encode(protocol.RESYNC, {}))]

    def _on_bye(self, body: dict[str, Any]) -> None:
        entry = self.by_agent.get(body["agent"])
        if entry is not None:
            entry[1].connected = False
            self.schedules.pop(entry[1].agent_id, None)
            self._event("bye", {"pid": entry[0].pid, "reason": body.get("reason", "")})

    # --- queries and control from clients ---------------------------------------------

    def session_for(self, pid: int) -> Session | None:
        """The newest session of ``pid`` on this host (connected ones first)."""
        candidates = [s for s in self.sessions.values() if s.pid == pid]
        candidates.sort(key=lambda s: (s.connected, s.key[2]))
        return candidates[-1] if candidates else None

    def send_to_pid(self, pid: int, msg_type: str, body: dict[str, Any]) -> int:
        session = self.session_for(pid)
        if session is None:
            return 0
        n = 0
        for state in session.agents.values():
            ident = self.routing.get(state.agent_id)
            if state.connected and ident is not None:
                self.post(ident, msg_type, body)
                n += 1
        return n

    def sessions_info(self) -> list[dict[str, Any]]:
        from monitor.views import session_info

        return [session_info(s) for s in self.sessions.values()]

    def _on_ctl(self, body: dict[str, Any]) -> bytes:
        from monitor import views

        rid, op, args = body["id"], body["op"], body.get("args") or {}

        def reply(result: Any = None, error: str | None = None) -> bytes:
            out: dict[str, Any] = {"id": rid, "ok": error is None, "result": result}
            if error is not None:
                out["error"] = error
            return protocol.encode(protocol.CTL_REPLY, out)

        if op == "ping":
            return reply({"endpoint": self.endpoint, "sessions": len(self.sessions), "counters": self.counters})
        if op == "sessions":
            return reply(self.sessions_info())
        pid = args.get("pid")
        if op in ("profile", "top", "detach", "budget", "detail"):
            if not isinstance(pid, int):
                return reply(error=f"{op}: give a pid")
            session = self.session_for(pid)
            if session is None:
                return reply(error=f"process {pid} is not known to this monitor: attach to it first")
            window = args.get("window_s")
            window = float(window) if isinstance(window, int | float) else None
            if op == "profile":
                return reply(Profile.from_session(session, window).to_json())
            if op == "top":
                return reply(views.top_view(session, window, charge_libraries=bool(args.get("libraries"))))
            if op == "detach":
                return reply({"detached": self.send_to_pid(pid, protocol.DETACH, {})})
            if op == "detail":
                # The bottleneck search asks for a burst where it needs one; the
                # request joins the agent's detailing queue on its next report.
                proflet = args.get("proflet", "cpu")
                if not isinstance(proflet, str):
                    return reply(error="detail: give a proflet name")
                asked = 0
                for state in session.agents.values():
                    schedule = self.schedules.get(state.agent_id)
                    if state.connected and schedule is not None and proflet in schedule.costs:
                        schedule.ask(proflet)
                        asked += 1
                return reply({"asked": asked})
            budget = args.get("budget")
            if not isinstance(budget, int | float) or not 0 < budget <= 0.5:
                return reply(error="budget: give a fraction between 0 and 0.5")
            return reply({"configured": self.send_to_pid(pid, protocol.CONFIGURE, {"budget": float(budget)})})
        return reply(error=f"unknown operation {op!r}")
