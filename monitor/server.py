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
import concurrent.futures
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import zmq
import zmq.asyncio

from agent import protocol
from monitor.profile import Profile, process_info, session_paths
from monitor.scheduler import AgentSchedule
from monitor.session import AgentState, FrameTable, Session, SessionKey, Slice, UnknownLocation
from monitor.windows import WindowSpec

if TYPE_CHECKING:
    from monitor.history import History, ReportMeta

T = TypeVar("T")

#: Reports kept per unknown agent while we wait for its hello and tables.
MAX_STASHED_REPORTS = 4
MAX_STASHED_AGENTS = 1000
RESYNC_INTERVAL_S = 1.0
#: How often the detailing queues are looked at between reports: bursts of a
#: few hundred ms at a high budget are due a few times a second.
SCHEDULE_TICK_MS = 100

Reply = tuple[bytes, bytes]


class Monitor:
    """DYMON. With ``history``, everything received is kept there, and what it kept is loaded first."""

    def __init__(
        self,
        endpoint: str,
        *,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        history: History | None = None,
    ) -> None:
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
        if self._queries is not None:
            self._queries.shutdown(wait=True, cancel_futures=True)
            self._queries = None
        if self.history is not None:
            self.history.close()
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
                ready = await sock.poll(SCHEDULE_TICK_MS)  # POLLIN
                for reply in self._tick_schedules():
                    self._outbox.put_nowait(reply)
                if not ready:
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
                answer = self._on_ctl(ident, body)
                return [(ident, answer)] if answer is not None else []
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
        if self.history is not None:
            self.history.add_session(session)
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
        if self.history is not None:
            self.history.add_report(session, session.windows[-1])
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
            analyzer = session.analyzers.get(name)
            try:
                return analyzer.priority() if analyzer is not None else None
            except Exception:  # a broken analyzer keeps its collector's own priority
                return None

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
                out = schedule.tick(now)
            except Exception as exc:  # a bug must cost one tick, not the monitor
                self._event("internal_error", {"message": f"{type(exc).__name__}: {exc}"})
                continue
            replies += [(ident, protocol.encode(msg_type, msg)) for msg_type, msg in out]
        return replies

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

    def session_for(self, pid: int, start_time: float | None = None) -> Session | None:
        """The newest session of ``pid`` on this host (connected ones first), or the one started at ``start_time``."""
        candidates = [s for s in self.sessions.values() if s.pid == pid]
        if start_time is not None:
            candidates = [s for s in candidates if abs(s.key[2] - start_time) < 1e-3]
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

    # --- time windows -------------------------------------------------------------------

    def window_job(self, session: Session, spec: WindowSpec) -> tuple[Callable[[], Profile], bool]:
        """The profile of ``session`` over ``spec``, as work to run, and whether that work reads history.

        What reads the session runs now, on the caller's (the receive loop's)
        thread; the returned callable only reads history and the frame table,
        so it may run on another thread. Whole runs come from the session's
        running totals, which already hold what history restored.
        """
        process = process_info(session)
        paths = session_paths(session)
        threads = dict(session.threads)
        table = session.frames.frames
        if spec.whole:
            # Not slow: runs at once, on this thread, so the live totals need no copy.
            counts = session.counts
            process.update(duration_s=session.duration_s(), samples=session.samples, window_s=None)
            return (lambda: Profile.from_counts(table, counts, threads, process, paths)), False
        first_t = session.first_report_t
        last_t = session.last_report_t or None
        start, end = spec.resolve(first_t, last_t)
        memory = session.slice(start, end)
        oldest = session.oldest_in_memory
        older = (
            self.history is not None
            and oldest > 1
            and (start is None or not session.windows or start < session.windows[0].t)
        )
        history = self.history
        key = session.key

        def build() -> Profile:
            got = Slice()
            if older and history is not None:
                got = history.slice(key, start, end, before_n=oldest)
            got.merge(memory)
            info = dict(process)
            info.update(
                duration_s=got.seconds,
                samples=got.samples,
                window_s=got.seconds,
                window={
                    "spec": spec.to_json(),
                    "description": spec.describe(),
                    "start": start,
                    "end": end,
                    "reports": got.reports,
                    "first_report_t": got.first_t,
                    "last_report_t": got.last_t,
                },
            )
            return Profile.from_counts(table, got.counts, threads, info, paths)

        return build, older

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

    def _on_ctl(self, ident: bytes, body: dict[str, Any]) -> bytes | None:
        from monitor import views

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
        if op == "history":
            if self.history is None:
                return reply(error="this monitor keeps no history (started with --no-history)")
            return self._answer(ident, rid, self.history.stats, lambda stats: stats, True)
        pid = args.get("pid")
        if op in ("profile", "top", "timeline", "detach", "budget", "detail", "report"):
            if not isinstance(pid, int):
                return reply(error=f"{op}: give a pid")
            start_time = args.get("start_time")
            session = self.session_for(pid, float(start_time) if isinstance(start_time, int | float) else None)
            if session is None:
                return reply(error=f"process {pid} is not known to this monitor: attach to it first")
            if op == "report":
                from monitor.report import build_report

                window_s = args.get("window_s")
                if window_s is not None and (not isinstance(window_s, int | float) or window_s <= 0):
                    return reply(error="report: window_s must be a positive number of seconds")
                return reply(build_report(session, float(window_s) if window_s is not None else None))
            try:
                spec = _window_arg(args)
            except ValueError as exc:
                return reply(error=f"{op}: {exc}")
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


def _ctl_reply(rid: int, result: Any = None, error: str | None = None) -> bytes:
    out: dict[str, Any] = {"id": rid, "ok": error is None, "result": result}
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
