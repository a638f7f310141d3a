"""The dashboard's HTTP side: aiohttp on the monitor's event loop.

Why in the monitor's loop rather than a thread or a process of its own: the
page reads sessions, which the receive loop changes; on the same loop every
handler sees a consistent session between two awaits, with no lock and no
copy. Work that takes long (history reads, the diagnosis, the search's call
trees) runs on worker threads on data that is no longer changed.

Live updates go to the page as server-sent events (``/api/events``): the
process list every few seconds, and for the process on screen its summary
(status lights, budget and spending, overhead over time, the proflets'
tables) after each report and the diagnosis every few seconds. Everything
else is a JSON request made when the user asks.

Security: the dashboard can attach to and detach from processes, so
anything off loopback needs a token (``--http-token``, or one generated and
printed in the URL). Without a token only loopback Host headers are
answered (no DNS rebinding), and requests that change something must be
JSON from the page's own origin (no cross-site form posts).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import linecache
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

from aiohttp import web

from dyper.agent import protocol
from dyper.monitor.model.profile import Profile
from dyper.monitor.profile import build_profile
from dyper.monitor.report import report_of
from dyper.monitor.server import CONTROLS, Monitor
from dyper.monitor.session import Session
from dyper.monitor.views import samples_per_s, session_info
from dyper.monitor.web import data
from dyper.monitor.windows import WindowSpec

#: the window the page starts with: the last minute
DEFAULT_WINDOW = "-60s:"
PROCESSES_EVERY_S = 3.0
DIAGNOSIS_EVERY_S = 5.0
#: Marks the overhead plot draws (the newest).
MARKS_PLOTTED = 100
#: overhead-over-time buckets across a session at most
TIMELINE_BUCKETS = 120
#: search sessions kept (one per page that searched, the oldest forgotten first)
MAX_SEARCHES = 32
ATTACH_WAIT_S = 10.0
STATIC_FILES = {
    "app.js": "application/javascript",
    "flame.js": "application/javascript",
    "app.css": "text/css",
}
TOKEN_COOKIE = "dyper_token"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_http(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``PORT`` (host 127.0.0.1); ``[::1]:PORT`` for IPv6. Raises ValueError."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"--http {text!r}: give HOST:PORT, e.g. 127.0.0.1:8341") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"--http {text!r}: port {number} is out of range")
    return host, number


class BadRequest(Exception):
    """A request the page should not have made: its message is shown to the user."""


@dataclass
class _Search:
    """One page's bottleneck search: the REPL's session, one command at a time."""

    session: Any  # monitor.search.repl.SearchSession
    described: dict[str, Any]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Dashboard:
    """The web UI of ``monitor``, served on ``host:port`` from the running event loop."""

    def __init__(self, monitor: Monitor, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        if not is_loopback(host) and not token:
            raise ValueError(
                f"the dashboard on {host} (not loopback) needs a token: give --http-token or let dyper make one"
            )
        self.monitor = monitor
        self.host = host
        self.port = port
        self.token = token
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()
        self._searches: OrderedDict[str, _Search] = OrderedDict()
        #: (session key, window text) -> (reports when made, diagnosis JSON)
        self._diagnoses: dict[tuple[Any, str], tuple[int, dict[str, Any]]] = {}
        self._allowed_hosts: set[str] = set()
        #: the proflets of the processes it attaches to (``dyper monitor --proflets``); None: the agent's default
        self.proflets: tuple[str, ...] | None = None

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> str:
        """Listen; return the URL to open (with the token, if any)."""
        app = web.Application(middlewares=[self._guard], client_max_size=1024 * 1024)
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/events", self._events)
        app.router.add_get("/api/processes", self._processes_handler)
        app.router.add_get("/api/flame", self._flame)
        app.router.add_get("/api/summary", self._summary_handler)
        app.router.add_post("/api/control", self._control)
        app.router.add_post("/api/budget", self._budget)
        app.router.add_post("/api/pause", self._pause)
        app.router.add_post("/api/search/new", self._search_new)
        app.router.add_post("/api/search/run", self._search_run)
        app.router.add_post("/api/diagnose", self._diagnose)
        # A short shutdown: the event streams end as soon as _closing is set.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise OSError(f"the dashboard cannot listen on {self.host}:{self.port}: {exc.strerror}") from None
        self.port = int(self._runner.addresses[0][1])
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self._allowed_hosts = {f"{shown}:{self.port}", f"localhost:{self.port}", f"127.0.0.1:{self.port}"}
        self._allowed_hosts |= {f"[::1]:{self.port}"}
        return self.url

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        if self.host in ("0.0.0.0", "::"):
            import socket

            shown = socket.gethostname()
        return f"http://{shown}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- guard: token, host, origin ----------------------------------------------------

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        from_query = False
        if self.token:
            given = request.headers.get("X-Dyper-Token") or request.cookies.get(TOKEN_COOKIE)
            if not given and request.query.get("token"):
                given, from_query = request.query["token"], True
            if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
                raise web.HTTPForbidden(text="dyper: open the URL the monitor printed (it carries the token)")
        elif request.host not in self._allowed_hosts:
            # A page on another site that resolved its name to 127.0.0.1 (DNS rebinding).
            raise web.HTTPMisdirectedRequest(text="dyper: this dashboard answers on loopback only")
        if request.method == "POST":
            origin = request.headers.get("Origin")
            if request.content_type != "application/json" or (
                origin is not None and origin != f"{request.scheme}://{request.host}"
            ):
                raise web.HTTPForbidden(text="dyper: requests that change something come from the dashboard only")
        try:
            response = await handler(request)
        except BadRequest as exc:
            response = web.json_response({"ok": False, "error": str(exc)}, status=400)
        if from_query and self.token and not response.prepared:
            response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="Strict")
        if not response.prepared:
            response.headers.setdefault("X-Content-Type-Options", "nosniff")
            response.headers.setdefault("Referrer-Policy", "no-referrer")
            response.headers.setdefault("X-Frame-Options", "DENY")
            response.headers.setdefault(
                "Content-Security-Policy",
                "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
            )
        return response

    # --- the page -----------------------------------------------------------------------

    async def _index(self, request: web.Request) -> web.Response:
        page = resources.files("dyper.monitor.web").joinpath("static/index.html").read_text(encoding="utf-8")
        return web.Response(text=page, content_type="text/html", headers={"Cache-Control": "no-cache"})

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        kind = STATIC_FILES.get(name)
        if kind is None:
            raise web.HTTPNotFound()
        body = resources.files("dyper.monitor.web").joinpath(f"static/{name}").read_text(encoding="utf-8")
        return web.Response(text=body, content_type=kind, headers={"Cache-Control": "no-cache"})

    # --- reading requests ---------------------------------------------------------------

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("the request is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the request is not a JSON object")
        return body

    def _session(self, args: Any) -> Session:
        try:
            pid = int(args.get("pid"))
        except (TypeError, ValueError):
            raise BadRequest("give a pid") from None
        start = args.get("start_time")
        start_time = float(start) if start not in (None, "") else None
        session = self.monitor.session_for(pid, start_time)
        if session is None:
            raise BadRequest(f"process {pid} is not known to this monitor: attach to it first")
        return session

    @staticmethod
    def _window(text: Any) -> WindowSpec:
        if text is None or str(text).strip() in ("", "whole"):
            return WindowSpec()
        try:
            return WindowSpec.parse(str(text))
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    async def _profile(self, session: Session, spec: WindowSpec, *, proflets: bool = False) -> Profile:
        build, slow = self.monitor.window_job(session, spec, proflets=proflets)
        if slow:  # it reads history: off the loop
            return await asyncio.get_running_loop().run_in_executor(None, build)
        return build()

    # --- views ----------------------------------------------------------------------------

    async def processes(self) -> dict[str, Any]:
        """Figure 3: the Python processes on this host, and the sessions of ended ones."""
        from dyper.monitor.commands.ps import python_processes

        sessions = self.monitor.sessions_info()
        monitored = {s["pid"] for s in sessions if s["connected"]}

        def scan() -> dict[str, Any]:
            return data.process_rows(python_processes(monitored), sessions)

        rows = await asyncio.to_thread(scan)
        rows["endpoint"] = self.monitor.endpoint
        return rows

    async def summary(self, session: Session, window_text: str) -> dict[str, Any]:
        """Figures 4 and 6: the process, its lights, budget and spending, the proflets' tables over the window."""
        spec = self._window(window_text)
        # The same builder and report as `dyper report --json` for this window: the same lights and rows.
        profile = await self._profile(session, spec, proflets=True)
        report = report_of(profile)
        info = session_info(session)
        timeline = await self._timeline(session)
        process = profile.process
        from dyper.monitor.services import service_of

        return {
            "session": info,
            # the service this process belongs to: the call tree can merge its processes
            "service": service_of(self.monitor.sessions.values(), session).info(),
            "samples_per_s": samples_per_s(session),
            # [wall time, name, kind]: agent.mark, pause, resume, reset, boost (the overhead plot shows them)
            "marks": [list(m) for m in list(session.marks)[-MARKS_PLOTTED:]],
            # trigger events (agent.triggers), each with its window and the normal one before it
            "triggers": list(session.triggers)[-MARKS_PLOTTED:],
            "window": {
                "text": window_text,
                "description": spec.describe(),
                "seconds": process.get("window_s") or process.get("duration_s"),
                "samples": process.get("samples", 0),
                "cpu_samples": profile.total("cpu"),
                "wall_samples": profile.total("wall"),
            },
            "status": report.get("status", {}),
            "proflets": report.get("proflets", {}),
            # how the page draws each proflet's tables: its render module's description
            "tables": data.table_descriptions(report.get("proflets", {})),
            # proflets' own noteworthy lines (leak suspects, GIL contention...) and the ones switched off
            "findings": report.get("findings", []),
            "off": report.get("off", {}),
            "overhead": timeline,
            "bursts": len(session.bursts),
            # the tasks proflet over the window: event loops, handlers, blocks (None: no asyncio seen)
            "asyncio": report["proflets"].get("tasks") or None,
        }

    async def _timeline(self, session: Session) -> dict[str, Any]:
        span = (session.last_report_t or 0.0) - (session.first_report_t or 0.0)
        bucket = max(2.0, math.ceil(span / TIMELINE_BUCKETS))
        build, slow = self.monitor.timeline_job(session, WindowSpec(), bucket)
        timeline = await asyncio.get_running_loop().run_in_executor(None, build) if slow else build()
        return {"bucket_s": bucket, "points": data.overhead_points(timeline)}

    async def diagnosis(self, session: Session, window_text: str, threshold: float = 0.05) -> dict[str, Any]:
        """The automated diagnosis (ranked bottlenecks and the search history) of the window."""
        from dyper.monitor.search.diagnose import diagnose

        # With the proflets' sections: the loop blocks and GC pauses are evidence, as from a saved profile.
        profile = await self._profile(session, self._window(window_text), proflets=True)

        def run() -> dict[str, Any]:
            return diagnose(profile, threshold, line_text=linecache.getline).to_json()

        result = await asyncio.to_thread(run)
        result["findings"] = data.findings(result, session_info(session), profile.library_predicate())
        return result

    # --- handlers ---------------------------------------------------------------------------

    async def _processes_handler(self, request: web.Request) -> web.Response:
        return _json(await self.processes())

    async def _summary_handler(self, request: web.Request) -> web.Response:
        session = self._session(request.query)
        return _json(await self.summary(session, request.query.get("window", DEFAULT_WINDOW)))

    async def _events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: ``processes``, and for ``pid``: ``summary`` and ``diagnosis``."""
        pid_given = request.query.get("pid")
        session = self._session(request.query) if pid_given else None
        window_text = request.query.get("window", DEFAULT_WINDOW)
        self._window(window_text)  # a bad window is a 400 before the stream starts
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        await response.prepare(request)
        last_processes = -math.inf
        last_diagnosis = -math.inf
        seen: tuple[int, bool] | None = None
        diagnosed_at = -1
        try:
            while not self._closing.is_set():
                now = time.monotonic()
                if now - last_processes >= PROCESSES_EVERY_S:
                    last_processes = now
                    await _send(response, "processes", await self.processes())
                if session is not None:
                    state = (session.reports, session.connected)
                    if state != seen:
                        seen = state
                        await _send(response, "summary", await self.summary(session, window_text))
                    if now - last_diagnosis >= DIAGNOSIS_EVERY_S and session.reports != diagnosed_at:
                        last_diagnosis, diagnosed_at = now, session.reports
                        await _send(response, "diagnosis", await self.diagnosis(session, window_text))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), timeout=0.5)
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            pass  # the page went away
        return response

    async def _flame(self, request: web.Request) -> web.Response:
        q = request.query
        session = self._session(q)
        metric = q.get("metric", "cpu")
        if metric not in ("cpu", "wall"):
            raise BadRequest("metric is cpu or wall")
        if q.get("service") == "1":
            # the whole service (a pre-fork master and its workers), merged, from memory
            from dyper.monitor.services import service_of

            service = service_of(self.monitor.sessions.values(), session)
            window = self._window(q.get("window", DEFAULT_WINDOW))
            profile = build_profile(service, window)
            base = build_profile(service, self._window(q["base"])) if q.get("base") else None
        else:
            profile = await self._profile(session, self._window(q.get("window", DEFAULT_WINDOW)))
            base = None
            if q.get("base"):
                base = await self._profile(session, self._window(q["base"]))
        libraries = q.get("libraries") == "1"
        result = await asyncio.to_thread(data.flame_data, profile, metric, base, charge_libraries=libraries)
        return _json(result)

    async def _control(self, request: web.Request) -> web.Response:
        """Figure 3's switches: attach, detach, monitoring on and off."""
        from dyper.monitor.attach import AttachError, attach, detach
        from dyper.monitor.commands.ps import has_agent

        body = await self._body(request)
        try:
            pid = int(body["pid"])
        except (KeyError, TypeError, ValueError):
            raise BadRequest("give a pid") from None
        action = body.get("action")
        budget = _budget_arg(body.get("budget", 0.01))
        monitored = self._monitored(pid)
        try:
            if action in ("attach", "monitor"):
                if monitored:
                    return _json({"ok": True, "message": f"{pid} is already monitored here"})
                if await asyncio.to_thread(has_agent, pid):
                    # An agent that streams elsewhere (another monitor, `dyper run`'s own):
                    # it cannot be re-pointed, so it goes and one that streams here comes.
                    await asyncio.to_thread(detach, pid)
                await asyncio.to_thread(attach, pid, self.monitor.local_endpoint, budget, proflets=self.proflets)
                if not await self._wait(lambda: self._monitored(pid), ATTACH_WAIT_S):
                    raise BadRequest(f"the agent started in {pid} but has not reported to this monitor yet")
                return _json({"ok": True, "message": f"attached to {pid} at {100 * budget:g}% budget"})
            if action in ("detach", "unmonitor"):
                if monitored:
                    self.monitor.send_to_pid(pid, protocol.DETACH, {})
                    if await self._wait(lambda: not self._monitored(pid), 3.0):
                        return _json({"ok": True, "message": f"detached from {pid}"})
                # Not ours, or it did not answer: stop it from inside, as `dyper detach` does.
                if not await asyncio.to_thread(detach, pid):
                    raise BadRequest(f"no dyper agent is running in process {pid}")
                return _json({"ok": True, "message": f"detached from {pid}"})
        except AttachError as exc:
            raise BadRequest(str(exc)) from None
        raise BadRequest("action is attach, detach, monitor or unmonitor")

    def _monitored(self, pid: int) -> bool:
        return any(s.pid == pid and s.connected for s in self.monitor.sessions.values())

    @staticmethod
    async def _wait(predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    async def _budget(self, request: web.Request) -> web.Response:
        """Change the budget live: through the agent's connection, as ``dyper budget PID 5%`` does."""
        body = await self._body(request)
        session = self._session(body)
        budget = _budget_arg(body.get("budget"))
        configured = self.monitor.send_to_pid(session.pid, protocol.CONFIGURE, {"budget": budget})
        if not configured:
            from dyper.monitor.attach import AttachError, set_budget

            try:
                if not await asyncio.to_thread(set_budget, session.pid, budget):
                    raise BadRequest(f"no dyper agent is running in process {session.pid}")
            except AttachError as exc:
                raise BadRequest(str(exc)) from None
        return _json({"ok": True, "budget": budget, "message": f"budget of {session.pid} set to {100 * budget:g}%"})

    async def _pause(self, request: web.Request) -> web.Response:
        """Pause, resume or reset: through the agent's connection, as ``dyper pause PID`` does."""
        body = await self._body(request)
        session = self._session(body)
        action = body.get("action")
        if action not in CONTROLS:
            raise BadRequest("action is pause, resume or reset")
        if not self.monitor.control(session.pid, action):
            from dyper.monitor.attach import AttachError, control

            try:
                if not await asyncio.to_thread(control, session.pid, action):
                    raise BadRequest(f"no dyper agent is running in process {session.pid}")
            except AttachError as exc:
                raise BadRequest(str(exc)) from None
        done = {"pause": "paused", "resume": "resumed", "reset": "reset the statistics of"}[action]
        return _json({"ok": True, "message": f"{done} {session.pid}"})

    async def _search_new(self, request: web.Request) -> web.Response:
        """A bottleneck search over a window (or the window minus a base window: the comparative profile)."""
        from dyper.monitor.search.calltree import CallTreeProfile
        from dyper.monitor.search.comparative import ComparativeProfile
        from dyper.monitor.search.repl import SearchSession

        body = await self._body(request)
        session = self._session(body)
        metric = body.get("metric", "cpu")
        if metric not in ("cpu", "wall"):
            raise BadRequest("metric is cpu or wall")
        key: Literal["frame", "function"] = "frame" if body.get("lines") else "function"
        window = str(body.get("window") or "")
        profile = await self._profile(session, self._window(window))
        base = await self._profile(session, self._window(body["base"])) if body.get("base") else None

        def build() -> Any:
            tree = CallTreeProfile.from_profile(profile, metric, frame_key=key)
            if base is None:
                return tree
            # Normalised by total samples unless asked for raw counts: windows seldom have as many samples.
            b = CallTreeProfile.from_profile(base, metric, frame_key=key)
            return ComparativeProfile(tree, b, normalize=not body.get("raw"))

        tree = await asyncio.to_thread(build)
        described = {"source": f"pid {session.pid}", "window": window or "whole", "metric": metric}
        if base is not None:
            described["compare"] = body["base"]
            described["normalization"] = tree.normalization
        search = _Search(SearchSession(tree, described), described)
        sid = secrets.token_hex(8)
        self._searches[sid] = search
        while len(self._searches) > MAX_SEARCHES:
            self._searches.popitem(last=False)
        return _json({"ok": True, "id": sid, "total": tree.total(), "described": described})

    async def _search_run(self, request: web.Request) -> web.Response:
        """One REPL command (``monitor/search/repl.py``), its JSON result as ``dyper bottlenecks --json`` gives it."""
        body = await self._body(request)
        search = self._searches.get(str(body.get("id")))
        if search is None:
            raise BadRequest("this search is gone (the monitor restarted, or too many pages searched): start again")
        self._searches.move_to_end(str(body.get("id")))
        command = str(body.get("command") or "").strip()
        word = command.split(maxsplit=1)[0].lower() if command else ""
        if word in ("save", "load"):
            # They name files on the monitor's host: not something a web page may do.
            return _json(
                {"command": command, "ok": False, "error": "save and load work in `dyper bottlenecks`, not here"}
            )
        async with search.lock:
            result = await asyncio.to_thread(search.session.execute, command)
        return _json(result)

    async def _diagnose(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        session = self._session(body)
        try:
            threshold = float(body.get("threshold", 5.0)) / 100.0
        except (TypeError, ValueError):
            raise BadRequest("threshold is a percentage") from None
        if not 0 < threshold < 1:
            raise BadRequest("threshold is a percentage between 0 and 100")
        return _json(await self.diagnosis(session, str(body.get("window") or ""), threshold))


def _budget_arg(value: Any) -> float:
    try:
        return protocol.parse_budget(value if isinstance(value, str) else float(value))
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"budget: {exc}") from None


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"), default=str)
    except ValueError:
        return json.dumps(_clean(value), allow_nan=False, separators=(",", ":"), default=str)


def _json(value: Any) -> web.Response:
    return web.Response(text=_dumps(value), content_type="application/json")


async def _send(response: web.StreamResponse, event: str, value: Any) -> None:
    await response.write(f"event: {event}\ndata: {_dumps(value)}\n\n".encode())
