"""Sessions: what the monitor knows about each profiled process.

One session per process, keyed by (host, pid, process start time), so a
re-attach to the same process continues its session and a new process that
happens to reuse a pid does not. Each agent incarnation inside a process
(attach, detach, attach again; the child after a fork is its own process)
has its own string tables, mapped here onto the monitor's global frame table.

Ingest is cheap and incremental: a report adds its counts to the session's
whole-run table and is kept, bounded by age, for time windows ("now").
Trees are built only when someone looks (see :mod:`monitor.profile`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agent.protocol import LOC_AGENT, LOC_BLOCKING, LOC_IO, LOC_LOCK, LOC_SLEEP
from proflets.base import Analyzer, ReportView

#: (host, pid, process start time)
SessionKey = tuple[str, int, float]
#: index into FrameTable.frames
FrameId = int
#: (thread ident, frame ids root first)
StackKey = tuple[int, tuple[FrameId, ...]]

#: How long per-report deltas are kept for "now" windows.
WINDOW_RETENTION_S = 600.0


@dataclass(frozen=True)
class Frame:
    """One code location: a line inside a function."""

    file: str
    name: str  # qualified name
    firstline: int
    line: int

    @property
    def function(self) -> tuple[str, str, int]:
        return (self.file, self.name, self.firstline)

    def label(self) -> str:
        return f"{self.name} ({self.file}:{self.line})"


class FrameTable:
    """Interns frames monitor-wide, so profiles of many processes merge by id."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self._ids: dict[Frame, FrameId] = {}

    def intern(self, frame: Frame) -> FrameId:
        fid = self._ids.get(frame)
        if fid is None:
            fid = len(self.frames)
            self._ids[frame] = fid
            self.frames.append(frame)
        return fid


class UnknownLocation(KeyError):
    """A report refers to a location the monitor never received (tables lost)."""


@dataclass
class AgentState:
    """One agent incarnation's tables and status."""

    agent_id: str
    epoch: int = 0
    strings: dict[int, str] = field(default_factory=dict)
    #: agent location id -> (global frame id, flags, agent.protocol LOC_*); None for dyper's own code
    locs: dict[int, tuple[FrameId, int] | None] = field(default_factory=dict)
    connected: bool = True
    last_seen: float = 0.0
    last_seq: int = -1
    budget: float = 0.0
    spent_s: float = 0.0
    elapsed_s: float = 0.0
    #: one-time start-up CPU (loading the proflets), outside the budget's ledger
    startup_s: float = 0.0
    delays: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    attach_token: str | None = None
    mode: str = "local"
    #: per proflet: calibrated costs as last reported, or {"off": reason}
    proflets: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Window:
    """Counts of one report, kept for time-window views (never changed once made)."""

    t: float
    samples: int
    counts: dict[StackKey, list[int]]
    #: the report's number in its session, from 1 (history splits memory from disk by it)
    n: int = 0
    window_s: float = 0.0
    #: seconds the agent spent in the window, all categories
    spent_s: float = 0.0
    budget: float = 0.0


@dataclass
class Slice:
    """Counts of some reports of one session, and which reports they were."""

    counts: dict[StackKey, list[int]] = field(default_factory=dict)
    samples: int = 0  # sampling passes
    reports: int = 0
    seconds: float = 0.0  # the reports' lengths, summed
    first_t: float | None = None  # end time of the earliest report in it
    last_t: float | None = None

    def add_report(self, t: float, window_s: float, samples: int) -> None:
        self.samples += samples
        self.reports += 1
        self.seconds += window_s
        self.first_t = t if self.first_t is None else min(self.first_t, t)
        self.last_t = t if self.last_t is None else max(self.last_t, t)

    def merge(self, other: Slice) -> None:
        merge_counts(self.counts, other.counts)
        self.samples += other.samples
        self.reports += other.reports
        self.seconds += other.seconds
        for t in (other.first_t, other.last_t):
            if t is not None:
                self.first_t = t if self.first_t is None else min(self.first_t, t)
                self.last_t = t if self.last_t is None else max(self.last_t, t)


