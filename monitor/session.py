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

from agent.protocol import LOC_AGENT, LOC_BLOCKING

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
    #: agent location id -> (global frame id, blocking flag); None for dyper's own code
    locs: dict[int, tuple[FrameId, bool] | None] = field(default_factory=dict)
    connected: bool = True
    last_seen: float = 0.0
    last_seq: int = -1
    budget: float = 0.0
    spent_s: float = 0.0
    elapsed_s: float = 0.0
    delays: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    attach_token: str | None = None
    mode: str = "local"
    #: per proflet: calibrated costs as last reported, or {"off": reason}
    proflets: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Window:
    """Counts of one report, kept for time-window views."""

    t: float
    samples: int
    counts: dict[StackKey, list[int]]


class Session:
    """A profiled process as seen by the monitor."""

    def __init__(self, key: SessionKey, hello: dict[str, Any], frames: FrameTable) -> None:
        self.key = key
        self.hello = hello
        self.frames = frames
        self.first_seen = time.time()
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
        new_locs: dict[int, tuple[FrameId, bool] | None] = {}
        for lid, file_sid, name_sid, firstline, line, flags in report["locs"]:
            try:
                frame = Frame(strings[file_sid], strings[name_sid], firstline, line)
            except KeyError:
                raise UnknownLocation(lid) from None
            if flags & LOC_AGENT:
                new_locs[lid] = None  # a detailing hook: its cost is in the ledger, not the profile
                continue
            new_locs[lid] = (self.frames.intern(frame), bool(flags & LOC_BLOCKING))
        state.locs.update(new_locs)
        locs = state.locs
        # Resolve everything first so a report with a hole changes nothing.
        resolved: list[tuple[StackKey, int, bool]] = []
        for tid, count, stack in report["stacks"]:
            try:
                mapped = [m for m in (locs[lid] for lid in reversed(stack)) if m is not None]
            except KeyError as exc:
                raise UnknownLocation(exc.args[0]) from None
            blocking = bool(mapped) and mapped[-1][1]
            resolved.append(((tid, tuple(fid for fid, _ in mapped)), count, blocking))

        window: dict[StackKey, list[int]] = {}
        for key, count, blocking in resolved:
            cpu = 0 if blocking else count
            _add(self.counts, key, count, cpu)
            _add(window, key, count, cpu)
        for tid, name in report.get("threads") or ():
            self.threads[tid] = name
        self.samples += report["samples"]
        self.reports += 1
        t = float(report["t"])
        self.last_report_t = t
        self.windows.append(Window(t, report["samples"], window))
        while self.windows and self.windows[0].t < t - WINDOW_RETENTION_S:
            self.windows.popleft()
        state.last_seen = time.time()
        state.last_seq = report["seq"]
        if report.get("budget") is not None:
            state.budget = float(report["budget"])
        if report.get("spent_s") is not None:
            state.spent_s = float(report["spent_s"])
        if report.get("elapsed_s") is not None:
            state.elapsed_s = float(report["elapsed_s"])
        state.delays = dict(report.get("delays") or {})
        state.dropped = dict(report.get("dropped") or {})
        state.mode = str(report.get("mode") or state.mode)
        if isinstance(report.get("proflets"), dict):
            state.proflets = dict(report["proflets"])
        window_costs = {k: float(v) for k, v in (report.get("costs") or {}).items()}
        for k, v in window_costs.items():
            self.costs[k] = self.costs.get(k, 0.0) + v
        self.recent_costs.append((t, float(report["window_s"]), window_costs))
        for burst in report.get("details") or ():
            self._add_burst(burst)
        for message in report.get("errors") or ():
            self.errors.append(message)
        self.overhead_history.append((t, self.budget(), self.overhead()))

    def _add_burst(self, burst: dict[str, Any]) -> None:
        length = burst.get("length_s")
        if not isinstance(length, int | float) or length <= 0:
            return
        self.bursts.append(
            {k: burst.get(k) for k in ("proflet", "t", "length_s", "fixed_s", "slowdown_s") if k in burst}
        )
        if burst.get("proflet") != "cpu":
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


def _add(counts: dict[StackKey, list[int]], key: StackKey, wall: int, cpu: int) -> None:
    slot = counts.get(key)
    if slot is None:
        counts[key] = [wall, cpu]
    else:
        slot[0] += wall
        slot[1] += cpu
