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

Off loopback the socket is a CURVE server and also binds a local control
endpoint without CURVE for the commands run on this host (see
:mod:`monitor.curve`).

:meth:`Monitor.handle` is the whole protocol logic and does no I/O, so tests
drive it directly as well as over real sockets.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import zmq
import zmq.asyncio

from dyper.agent import protocol
from dyper.monitor.model.profile import Profile
from dyper.monitor.profile import ProfileJob, View, build_profile, profile_job
from dyper.monitor.report import report_of
from dyper.monitor.scheduler import AgentSchedule
from dyper.monitor.session import (
    AgentState,
    FrameTable,
    Session,
    SessionKey,
    UnknownLocation,
    same_process,
    stacks_as_bytes,
)
from dyper.monitor.windows import WindowSpec

if TYPE_CHECKING:
    from dyper.monitor.curve import Gate, ServerKeys
    from dyper.monitor.history import History, ReportMeta

T = TypeVar("T")

#: Reports kept per unknown agent while we wait for its hello and tables.
MAX_STASHED_REPORTS = 4
MAX_STASHED_AGENTS = 1000
#: Table rows and stack entries kept in all stashed reports together: after a
#: restart agents send deltas, a few hundred rows each; this bounds what
#: reports that never resolve can hold.
MAX_STASHED_ROWS = 1_000_000
RESYNC_INTERVAL_S = 1.0
#: How often the detailing queues are looked at between reports: bursts of a
#: few hundred ms at a high budget are due a few times a second.
SCHEDULE_TICK_MS = 100
#: How often the monitor looks for local agents whose process died without a
#: bye (SIGKILL, the OOM killer): until it did, such a session stayed
#: "connected" for good, and `dyper top` showed a dead process as live.
GONE_CHECK_S = 2.0
#: What `dyper pause`, `resume` and `reset` (and the dashboard's buttons) ask of an agent.
CONTROLS = ("pause", "resume", "reset")


#: The receive loop lets the event loop run (sends, the ZAP handler, replies of
#: queries run on threads) at least this often, however many frames wait.
YIELD_S = 0.02
#: Frames received ahead of handling at most, and their bytes (most reports are some
#: 50 KiB, the largest a few MiB): control requests among them are answered first.
RECEIVE_AHEAD = 256
RECEIVE_AHEAD_BYTES = 64 * 1024 * 1024
#: How every control request starts on the wire (the envelope up to the body), so
#: one is told from a report without decoding it.
_CTL_PREFIX = protocol.encode(protocol.CTL, {})[:-1]

Reply = tuple[bytes, bytes]