class Session:
    """A profiled process as seen by the monitor."""

    def __init__(self, key: SessionKey, hello: dict[str, Any], frames: FrameTable) -> None:
        self.key = key
        self.hello = hello
        self.frames = frames
        self.first_seen = time.time()
        #: end times of the first and latest reports (the agents' clocks)
        self.first_report_t: float | None = None
        self.agents: dict[str, AgentState] = {}
        #: whole run: stack -> [wall samples, cpu samples]
        self.counts: dict[StackKey, list[int]] = {}
        self.threads: dict[int, str] = {}
        self.samples = 0
        self.windows: deque[Window] = deque()
        self.errors: deque[str] = deque(maxlen=50)
        self.reports = 0
        self.last_report_t = 0.0
        #: overhead spent vs budget over time: (t, budget, spent fraction)
        self.overhead_history: deque[tuple[float, float, float]] = deque(maxlen=3600)
        #: seconds spent by category over the whole run: sample, report, detail
        self.costs: dict[str, float] = {"sample": 0.0, "report": 0.0, "detail": 0.0}
        #: recent windows' (t, window_s, {category: seconds}), for "spent now"
        self.recent_costs: deque[tuple[float, float, dict[str, float]]] = deque(maxlen=60)
        #: detailing bursts as reported (the newest few hundred)
        self.bursts: deque[dict[str, Any]] = deque(maxlen=500)
        #: cpu detailing: function (file, qualname, first line) -> [calls counted, seconds counted]
        self.calls: dict[tuple[str, str, int], list[float]] = {}
        #: the monitor halves of the proflets, by name
        self.analyzers: dict[str, Analyzer] = make_analyzers(self)

    @property
    def pid(self) -> int:
        return self.key[1]

    @property
    def connected(self) -> bool:
        return any(a.connected for a in self.agents.values())

    def budget(self) -> float:
        live = [a for a in self.agents.values() if a.connected] or list(self.agents.values())
        return live[-1].budget if live else float(self.hello.get("budget", 0.0))

    def overhead(self) -> float:
        """Fraction of wall time the agents report having spent, over their lifetimes."""
        spent = sum(a.spent_s for a in self.agents.values())
        elapsed = sum(a.elapsed_s for a in self.agents.values())
        return spent / elapsed if elapsed > 0 else 0.0

    def duration_s(self) -> float:
        return sum(a.elapsed_s for a in self.agents.values())

    def add_agent(self, hello: dict[str, Any]) -> AgentState:
        state = self.agents.get(hello["agent"])
        if state is None:
            state = AgentState(hello["agent"])
            self.agents[state.agent_id] = state
        state.connected = True
        state.last_seen = time.time()
        state.budget = float(hello["budget"])
        state.attach_token = hello.get("attach_token")
        self.hello = hello
        return state

    def ingest(self, state: AgentState, report: dict[str, Any]) -> None:
        """Add one report's deltas. Raises :class:`UnknownLocation` before changing anything."""
        if report["epoch"] != state.epoch:
            state.epoch = report["epoch"]
            state.strings.clear()
            state.locs.clear()
        strings = state.strings
        for sid, text in report["strings"]:
            strings[sid] = text
        new_locs: dict[int, tuple[FrameId, int] | None] = {}
        for lid, file_sid, name_sid, firstline, line, flags in report["locs"]:
            try:
                frame = Frame(strings[file_sid], strings[name_sid], firstline, line)
            except KeyError:
                raise UnknownLocation(lid) from None
            if flags & LOC_AGENT:
                new_locs[lid] = None  # a detailing hook: its cost is in the ledger, not the profile
                continue
            new_locs[lid] = (self.frames.intern(frame), flags)
        state.locs.update(new_locs)
        locs = state.locs
        # Resolve everything first so a report with a hole changes nothing.
        resolved: list[tuple[StackKey, int, int]] = []
        for tid, count, stack in report["stacks"]:
            try:
                mapped = [m for m in (locs[lid] for lid in reversed(stack)) if m is not None]
            except KeyError as exc:
                raise UnknownLocation(exc.args[0]) from None
            leaf_flags = mapped[-1][1] if mapped else 0
            resolved.append(((tid, tuple(fid for fid, _ in mapped)), count, leaf_flags))

        window: dict[StackKey, list[int]] = {}
        #: per thread: samples by what the leaf was doing, for the proflets
        kinds: dict[int, dict[str, int]] = {}
        for key, count, leaf_flags in resolved:
            cpu = 0 if leaf_flags & LOC_BLOCKING else count
            _add(self.counts, key, count, cpu)
            _add(window, key, count, cpu)
            if key[1]:  # a thread only in dyper's own code is not the application's
                per = kinds.setdefault(key[0], {})
                kind = leaf_kind(leaf_flags)
                per[kind] = per.get(kind, 0) + count
        for tid, name in report.get("threads") or ():
            self.threads[tid] = name
        self.samples += report["samples"]
        self.reports += 1
        t = float(report["t"])
        self.last_report_t = t
        if self.first_report_t is None:
            self.first_report_t = t
        state.last_seen = time.time()
        state.last_seq = report["seq"]
        if report.get("budget") is not None:
            state.budget = float(report["budget"])
        if report.get("spent_s") is not None:
            state.spent_s = float(report["spent_s"])
        if report.get("elapsed_s") is not None:
            state.elapsed_s = float(report["elapsed_s"])
        if report.get("startup_s") is not None:
            state.startup_s = float(report["startup_s"])
        state.delays = dict(report.get("delays") or {})
        state.dropped = dict(report.get("dropped") or {})
        state.mode = str(report.get("mode") or state.mode)
        if isinstance(report.get("proflets"), dict):
            state.proflets = dict(report["proflets"])
        window_costs = {k: float(v) for k, v in (report.get("costs") or {}).items()}
        for k, v in window_costs.items():
            self.costs[k] = self.costs.get(k, 0.0) + v
        self.windows.append(
            Window(
                t,
                report["samples"],
                window,
                n=self.reports,
                window_s=float(report["window_s"]),
                spent_s=sum(window_costs.values()),
                budget=state.budget,
            )
        )
        while self.windows and self.windows[0].t < t - WINDOW_RETENTION_S:
            self.windows.popleft()
        self.recent_costs.append((t, float(report["window_s"]), window_costs))
        for burst in report.get("details") or ():
            self._add_burst(burst)
        for message in report.get("errors") or ():
            self.errors.append(message)
        self.overhead_history.append((t, self.budget(), self.overhead()))
        self._feed_analyzers(report, t, kinds)

    def _feed_analyzers(self, report: dict[str, Any], t: float, kinds: dict[int, dict[str, int]]) -> None:
        data = report.get("data") if isinstance(report.get("data"), dict) else {}
        assert isinstance(data, dict)
        names = {int(tid): str(name) for tid, name in report.get("threads") or ()}
        for name, analyzer in self.analyzers.items():
            mine = data.get(name)
            view = ReportView(
                t=t,
                window_s=float(report["window_s"]),
                samples=int(report["samples"]),
                data=mine if isinstance(mine, dict) else None,
                kinds=kinds,
                threads=names,
                cpus=int(self.hello.get("cpus") or 1),
            )
            try:
                analyzer.merge(view)
                for burst in report.get("details") or ():
                    if burst.get("proflet") == name:
                        analyzer.merge_detail(burst)
            except Exception as exc:  # a broken analyzer loses its own results, nothing else
                self.errors.append(f"proflet {name}: analyzer failed: {type(exc).__name__}: {exc}")

    def _add_burst(self, burst: dict[str, Any]) -> None:
        length = burst.get("length_s")
        if not isinstance(length, int | float) or length <= 0:
            return
        self.bursts.append(
            {k: burst.get(k) for k in ("proflet", "t", "length_s", "fixed_s", "slowdown_s") if k in burst}
        )
        if burst.get("proflet") != "cpu" or burst.get("lines_counted"):
            # Bursts that counted lines slowed the candidates, and with them
            # how often they are called: rates come from the call-only bursts.
            return
        for row in burst.get("functions") or ():
            try:
                file, name, line, n = str(row[0]), str(row[1]), int(row[2]), int(row[3])
            except (IndexError, TypeError, ValueError):
                continue
            slot = self.calls.setdefault((file, name, line), [0.0, 0.0])
            slot[0] += n
            slot[1] += float(length)

    def calls_per_s(self) -> dict[tuple[str, str, int], float]:
        """Call rates of the functions cpu detailing has counted (calls / seconds counted)."""
        return {k: calls / secs for k, (calls, secs) in self.calls.items() if secs > 0}

    def spent_now(self, seconds: float = 10.0) -> dict[str, float]:
        """Fraction of wall time spent per category over the last ``seconds`` of reports."""
        if not self.recent_costs:
            return {}
        since = self.recent_costs[-1][0] - seconds
        wall = 0.0
        spent: dict[str, float] = {}
        for t, window_s, costs in self.recent_costs:
            if t <= since:
                continue
            wall += window_s
            for k, v in costs.items():
                spent[k] = spent.get(k, 0.0) + v
        return {k: v / wall for k, v in spent.items()} if wall > 0 else {}

    # --- persistence (monitor.history) ----------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What history keeps of the session besides its counts: plain data, copied (cheap: a few small maps)."""
        return {
            "first_seen": self.first_seen,
            "samples": self.samples,
            "reports": self.reports,
            "first_report_t": self.first_report_t,
            "last_report_t": self.last_report_t,
            "threads": dict(self.threads),
            "costs": dict(self.costs),
            "calls": {f"{f}\0{n}\0{line}": list(v) for (f, n, line), v in self.calls.items()},
            "agents": {
                a.agent_id: {
                    "budget": a.budget,
                    "spent_s": a.spent_s,
                    "elapsed_s": a.elapsed_s,
                    "dropped": dict(a.dropped),
                    "mode": a.mode,
                    "last_seen": a.last_seen,
                }
                for a in self.agents.values()
            },
            "errors": list(self.errors)[-10:],
            "analyzers": {name: a.state() for name, a in self.analyzers.items()},
        }

    @classmethod
    def restore(
        cls,
        key: SessionKey,
        hello: dict[str, Any],
        frames: FrameTable,
        state: dict[str, Any],
        counts: dict[StackKey, list[int]],
    ) -> Session:
        """A session as history kept it: whole-run counts and totals, its agents disconnected."""
        s = cls(key, hello, frames)
        s.first_seen = float(state.get("first_seen") or s.first_seen)
        s.samples = int(state.get("samples") or 0)
        s.reports = int(state.get("reports") or 0)
        first = state.get("first_report_t")
        s.first_report_t = float(first) if first is not None else None
        s.last_report_t = float(state.get("last_report_t") or 0.0)
        s.threads = {int(k): str(v) for k, v in (state.get("threads") or {}).items()}
        s.costs.update({str(k): float(v) for k, v in (state.get("costs") or {}).items()})
        for text, v in (state.get("calls") or {}).items():
            file, name, line = str(text).split("\0")
            s.calls[(file, name, int(line))] = [float(v[0]), float(v[1])]
        for agent_id, a in (state.get("agents") or {}).items():
            agent = AgentState(str(agent_id), connected=False)
            agent.budget = float(a.get("budget") or 0.0)
            agent.spent_s = float(a.get("spent_s") or 0.0)
            agent.elapsed_s = float(a.get("elapsed_s") or 0.0)
            agent.dropped = {str(k): int(v) for k, v in (a.get("dropped") or {}).items()}
            agent.mode = str(a.get("mode") or agent.mode)
            agent.last_seen = float(a.get("last_seen") or 0.0)
            s.agents[agent.agent_id] = agent
        s.errors.extend(str(e) for e in state.get("errors") or ())
        for name, kept in (state.get("analyzers") or {}).items():
            analyzer = s.analyzers.get(str(name))
            if analyzer is not None and isinstance(kept, dict):
                try:
                    analyzer.restore(kept)
                except Exception as exc:
                    s.errors.append(f"proflet {name}: history not restored: {type(exc).__name__}: {exc}")
        s.counts = counts
        return s

    # --- windows ------------------------------------------------------------------------

    @property
    def oldest_in_memory(self) -> int:
        """The number of the oldest report kept in memory; older ones are only in history."""
        return self.windows[0].n if self.windows else self.reports + 1

    def slice(self, start: float | None, end: float | None) -> Slice:
        """The in-memory reports ending in ``(start, end]`` (see :attr:`oldest_in_memory`)."""
        out = Slice()
        for w in self.windows:
            if (start is not None and w.t <= start) or (end is not None and w.t > end):
                continue
            out.add_report(w.t, w.window_s, w.samples)
            for key, (wall, cpu) in w.counts.items():
                _add(out.counts, key, wall, cpu)
        return out

    def window_counts(self, seconds: float | None) -> tuple[dict[StackKey, list[int]], int]:
        """Counts and sampling passes of the last ``seconds`` (None: the whole run)."""
        if seconds is None:
            return self.counts, self.samples
        if not self.windows:
            return {}, 0
        since = self.windows[-1].t - seconds
        merged: dict[StackKey, list[int]] = {}
        samples = 0
        for w in self.windows:
            if w.t <= since:
                continue
            samples += w.samples
            for key, (wall, cpu) in w.counts.items():
                _add(merged, key, wall, cpu)
        return merged, samples