class Monitor:
    """DYMON. With ``history``, everything received is kept there, and what it kept is loaded first.

    With ``curve`` the endpoint is a CURVE server that lets in only the
    authorized agent keys, and ``control`` (default: an ipc socket only this
    user can reach, see :func:`monitor.curve.default_control`) serves this
    host's commands without CURVE.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        history: History | None = None,
        curve: ServerKeys | None = None,
        control: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.curve = curve
        #: the endpoint without CURVE bound beside a CURVE one (None without CURVE)
        self.control_endpoint = control
        self._gate: Gate | None = None
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
        self._stash: dict[bytes, deque[protocol.Report]] = {}
        self._stash_rows = 0
        self._last_resync: dict[bytes, float] = {}
        self._outbox: asyncio.Queue[Reply] | None = None
        self._on_event = on_event
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self.started = time.time()
        #: answers that read history run here, off the receive loop
        self._queries: concurrent.futures.ThreadPoolExecutor | None = None
        self.history = history
        if history is not None:
            self._restore(history)
            history.start(self.frames)

    def _restore(self, history: History) -> None:
        frames, stored = history.load()
        for frame in frames:
            self.frames.intern(frame)
        for s in stored:
            self.sessions[s.key] = Session.restore(s.key, s.hello, self.frames, s.state, s.counts)

    # --- socket lifecycle -------------------------------------------------------------

    @property
    def local_endpoint(self) -> str:
        """Where agents and commands on this host reach us without keys."""
        return self.control_endpoint or self.endpoint

    def bind(self) -> str:
        """Bind the ROUTER socket; return the endpoint actually bound (port 0 resolved)."""
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting agent takes its id back
        sock.setsockopt(zmq.MAXMSGSIZE, protocol.MAX_FRAME_BYTES)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        sock.setsockopt(zmq.SNDHWM, 1_000)
        if self.curve is not None:
            from dyper.monitor.curve import Gate

            self._gate = Gate(self.curve, self.counters, self._event)
            self._gate.install(self._ctx, sock)
        bound = self.endpoint
        try:
            if self.endpoint.endswith(":0"):
                port = sock.bind_to_random_port(self.endpoint.rsplit(":", 1)[0])
                self.endpoint = f"{self.endpoint.rsplit(':', 1)[0]}:{port}"
            else:
                sock.bind(self.endpoint)
            if self._gate is not None:
                # Bound last, and so without CURVE (options count for later binds).
                sock.curve_server = False
                bound = self.control_endpoint or "the control endpoint"
                if self.control_endpoint is None:
                    from dyper.monitor.curve import default_control

                    self.control_endpoint = default_control(int(self.endpoint.rsplit(":", 1)[1]))
                bound = self.control_endpoint
                sock.bind(self.control_endpoint)
        except (zmq.ZMQError, ValueError) as exc:
            sock.close(linger=0)
            if self._gate is not None:
                self._gate.close()
            self._ctx.term()
            raise OSError(f"cannot listen on {bound}: {getattr(exc, 'strerror', None) or exc}") from None
        self._sock = sock
        return self.endpoint

    def close(self) -> None:
        if self._queries is not None:
            self._queries.shutdown(wait=True, cancel_futures=True)
            self._queries = None
        if self.history is not None:
            self.history.close()
        if self._sock is not None:
            if self._gate is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self._sock.disable_monitor()
            self._sock.close(linger=0)
            self._sock = None
        if self._gate is not None:
            self._gate.close()
            self._gate = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def serve(self, stop: asyncio.Event) -> None:
        """Receive and answer until ``stop`` is set."""
        assert self._sock is not None, "bind() first"
        sock = self._sock
        self._outbox = asyncio.Queue()
        sender = asyncio.create_task(self._send_loop(sock))
        # CURVE: the ZAP handler and the count of failed handshakes, on this loop too.
        gate = asyncio.create_task(self._gate.run()) if self._gate is not None else None
        # The same socket without futures, for receiving what poll says is ready: a
        # zmq.asyncio recv costs a future and callbacks per message. Only this task uses it.
        raw: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        pending = Received()
        if self.history is not None:
            self.history.busy = pending.__bool__  # the writer holds back while frames wait
        ticked = checked = 0.0
        try:
            while not stop.is_set():
                if not pending:
                    # Poll, then receive only what is ready: cancelling a pending
                    # recv (asyncio.wait_for on recv_multipart) can consume a
                    # message and then drop it (pyzmq and CPython race).
                    await sock.poll(SCHEDULE_TICK_MS)  # POLLIN
                now = time.monotonic()
                if now - ticked >= SCHEDULE_TICK_MS / 1000.0:
                    ticked = now
                    for reply in self._tick_schedules():
                        self._outbox.put_nowait(reply)
                if now - checked >= GONE_CHECK_S:
                    checked = now
                    self.check_gone()
                pending.fill(raw)
                # Handle frames for a while, then let the rest of the loop run: the sends
                # (replies, plans) and the ZAP handler must not wait for a whole backlog.
                until = time.monotonic() + YIELD_S
                while pending and time.monotonic() < until:
                    self._take(pending.pop())
                await asyncio.sleep(0)
        finally:
            if self.history is not None:
                self.history.busy = None
            for task in (sender, gate):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    def _take(self, parts: list[bytes]) -> None:
        assert self._outbox is not None
        self.counters["frames"] += 1
        if len(parts) != 2:
            self.counters["bad_frames"] += 1
            return
        for reply in self.handle(parts[0], parts[1]):
            self._outbox.put_nowait(reply)

    async def _send_loop(self, sock: zmq.asyncio.Socket) -> None:
        assert self._outbox is not None
        while True:
            ident, data = await self._outbox.get()
            # An agent that went away makes this fail; that is its problem, not ours.
            with contextlib.suppress(zmq.ZMQError):
                await sock.send_multipart([ident, data], flags=zmq.NOBLOCK)

    def post(self, ident: bytes, msg_type: str, body: Mapping[str, Any]) -> None:
        if self._outbox is not None:
            self._outbox.put_nowait((ident, protocol.encode(msg_type, body)))

    # --- protocol logic (no I/O) -----------------------------------------------------

    def handle(self, ident: bytes, data: bytes) -> list[Reply]:
        """Process one frame from ``ident``; return the frames to send back."""
        try:
            # Stacks' location ids stay bytes: most came before, and those that did not are
            # checked before the report changes anything (Session.check_stacks).
            msg_type, body = protocol.decode(data, protocol.MONITOR_ACCEPTS, raw_stacks=True)
        except protocol.DecodeError:
            self.counters["bad_frames"] += 1
            return []
        if msg_type != protocol.CTL and ident != body["agent"].encode():
            # An agent's routing id is its agent id (agent.core sets it): a peer
            # speaking for another agent would take its replies and its session.
            self.counters["bad_frames"] += 1
            return []
        # decode checked the body against its type's schema: it is that type's TypedDict.
        try:
            if msg_type == protocol.REPORT:
                return self._on_report(ident, cast("protocol.Report", body))
            if msg_type == protocol.HELLO:
                return self._on_hello(ident, cast("protocol.Hello", body))
            if msg_type == protocol.BYE:
                self._on_bye(cast("protocol.Bye", body))
                return []
            if msg_type == protocol.ERROR:
                error = cast("protocol.Error", body)
                message = error["message"][: protocol.MAX_ERROR_CHARS]
                entry = self.by_agent.get(error["agent"])
                if entry is not None:
                    entry[0].errors.append(message)
                self._event("agent_error", {"agent": error["agent"], "message": message})
                return []
            if msg_type == protocol.CTL:
                answer = self._on_ctl(ident, cast("protocol.Ctl", body))
                return [(ident, answer)] if answer is not None else []
        except Exception as exc:  # a bug must cost one message, not the monitor
            self.counters["bad_frames"] += 1
            self._event("internal_error", {"message": f"{type(exc).__name__}: {exc}"})
            if msg_type == protocol.CTL:
                # The client waits for an answer: a wrong one beats a timeout that blames the network.
                return [(ident, _ctl_reply(body["id"], error=f"{body['op']}: {type(exc).__name__}: {exc}"))]
        return []

    def _event(self, kind: str, data: dict[str, Any]) -> None:
        if self._on_event is not None:
            self._on_event(kind, data)

    def _on_hello(self, ident: bytes, body: protocol.Hello) -> list[Reply]:
        key: SessionKey = (body["host"], body["pid"], float(body["start_time"]))
        known = self.by_agent.get(body["agent"])
        if known is not None and known[0].key != key:
            # An agent lives and dies in one process: a hello that moves it to
            # another would leave its session connected to nobody. Refused.
            self.counters["bad_frames"] += 1
            return []
        session = self.sessions.get(key)
        if session is None:
            session = self.sessions[key] = Session(key, body, self.frames)
            self._event("session", {"pid": body["pid"], "argv": body["argv"]})
        state = session.add_agent(body)
        self.by_agent[state.agent_id] = (session, state)
        self.routing[state.agent_id] = ident
        if self.history is not None:
            self.history.add_session(session)
        self._event("hello", {"pid": body["pid"], "agent": state.agent_id})
        replies: list[Reply] = []
        # Reports that arrived before the hello (we restarted) go in now.
        for report in self._unstash(ident):
            replies += self._on_report(ident, report, stashed=True)
        return replies

    def _on_report(self, ident: bytes, body: protocol.Report, stashed: bool = False) -> list[Reply]:
        entry = self.by_agent.get(body["agent"])
        try:
            # A malformed report is refused whole, before it changes anything.
            if entry is None:
                for _, _, ids in stacks_as_bytes(body["stacks"]):
                    protocol.stack_ids(ids)
            else:
                checked = entry[0].check_stacks(entry[1], body)
        except protocol.DecodeError:
            self.counters["bad_frames"] += 1
            return []
        if entry is None:
            return self._stash_and_resync(ident, body)
        session, state = entry
        state.connected = True
        self.routing[state.agent_id] = ident
        if body["epoch"] < state.epoch:
            self.counters["dropped_reports"] += 1
            return []
        try:
            session.ingest(state, body, checked)
        except UnknownLocation:
            # We lost this agent's tables (restart while it kept running).
            return self._stash_and_resync(ident, body)
        self.counters["reports"] += 1
        if self.history is not None:
            self.history.add_report(session, session.windows[-1])
        replies: list[Reply] = []
        if not stashed:
            replies += self._schedule(ident, session, state, body)
        if not stashed and ident in self._stash:
            for report in self._unstash(ident):
                replies += self._on_report(ident, report, stashed=True)
        return replies

    def _schedule(self, ident: bytes, session: Session, state: AgentState, body: protocol.Report) -> list[Reply]:
        """DYMON: timings and detailing requests for the agent that just reported."""
        schedule = self.schedules.get(state.agent_id)
        if schedule is None:
            schedule = self.schedules[state.agent_id] = AgentSchedule(budget=state.budget)

        def priorities(name: str) -> float | None:
            analyzer = session.analyzers.get(name)
            try:
                return analyzer.priority() if analyzer is not None else None
            except Exception:  # a broken analyzer keeps its collector's own priority
                return None

        _asks(session, schedule)
        out = schedule.on_report(body, time.monotonic(), priorities)
        return [(ident, protocol.encode(msg_type, msg)) for msg_type, msg in out]

    def _tick_schedules(self) -> list[Reply]:
        """DYMON between reports: detailing requests that have come due since the last report."""
        replies: list[Reply] = []
        now = time.monotonic()
        for agent_id, schedule in list(self.schedules.items()):
            ident = self.routing.get(agent_id)
            entry = self.by_agent.get(agent_id)
            if ident is None or entry is None or not entry[1].connected:
                continue
            try:
                _asks(entry[0], schedule)
                out = schedule.tick(now)
            except Exception as exc:  # a bug must cost one tick, not the monitor
                self._event("internal_error", {"message": f"{type(exc).__name__}: {exc}"})
                continue
            replies += [(ident, protocol.encode(msg_type, msg)) for msg_type, msg in out]
        return replies

    def _stash_and_resync(self, ident: bytes, body: protocol.Report) -> list[Reply]:
        rows = _rows(body)
        queue = self._stash.get(ident)
        if (queue is None and len(self._stash) >= MAX_STASHED_AGENTS) or self._stash_rows + rows > MAX_STASHED_ROWS:
            self.counters["dropped_reports"] += 1
        else:
            if queue is None:
                queue = self._stash[ident] = deque()
            if len(queue) >= MAX_STASHED_REPORTS:
                self._stash_rows -= _rows(queue.popleft())
                self.counters["dropped_reports"] += 1
            queue.append(body)
            self._stash_rows += rows
            self.counters["stashed_reports"] += 1
        now = time.monotonic()
        if now - self._last_resync.get(ident, 0.0) < RESYNC_INTERVAL_S:
            return []
        if len(self._last_resync) >= MAX_STASHED_AGENTS:
            # Peers that stopped sending long ago (or never were agents): forget them.
            self._last_resync = {i: t for i, t in self._last_resync.items() if now - t < RESYNC_INTERVAL_S}
        self._last_resync[ident] = now
        self.counters["resyncs"] += 1
        return [(ident, protocol.encode(protocol.RESYNC, {}))]

    def _unstash(self, ident: bytes) -> list[protocol.Report]:
        reports = list(self._stash.pop(ident, ()))
        self._stash_rows -= sum(_rows(r) for r in reports)
        return reports

    def _on_bye(self, body: protocol.Bye) -> None:
        entry = self.by_agent.get(body["agent"])
        if entry is not None:
            entry[1].connected = False
            self.schedules.pop(entry[1].agent_id, None)
            self._event("bye", {"pid": entry[0].pid, "reason": body.get("reason", "")})

    def check_gone(self) -> list[int]:
        """Mark this host's agents whose process is gone disconnected, as a bye would; their pids.

        A process killed with SIGKILL (or by the OOM killer) sends no bye. Only
        agents on this host are checked, by pid and start time (a reused pid is
        another process); one that reports again is connected again, so a wrong
        call (a pid namespace the monitor cannot see) costs nothing lasting.
        """
        host = socket.gethostname()
        gone: list[int] = []
        for session, state in list(self.by_agent.values()):
            if not state.connected or session.key[0] != host:
                continue
            if same_process(session.key[1], session.key[2]) is not False:  # alive, or cannot tell
                continue
            state.connected = False
            self.schedules.pop(state.agent_id, None)
            gone.append(session.pid)
            self._event("bye", {"pid": session.pid, "reason": "gone: the process ended without a bye (killed?)"})
        return gone

    # --- queries and control from clients ---------------------------------------------

    def session_for(self, pid: int, start_time: float | None = None) -> Session | None:
        """The newest session of ``pid`` on this host (connected ones first), or the one started at ``start_time``."""
        candidates = [s for s in self.sessions.values() if s.pid == pid]
        if start_time is not None:
            candidates = [s for s in candidates if abs(s.key[2] - start_time) < 1e-3]
        candidates.sort(key=lambda s: (s.connected, s.key[2]))
        return candidates[-1] if candidates else None

    def send_to_pid(self, pid: int, msg_type: str, body: Mapping[str, Any]) -> int:
        session = self.session_for(pid)
        if session is None:
            return 0
        return self._send_to_agents(session, msg_type, lambda state: body)

    def _send_to_agents(self, session: Session, msg_type: str, body: Callable[[AgentState], Mapping[str, Any]]) -> int:
        """Post to each connected agent of ``session`` the body made for it; how many were told."""
        n = 0
        for state in session.agents.values():
            ident = self.routing.get(state.agent_id)
            if state.connected and ident is not None:
                self.post(ident, msg_type, body(state))
                n += 1
        return n

    def control(self, pid: int, op: str) -> int:
        """Pause, resume or reset the agents of ``pid``; how many were told.

        A reset goes through the agent: it sends what it has, then a reset
        mark, and the session starts afresh at the mark (Session.reset).
        """
        body = protocol.Configure(reset=True) if op == "reset" else protocol.Configure(paused=op == "pause")
        return self.send_to_pid(pid, protocol.CONFIGURE, body)

    def _configure_budget(self, session: Session, budget: float) -> int:
        """Send a new budget to the session's connected agents, each with the plan for it (DYMON re-plans)."""
        now = time.monotonic()

        def body(state: AgentState) -> protocol.Configure:
            schedule = self.schedules.get(state.agent_id)
            timings = schedule.set_budget(budget, now) if schedule is not None else None
            return (
                protocol.Configure(budget=budget)
                if timings is None
                else protocol.Configure(budget=budget, plan=timings)
            )

        return self._send_to_agents(session, protocol.CONFIGURE, body)

    def sessions_info(self) -> list[dict[str, Any]]:
        from dyper.monitor.views import session_info

        return [session_info(s) for s in self.sessions.values()]

    # --- time windows -------------------------------------------------------------------

    def window_job(
        self, session: Session, spec: WindowSpec, *, view: View = "threads", proflets: bool = False
    ) -> ProfileJob:
        """The profile of ``session`` over ``spec`` from the one builder (:func:`dyper.monitor.profile.profile_job`).

        What reads the session runs now, on the caller's (the receive loop's)
        thread; the returned callable reads only this monitor's history and the
        frame table, so it may run on another thread when it is slow.
        """
        return profile_job(session, spec, view=view, proflets=proflets, history=self.history)

    def window_profile(self, session: Session, spec: WindowSpec) -> Profile:
        """The profile of ``session`` over ``spec``, from memory and, for older reports, history (blocking)."""
        build, _ = self.window_job(session, spec)
        return build()

    def timeline_job(
        self, session: Session, spec: WindowSpec, bucket_s: float
    ) -> tuple[Callable[[], dict[str, Any]], bool]:
        """Samples, reports and spending per ``bucket_s`` over the window: what a time axis shows."""
        start, end = spec.resolve(session.first_report_t, session.last_report_t or None)
        memory: list[ReportMeta] = [
            (w.t, w.window_s, w.samples, w.spent_s, w.budget)
            for w in session.windows
            if (start is None or w.t > start) and (end is None or w.t <= end)
        ]
        oldest = session.oldest_in_memory
        older = (
            self.history is not None
            and oldest > 1
            and (start is None or not session.windows or start < session.windows[0].t)
        )
        history = self.history
        key = session.key

        def build() -> dict[str, Any]:
            rows = (history.reports_meta(key, start, end, before_n=oldest) if older and history else []) + memory
            buckets: dict[int, list[float]] = {}
            origin = start if start is not None else (rows[0][0] - rows[0][1] if rows else 0.0)
            for t, window_s, samples, spent_s, budget in rows:
                b = buckets.setdefault(int((t - origin) // bucket_s), [0, 0, 0.0, 0.0, 0.0])
                b[0] += samples
                b[1] += 1
                b[2] += spent_s
                b[3] += window_s
                b[4] = budget
            return {
                "start": start,
                "end": end,
                "origin": origin,
                "bucket_s": bucket_s,
                # [bucket start, sampling passes, reports, seconds spent, seconds covered, budget]
                "buckets": [[origin + i * bucket_s, *b] for i, b in sorted(buckets.items())],
            }

        return build, older

    def _answer(
        self, ident: bytes, rid: int, work: Callable[[], T], finish: Callable[[T], Any], slow: bool
    ) -> bytes | None:
        """Reply to request ``rid`` with ``finish(work())``.

        Slow work (it reads history) runs on a query thread while the receive
        loop goes on; its reply is posted when done (None is returned now).
        ``finish`` always runs on the loop's thread.
        """
        loop = None
        if slow:
            with contextlib.suppress(RuntimeError):
                loop = asyncio.get_running_loop()
        if loop is None or self._outbox is None:
            try:
                return _ctl_reply(rid, finish(work()))
            except Exception as exc:  # e.g. a damaged history file: an answer, not a crash
                return _ctl_reply(rid, error=f"{type(exc).__name__}: {exc}")
        if self._queries is None:
            self._queries = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="dyper-query")
        future = loop.run_in_executor(self._queries, work)

        def done(f: asyncio.Future[T]) -> None:
            if f.cancelled():
                return
            try:
                data = _ctl_reply(rid, finish(f.result()))
            except Exception as exc:
                data = _ctl_reply(rid, error=f"{type(exc).__name__}: {exc}")
            if self._outbox is not None:
                self._outbox.put_nowait((ident, data))

        future.add_done_callback(done)
        return None

    # --- control requests ---------------------------------------------------------------

    def _on_ctl(self, ident: bytes, body: protocol.Ctl) -> bytes | None:
        from dyper.monitor import views

        rid, op, args = body["id"], body["op"], body.get("args") or {}

        def reply(result: Any = None, error: str | None = None) -> bytes:
            return _ctl_reply(rid, result, error)

        if op == "ping":
            info: dict[str, Any] = {
                "endpoint": self.endpoint,
                "sessions": len(self.sessions),
                "counters": self.counters,
            }
            if self.history is not None:
                info["history"] = {
                    "path": str(self.history.path),
                    "pending": self.history.pending,
                    "counters": dict(self.history.counters),
                    "last_error": self.history.last_error,
                }
            return reply(info)
        if op == "sessions":
            return reply(self.sessions_info())
        if op == "services":
            from dyper.monitor.services import group

            return reply([service.info() for service in group(self.sessions.values())])
        if op == "history":
            if self.history is None:
                return reply(error="this monitor keeps no history (started with --no-history)")
            return self._answer(ident, rid, self.history.stats, lambda stats: stats, True)
        pid = args.get("pid")
        if op in ("profile", "top", "timeline", "detach", "budget", "detail", "report", "triggers", *CONTROLS):
            if not isinstance(pid, int):
                return reply(error=f"{op}: give a pid")
            start_time = args.get("start_time")
            session = self.session_for(pid, float(start_time) if isinstance(start_time, int | float) else None)
            if session is None:
                return reply(error=f"process {pid} is not known to this monitor: attach to it first")
            if op == "triggers":
                return reply(list(session.triggers))
            if op == "report":
                window_s = args.get("window_s")
                if window_s is not None and (not isinstance(window_s, int | float) or window_s <= 0):
                    return reply(error="report: window_s must be a positive number of seconds")
                try:
                    spec = _window_arg(args)
                except ValueError as exc:
                    return reply(error=f"report: {exc}")
                build, slow = self.window_job(session, spec, proflets=True)
                return self._answer(ident, rid, build, report_of, slow)
            if args.get("service") and op in ("profile", "top"):
                return reply(self._service_answer(op, session, args))
            try:
                spec = _window_arg(args)
            except ValueError as exc:
                return reply(error=f"{op}: {exc}")
            if args.get("view") == "tasks" and op in ("profile", "top"):
                try:
                    tasks = build_profile(session, spec, view="tasks")
                except ValueError as exc:
                    return reply(error=str(exc))
                if op == "profile":
                    return reply(tasks.to_json())
                return reply(views.top_view(session, profile=tasks, charge_libraries=bool(args.get("libraries"))))
            if op == "profile":
                build, slow = self.window_job(session, spec)
                return self._answer(ident, rid, build, lambda p: p.to_json(), slow)
            if op == "timeline":
                bucket = args.get("bucket_s", 10.0)
                if not isinstance(bucket, int | float) or not bucket > 0:
                    return reply(error="timeline: bucket_s must be a positive number of seconds")
                tl, slow = self.timeline_job(session, spec, float(bucket))
                return self._answer(ident, rid, tl, lambda r: r, slow)
            if op == "top":
                libraries = bool(args.get("libraries"))
                build, slow = self.window_job(session, spec)
                return self._answer(
                    ident,
                    rid,
                    build,
                    lambda p: views.top_view(session, profile=p, charge_libraries=libraries),
                    slow,
                )
            if op == "detach":
                return reply({"detached": self.send_to_pid(pid, protocol.DETACH, {})})
            if op in CONTROLS:
                return reply({"configured": self.control(pid, op)})
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
            if not isinstance(budget, int | float) or not protocol.MIN_BUDGET <= budget <= protocol.MAX_BUDGET:
                # What the agent takes (agent.protocol): anything else it would count as a bad message.
                return reply(error=f"budget: give a fraction from {protocol.MIN_BUDGET:g} to {protocol.MAX_BUDGET:g}")
            return reply({"configured": self._configure_budget(session, float(budget))})
        return reply(error=f"unknown operation {op!r}")

    def _service_answer(self, op: str, session: Session, args: dict[str, Any]) -> dict[str, Any]:
        """``profile``/``top`` of the whole service ``session`` belongs to (whole run, or ``window_s``, from memory)."""
        from dyper.monitor.services import service_of
        from dyper.monitor.views import service_top_view

        window_s = args.get("window_s")
        seconds = float(window_s) if isinstance(window_s, int | float) and window_s > 0 else None
        service = service_of(self.sessions.values(), session)
        if op == "profile":
            return build_profile(service, WindowSpec.last(seconds) if seconds else None).to_json()
        return service_top_view(service, seconds, charge_libraries=bool(args.get("libraries")))


class Received:
    """Frames received and not handled yet, control requests first.

    A ``dyper top`` or ``ping`` waits behind the frames already taken, not
    behind every frame queued: under load a query is answered in about the
    time a few reports take, not the whole backlog.
    """

    def __init__(self) -> None:
        self.frames: deque[list[bytes]] = deque()
        self.bytes = 0

    def __bool__(self) -> bool:
        return bool(self.frames)

    def __len__(self) -> int:
        return len(self.frames)

    def fill(self, sock: zmq.Socket[bytes]) -> None:
        """Receive what is ready, up to RECEIVE_AHEAD frames and RECEIVE_AHEAD_BYTES held."""
        control: list[list[bytes]] = []
        while len(self.frames) + len(control) < RECEIVE_AHEAD and self.bytes < RECEIVE_AHEAD_BYTES:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self.bytes += sum(map(len, parts))
            if parts[-1].startswith(_CTL_PREFIX):
                control.append(parts)
            else:
                self.frames.append(parts)
        self.frames.extendleft(reversed(control))

    def pop(self) -> list[bytes]:
        parts = self.frames.popleft()
        self.bytes -= sum(map(len, parts))
        return parts


def _rows(report: protocol.Report) -> int:
    """What a report holds, in table rows and stack entries (what its decoded size grows with)."""
    stacks = report["stacks"]
    return len(report["strings"]) + len(report["locs"]) + len(stacks) + sum(len(s[2]) for s in stacks)


def _ctl_reply(rid: int, result: Any = None, error: str | None = None) -> bytes:
    out: protocol.CtlReply = {"id": rid, "ok": error is None, "result": result}
    if error is not None:
        out["error"] = error
    return protocol.encode(protocol.CTL_REPLY, out)


def _window_arg(args: dict[str, Any]) -> WindowSpec:
    """A request's window: ``window`` ({start, end}, see WindowSpec.to_json), or ``window_s`` (the last N s)."""
    if args.get("window") is not None:
        return WindowSpec.from_json(args["window"])
    seconds = args.get("window_s")
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return WindowSpec.last(float(seconds))
    return WindowSpec()


def _asks(session: Session, schedule: AgentSchedule) -> None:
    """The bursts the session's analyses ask for ahead of the plan (Analyzer.wants_detail), queued first."""
    now = time.time()
    for name, analyzer in session.analyzers.items():
        try:
            if analyzer.wants_detail(now):
                schedule.ask(name)
        except Exception:  # a broken analyzer asks for nothing
            pass