def leaf_kind(flags: int) -> str:
    """What a thread whose stack ends at a location with these flags is doing (proflets.base.KINDS)."""
    if not flags & LOC_BLOCKING:
        return "run"
    if flags & LOC_LOCK:
        return "lock"
    if flags & LOC_SLEEP:
        return "sleep"
    if flags & LOC_IO:
        return "io"
    # LOC_WAIT, and agents from before the kinds, which flagged blocking only
    return "wait"


#: Analyzer classes of the registered proflets, loaded once per monitor.
_ANALYZER_CLASSES: dict[str, type[Analyzer]] | None = None
#: proflet name -> why its analyzer is not there
ANALYZERS_OFF: dict[str, str] = {}


def analyzer_classes() -> dict[str, type[Analyzer]]:
    global _ANALYZER_CLASSES
    if _ANALYZER_CLASSES is None:
        import proflets

        found: dict[str, type[Analyzer]] = {}
        for name, module in proflets.available().items():
            try:
                cls = getattr(proflets.load(name, module), "ANALYZER", None)
            except Exception as exc:  # one broken plug-in must not take the monitor down
                ANALYZERS_OFF[name] = f"{type(exc).__name__}: {exc}"
                continue
            if cls is not None:
                found[name] = cls
        _ANALYZER_CLASSES = found
    return _ANALYZER_CLASSES


def make_analyzers(session: Session) -> dict[str, Analyzer]:
    out: dict[str, Analyzer] = {}
    for name, cls in analyzer_classes().items():
        try:
            out[name] = cls(session)
        except Exception as exc:
            ANALYZERS_OFF[name] = f"{type(exc).__name__}: {exc}"
    return out


def _add(counts: dict[StackKey, list[int]], key: StackKey, wall: int, cpu: int) -> None:
    slot = counts.get(key)
    if slot is None:
        counts[key] = [wall, cpu]
    else:
        slot[0] += wall
        slot[1] += cpu


def merge_counts(into: dict[StackKey, list[int]], other: dict[StackKey, list[int]]) -> None:
    """Add ``other``'s counts into ``into``."""
    for key, (wall, cpu) in other.items():
        _add(into, key, wall, cpu)
