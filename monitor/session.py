"""Sessions: what the monitor knows about each profiled process.

One session per process, keyed by (host, pid, process start time), so a
re-attach to the same process continues its session and a new process that
happens to reuse a pid does not. Each agent incarnation inside a process
(attach, detach, attach again; the child after a fork is its own process)
has its own string tables, mapped here onto the monitor's global frame table.

Ingest is cheap and incremental: a report adds its counts to the session's
whole-run table and is kept, bounded by age, for time windows ("now").
Trees are built only when someone looks (see :mod:`monitor.profile`).

One monitor takes in a few hundred reports a second, so the per-stack work
is kept small: each agent's stacks are resolved once (location ids to frame
ids, and to the session's numbered stack) and cached by the bytes they came
in; stacks are interned monitor-wide; a window keeps its counts as small
arrays of stack numbers; and figures the scheduler asks for after every
report are running sums over the last seconds (:meth:`Session.recent`).
"""

from __future__ import annotations

import functools
import time
from array import array
from collections import deque
from collections.abc import Callable, Collection, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import msgpack

from dyper.agent import protocol
from dyper.agent.budget import slowdown, slowdown_by
from dyper.agent.protocol import (
    LOC_AGENT,
    LOC_BLOCKING,
    LOC_GIL,
    LOC_IO,
    LOC_LOCK,
    LOC_RUNQ,
    LOC_SLEEP,
    MAX_ERROR_CHARS,
    MAX_MARK_CHARS,
)
from dyper.monitor.model.frames import Frame, FrameId, StackKey
from dyper.proflets.base import Analyzer, ReportView

#: (host, pid, process start time)
SessionKey = tuple[str, int, float]


def same_process(pid: int, start_time: float) -> bool | None:
    """Whether the process now on ``pid`` here is the one started at ``start_time`` (s since the epoch).

    None when it cannot be told (no permission, say). Both start times come
    from /proc's start ticks and the boot time; a reused pid started elsewhen.
    """
    import psutil  # here: the CLI imports this module, and starts faster without it

    try:
        started = float(psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return None
    return abs(started - start_time) < 1.0


#: Session.check_stacks: per stack of a report, its code in the agent's cache (-1: not
#: there), and the location ids of those the agent had not sent before
StackCheck = tuple[list[int], dict[bytes, list[int]]]

#: keys of an analyzer's per-window summaries (see Session.recent)
K = TypeVar("K", bound=Hashable)

#: How long per-report deltas are kept for "now" windows.
WINDOW_RETENTION_S = 600.0
#: Marks a session keeps (the newest).
MAX_MARKS = 1000
#: trigger events kept per session (the newest)
MAX_TRIGGERS = 1000
#: an event's window ends this long after its "after": the agent's report at the end comes a little late
TRIGGER_END_SLACK_S = 0.5
#: Stacks an agent's resolved-stack cache holds at most (some 200 bytes each); past it, it starts afresh.
MAX_CACHED_STACKS = 20_000

#: What a stack's leaf was doing, as a small code a cached stack carries (see leaf_kind):
#: the first seven are proflets.base.KINDS; EMPTY is a stack of dyper's own frames only.
_KIND_NAMES = ("run", "lock", "wait", "io", "sleep", "gil", "runq")
_KIND_CODES = {name: code for code, name in enumerate(_KIND_NAMES)}
_RUN, _EMPTY = 0, 7


class FrameTable:
    """Interns frames monitor-wide, so profiles of many processes merge by id."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        #: by (file, name, first line, line): a plain tuple hashes and compares in C, a Frame does not
        self._ids: dict[tuple[str, str, int, int], FrameId] = {}
        #: each distinct stack (frame ids, root first) once, numbered: the processes of one service
        #: share most of theirs, and every session's stack keys hold these
        self.stacks: list[tuple[FrameId, ...]] = []
        self._stack_ids: dict[tuple[FrameId, ...], int] = {}

    def intern(self, frame: Frame) -> FrameId:
        return self.intern_location(frame.file, frame.name, frame.firstline, frame.line)

    def intern_location(self, file: str, name: str, firstline: int, line: int) -> FrameId:
        key = (file, name, firstline, line)
        fid = self._ids.get(key)
        if fid is None:
            fid = self._ids[key] = len(self.frames)
            self.frames.append(Frame(file, name, firstline, line))
        return fid

    def intern_stack(self, stack: tuple[FrameId, ...]) -> int:
        """The number of ``stack`` (frame ids, root first) in :attr:`stacks`."""
        n = self._stack_ids.get(stack)
        if n is None:
            n = self._stack_ids[stack] = len(self.stacks)
            self.stacks.append(stack)
        return n


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
    #: agent location id -> global frame id, for the application's locations (the ones stacks keep)
    fids: dict[int, FrameId] = field(default_factory=dict)
    #: thread -> location ids as sent (msgpack bytes) -> the session's stack index << 3 | leaf kind
    #: code: a stack seen before costs a lookup, and its ids were checked when it was first seen.
    #: Valid while no location is sent again as other code (an epoch starts it afresh).
    stacks: dict[int, dict[bytes, int]] = field(default_factory=dict)
    #: entries in ``stacks``
    cached: int = 0
    connected: bool = True
    last_seen: float = 0.0
    last_seq: int = -1
    budget: float = 0.0
    spent_s: float = 0.0
    #: what the agent's budgets allowed (None: an agent that does not say)
    allowed_s: float | None = None
    elapsed_s: float = 0.0
    #: one-time start-up CPU (loading the proflets), outside the budget's ledger
    startup_s: float = 0.0
    delays: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    attach_token: str | None = None
    mode: str = "local"
    #: per proflet: calibrated costs as last reported, or {"off": reason}
    proflets: dict[str, protocol.ProfletState] = field(default_factory=dict)
    #: sampling and detailing paused (dyper pause, agent.pause)
    paused: bool = False
    #: which stack sampler runs and why ({name: "native" or "gil", why}), as the agent last said; None: not said
    sampler: dict[str, str] | None = None

    def forget_stacks(self) -> None:
        self.stacks.clear()
        self.cached = 0


@dataclass(slots=True)
class Window:
    """Counts of one report, kept for time-window views (never changed once made).

    Compact, since a session keeps ten minutes of them: the report's stacks
    as indices into the session's ``table`` of stack keys, and their
    ``[wall, cpu]`` counts flattened, each in the smallest unsigned array
    that holds them (a few bytes per stack instead of some 300).
    """

    t: float
    samples: int
    #: indices into ``table``, in the order the report first named them
    stacks: array[int]
    #: wall, cpu, wall, cpu, ... for ``stacks``
    values: array[int]
    #: the session's stack keys (append-only, shared by all its windows)
    table: list[StackKey]
    #: the report's number in its session, from 1 (history splits memory from disk by it)
    n: int = 0
    window_s: float = 0.0
    #: seconds the agent spent in the window, all categories
    spent_s: float = 0.0
    budget: float = 0.0

    def items(self) -> Iterator[tuple[int, int, int]]:
        """(stack index, wall, cpu) per stack."""
        it = iter(self.values)
        return zip(self.stacks, it, it, strict=True)

    @property
    def counts(self) -> dict[StackKey, list[int]]:
        """The window's counts as a new map (stack -> [wall, cpu])."""
        table = self.table
        return {table[i]: [wall, cpu] for i, wall, cpu in self.items()}


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

    def __init__(self, key: SessionKey, hello: protocol.Hello, frames: FrameTable) -> None:
        self.key = key
        self.hello = hello
        self.frames = frames
        self.first_seen = time.time()
        #: end times of the first and latest reports (the agents' clocks)
        self.first_report_t: float | None = None
        self.agents: dict[str, AgentState] = {}
        #: every stack the session has seen, by index (windows name stacks by it); append-only
        self.stack_keys: list[StackKey] = []
        #: (thread, FrameTable stack number) -> index in stack_keys
        self._stack_index: dict[tuple[int, int], int] = {}
        #: whole run, by stack index: wall and cpu samples, whether counted at all, and the order in
        #: which stacks were first counted (arrays: a list per stack would cost memory and the
        #: garbage collector's time, thousands per process); see :attr:`counts`
        self._wall = array("q")
        self._cpu = array("q")
        self._counted = bytearray()
        self._count_order: list[int] = []
        self._counts_view: dict[StackKey, list[int]] | None = None
        #: thread ident -> the same int, kept once (stack keys share it)
        self._tids: dict[int, int] = {}
        self.threads: dict[int, str] = {}
        self.samples = 0
        self.windows: deque[Window] = deque()
        #: the number of the newest window whose end time is before the one ahead of it (agent
        #: clocks can step back): while it is kept, windows are not in time order
        self._unordered_n = 0
        #: running sums over the last seconds of windows, by name (see :meth:`recent`)
        self._recent: dict[str, RecentSums] = {}
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
        #: proflet name -> why its analyzer is not in :attr:`analyzers` (failed to load or to start)
        self.analyzers_off: dict[str, str] = {}
        self.analyzers: dict[str, Analyzer] = make_analyzers(self, self.analyzers_off)
        #: (wall time, name, kind) of the agents' marks: agent.mark, pause, resume, reset (the newest)
        self.marks: deque[tuple[float, str, str]] = deque(maxlen=MAX_MARKS)
        #: trigger events (agent.triggers), oldest first; each with its number ("id", from 1)
        self.triggers: deque[dict[str, Any]] = deque(maxlen=MAX_TRIGGERS)
        self.triggers_seen = 0
        #: the agents' elapsed seconds at the last reset: the whole run is what came after it
        self.elapsed_at_reset = 0.0
        #: wall time of the last reset (None: never reset)
        self.reset_t: float | None = None

    @property
    def pid(self) -> int:
        return self.key[1]

    @property
    def paths(self) -> dict[str, str]:
        """The target's sysconfig paths, as its hello gave them (to tell library code from application code)."""
        return dict(self.hello.get("paths") or {})

    @property
    def connected(self) -> bool:
        return any(a.connected for a in self.agents.values())

    def budget(self) -> float:
        live = [a for a in self.agents.values() if a.connected] or list(self.agents.values())
        return live[-1].budget if live else float(self.hello.get("budget", 0.0))

    def overhead(self) -> float:
        """The overhead the agents report, over their lifetimes: a slowdown, like the budget (agent.budget.slowdown)."""
        spent = sum(a.spent_s for a in self.agents.values())
        elapsed = sum(a.elapsed_s for a in self.agents.values())
        return slowdown(spent, elapsed)

    def allowed(self) -> float | None:
        """What the budgets in force allowed over the agents' lifetimes, as a slowdown; None if unknown.

        Above the budget when boosts or trigger events raised it for a while.
        """
        if not self.agents or any(a.allowed_s is None for a in self.agents.values()):
            return None
        allowed = sum(a.allowed_s or 0.0 for a in self.agents.values())
        elapsed = sum(a.elapsed_s for a in self.agents.values())
        return slowdown(allowed, elapsed)

    def duration_s(self) -> float:
        """Seconds the whole-run statistics cover: since the agents started, or since the last reset."""
        return max(0.0, sum(a.elapsed_s for a in self.agents.values()) - self.elapsed_at_reset)

    @property
    def paused(self) -> bool:
        live = [a for a in self.agents.values() if a.connected]
        return bool(live) and all(a.paused for a in live)

    def reset(self, t: float) -> None:
        """Start the whole-run statistics afresh at ``t``: counts, samples, costs, call counts, the proflets' analyses.

        The windows (and history) keep what came before, so a slice over
        earlier times still shows it.
        """
        wall, cpu, counted = self._wall, self._cpu, self._counted
        for i in self._count_order:
            wall[i] = cpu[i] = counted[i] = 0
        self._count_order = []
        self._counts_view = None
        self.samples = 0
        self.costs = {k: 0.0 for k in self.costs}
        self.calls = {}
        self.bursts.clear()
        self.analyzers_off = {}
        self.analyzers = make_analyzers(self, self.analyzers_off)
        self.elapsed_at_reset = sum(a.elapsed_s for a in self.agents.values())
        self.reset_t = t

    def add_agent(self, hello: protocol.Hello) -> AgentState:
        state = self.agents.get(hello["agent"])
        if state is None:
            state = AgentState(hello["agent"])
            self.agents[state.agent_id] = state
        state.connected = True
        state.last_seen = time.time()
        state.budget = float(hello["budget"])
        state.attach_token = hello.get("attach_token")
        if (sampler := hello.get("sampler")) is not None:
            state.sampler = dict(sampler)
        self.hello = hello
        return state

    def sampler(self) -> dict[str, str] | None:
        """Which stack sampler the process's newest agent runs, and why (None: its agent does not say)."""
        live = [a for a in self.agents.values() if a.connected] or list(self.agents.values())
        for state in reversed(live):
            if state.sampler is not None:
                return dict(state.sampler)
        return None

    def add_trigger(self, event: protocol.TriggerEvent) -> dict[str, Any]:
        """Keep a trigger event (checked by the protocol), numbered, with its window and a normal one to compare.

        The event's window is its "before" and "after" around when it fired;
        the agent split its report at the "before" and reported at the end of
        the "after", so both edges fall on reports (the end within half a
        second). The normal window is as long, just before it.
        """
        self.triggers_seen += 1
        t, before, after = float(event["t"]), float(event["before_s"]), float(event["after_s"])
        start, end = t - before, t + after + TRIGGER_END_SLACK_S
        kept = {
            "id": self.triggers_seen,
            "t": t,
            "name": str(event["name"])[:MAX_MARK_CHARS],
            "kind": str(event["kind"])[:MAX_MARK_CHARS],
            "why": str(event["why"])[:MAX_MARK_CHARS],
            "before_s": before,
            "after_s": after,
            "budget": float(event["budget"]),
            "window": [start, end],
            "normal": [start - (end - start), start],
        }
        self.triggers.append(kept)
        return kept

    def check_stacks(self, state: AgentState, report: protocol.Report) -> StackCheck:
        """Look the report's stacks up in the agent's cache, and check the location ids of those it has not sent before.

        Raises :class:`agent.protocol.DecodeError` if one is not a list of
        location ids (see ``protocol.decode(raw_stacks=True)``). Changes nothing.
        """
        cache = state.stacks if report["epoch"] == state.epoch else {}
        rows = stacks_as_bytes(report["stacks"])
        none: dict[bytes, int] = {}
        codes = [cache.get(tid, none).get(ids, -1) for tid, _, ids in rows]
        unseen = list({ids: None for (_, _, ids), code in zip(rows, codes, strict=True) if code < 0})
        return codes, dict(zip(unseen, protocol.stacks_ids(unseen), strict=True))

    def ingest(self, state: AgentState, report: protocol.Report, checked: StackCheck | None = None) -> None:
        """Add one report's deltas (``checked``: what :meth:`check_stacks` said of it, done here if None).

        Raises DecodeError (from check_stacks) before any change, and :class:`UnknownLocation` before any
        count changes (the table rows it brought are kept: they are the agent's, and a resync resends them).
        """
        rows = stacks_as_bytes(report["stacks"])
        codes, fresh = checked if checked is not None else self.check_stacks(state, report)
        if report["epoch"] != state.epoch:
            state.epoch = report["epoch"]
            state.strings.clear()
            state.locs.clear()
            state.fids.clear()
            state.forget_stacks()
        strings = state.strings
        strings.update(cast("list[tuple[int, str]]", report["strings"]))  # [id, text] lists, pairs to update
        intern = self.frames.intern_location
        new_locs: dict[int, tuple[FrameId, int] | None] = {}
        new_fids: dict[int, FrameId] = {}
        for lid, file_sid, name_sid, firstline, line, flags in report["locs"]:
            try:
                file, name = strings[file_sid], strings[name_sid]
            except KeyError:
                raise UnknownLocation(lid) from None
            if flags & LOC_AGENT:
                new_locs[lid] = None  # a detailing hook: its cost is in the ledger, not the profile
                continue
            fid = new_fids[lid] = intern(file, name, firstline, line)
            new_locs[lid] = (fid, flags)
        locs = state.locs
        if not locs.keys().isdisjoint(new_locs):
            if any(lid in locs and locs[lid] != mapped for lid, mapped in new_locs.items()):
                state.forget_stacks()  # a location changed under its id: stacks resolved with it are stale
                codes = [-1] * len(rows)
            for lid in new_locs.keys() - new_fids.keys():
                state.fids.pop(lid, None)
        locs.update(new_locs)
        state.fids.update(new_fids)

        # Resolve everything first so a report with a hole changes nothing.
        #: samples per code (the session's stack index << 3 | what the stack's leaf was doing)
        by_code: dict[int, int] = {}
        for (tid, count, ids), code in zip(rows, codes, strict=True):
            if code < 0:
                stack = fresh.get(ids)
                if stack is None:  # checked before, but the cache started afresh since (a location changed)
                    stack = protocol.stack_ids(ids)
                code = self._resolve(state, tid, ids, stack)
            by_code[code] = by_code.get(code, 0) + count
        # One stack under two leaf kinds (two locations of one line, flagged apart) is one entry of the window.
        twice = len({code >> 3 for code in by_code}) < len(by_code)
        at: dict[int, int] = {}

        if (sampler := report.get("sampler")) is not None:
            state.sampler = dict(sampler)
        for event in report.get("triggers") or ():
            self.add_trigger(event)
        marks = report.get("marks") or ()
        for mark_t, name, kind in marks:
            self.marks.append((float(mark_t), name[:MAX_MARK_CHARS], kind[:MAX_MARK_CHARS]))
            if kind == "reset":
                # The agent sent what came before the reset in an earlier report: this one's counts are after it.
                if (elapsed_s := report.get("elapsed_s")) is not None:
                    state.elapsed_s = float(elapsed_s) - float(report["window_s"])
                self.reset(float(mark_t))

        keys = self.stack_keys
        self._grow()
        wall, cpu_of, counted, first_counted = self._wall, self._cpu, self._counted, self._count_order
        self._counts_view = None
        #: the window: stack indices in the order the report first named them, and wall, cpu for each
        order: list[int] = []
        values: list[int] = []
        #: per thread: samples by what the leaf was doing, for the proflets
        kinds: dict[int, dict[str, int]] = {}
        for code, n in by_code.items():
            i = code >> 3
            kind = code & 7
            cpu = n if kind in (_RUN, _EMPTY) else 0  # a blocked leaf's samples are wall time only
            wall[i] += n
            cpu_of[i] += cpu
            if not counted[i]:
                counted[i] = 1
                first_counted.append(i)
            if kind != _EMPTY:  # a thread only in dyper's own code is not the application's
                tid = keys[i][0]
                per = kinds.get(tid)
                if per is None:
                    per = kinds[tid] = {}
                name = _KIND_NAMES[kind]
                per[name] = per.get(name, 0) + n
            if twice:
                if i in at:
                    values[2 * at[i]] += n
                    values[2 * at[i] + 1] += cpu
                    continue
                at[i] = len(order)
            order.append(i)
            values += (n, cpu)
        for tid, name in report.get("threads") or ():
            # An agent that no longer finds a thread (it ended) sends a stand-in
            # name: the real one, once known, stays.
            if tid not in self.threads or name != f"thread-{tid}":
                self.threads[tid] = name
        self.samples += report["samples"]
        self.reports += 1
        t = float(report["t"])
        self.last_report_t = t
        if self.first_report_t is None:
            self.first_report_t = t
        state.last_seen = time.time()
        state.last_seq = report["seq"]
        if (budget := report.get("budget")) is not None:
            state.budget = float(budget)
        if (spent_s := report.get("spent_s")) is not None:
            state.spent_s = float(spent_s)
        if (allowed_s := report.get("allowed_s")) is not None:
            state.allowed_s = float(allowed_s)
        if (elapsed_s := report.get("elapsed_s")) is not None:
            state.elapsed_s = float(elapsed_s)
        if (startup_s := report.get("startup_s")) is not None:
            state.startup_s = float(startup_s)
        state.delays = dict(report.get("delays") or {})
        state.dropped = dict(report.get("dropped") or {})
        state.mode = str(report.get("mode") or state.mode)
        state.paused = bool(report.get("paused"))
        if isinstance(proflets := report.get("proflets"), dict):
            state.proflets = dict(proflets)
        window_costs = {k: float(v) for k, v in (report.get("costs") or {}).items()}
        for k, v in window_costs.items():
            self.costs[k] = self.costs.get(k, 0.0) + v
        if self.windows and t < self.windows[-1].t:
            self._unordered_n = self.reports
            for sums in self._recent.values():
                sums.clear()
        self.windows.append(
            Window(
                t,
                report["samples"],
                _compact(order),
                _compact(values),
                self.stack_keys,
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
            self.errors.append(message[:MAX_ERROR_CHARS])
        self.overhead_history.append((t, self.budget(), self.overhead()))
        self._feed_analyzers(report, t, kinds)

    def _resolve(self, state: AgentState, tid: int, ids: bytes, stack: list[int]) -> int:
        """Map a stack as an agent sent it (location ids, leaf first) to the session's stack index, and cache it."""
        try:
            frames = tuple(map(state.fids.__getitem__, reversed(stack)))
            leaf = state.locs[stack[0]] if stack else None
        except KeyError:
            # dyper's own locations leave the stack; any other id is one we never received
            try:
                found = [state.locs[lid] for lid in reversed(stack)]
            except KeyError as exc:
                raise UnknownLocation(exc.args[0]) from None
            mapped = [m for m in found if m is not None]
            frames = tuple([fid for fid, _ in mapped])
            leaf = mapped[-1] if mapped else None
        tid = self._tids.setdefault(tid, tid)
        i = self._index(tid, frames)
        kind = _kind_code(leaf[1]) if leaf is not None else _EMPTY
        code = i << 3 | kind
        if state.cached >= MAX_CACHED_STACKS:
            state.forget_stacks()
        per = state.stacks.get(tid)
        if per is None:
            per = state.stacks[tid] = {}
        per[ids] = code
        state.cached += 1
        return code

    # --- running sums over the last seconds ---------------------------------------------

    def recent(
        self, name: str, seconds: float, summarize: Callable[[Window], dict[K, int]]
    ) -> tuple[dict[K, int], int]:
        """Sums of ``summarize(window)``, and sampling passes, over the windows :meth:`window_counts` would merge.

        For analyzers that need a figure of the last few seconds after every
        report (the scheduler's priorities): kept up to date as windows come
        and go, so each window is summarized once, instead of merging all
        the recent windows' stacks each time. ``summarize`` must be additive
        (the summary of merged counts is the sum of the summaries) and give
        positive values; sums that come back to 0 are dropped. An analyzer
        whose summaries would change (what it classifies changed) calls
        :meth:`forget_recent`. The map returned is the running one: read it,
        do not keep or change it.
        """
        windows = self.windows
        sums = self._recent.get(name)
        if sums is None or sums.seconds != seconds or sums.summarize != summarize:
            sums = self._recent[name] = RecentSums(seconds, summarize)
        if not windows:
            sums.clear()
            return {}, 0
        since = windows[-1].t - seconds
        if windows[0].n <= self._unordered_n:
            # A window out of time order is still kept: which windows are recent is not a suffix.
            sums.clear()
            totals: dict[K, int] = {}
            passes = 0
            for w in windows:
                if w.t > since:
                    passes += w.samples
                    _add_sums(totals, summarize(w), 1)
            return totals, passes
        sums.update(windows, since)
        return cast("dict[K, int]", sums.totals), sums.samples

    def forget_recent(self, name: str) -> None:
        """Make :meth:`recent` summarize the windows of ``name`` afresh."""
        sums = self._recent.get(name)
        if sums is not None:
            sums.clear()

    def _feed_analyzers(self, report: protocol.Report, t: float, kinds: dict[int, dict[str, int]]) -> None:
        data = report.get("data") if isinstance(report.get("data"), dict) else {}
        assert isinstance(data, dict)
        names = {int(tid): self.threads.get(int(tid), str(name)) for tid, name in report.get("threads") or ()}
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
        # The seconds of the application's own time the counts cover (a burst's
        # slowdown makes everything in it run less often), from agents that say.
        counted = burst.get("counted_s")
        if not isinstance(counted, int | float) or not 0 < counted <= length:
            counted = length
        for row in burst.get("functions") or ():
            try:
                file, name, line, n = str(row[0]), str(row[1]), int(row[2]), int(row[3])
            except (IndexError, TypeError, ValueError):
                continue
            # A function's own figure where the agent has one (3.11: each
            # calling thread slowed as far as its pace let it be).
            own = row[4] if len(row) > 4 else None
            secs = own if isinstance(own, int | float) and 0 < own <= length else counted
            slot = self.calls.setdefault((file, name, line), [0.0, 0.0])
            slot[0] += n
            slot[1] += float(secs)

    def calls_per_s(self) -> dict[tuple[str, str, int], float]:
        """Call rates of the functions cpu detailing has counted (calls / seconds counted)."""
        return {k: calls / secs for k, (calls, secs) in self.calls.items() if secs > 0}

    def spent_now(self, seconds: float = 10.0) -> dict[str, float]:
        """The overhead by category over the last ``seconds`` of reports (agent.budget.slowdown_by)."""
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
        return slowdown_by(spent, wall) if wall > 0 else {}

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
                    "allowed_s": a.allowed_s,
                    "elapsed_s": a.elapsed_s,
                    "dropped": dict(a.dropped),
                    "mode": a.mode,
                    "last_seen": a.last_seen,
                }
                for a in self.agents.values()
            },
            "errors": list(self.errors)[-10:],
            "analyzers": {name: a.state() for name, a in self.analyzers.items()},
            "marks": [list(m) for m in self.marks],
            "triggers": list(self.triggers),
            "triggers_seen": self.triggers_seen,
            "elapsed_at_reset": self.elapsed_at_reset,
            "reset_t": self.reset_t,
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
        s = cls(key, cast("protocol.Hello", hello), frames)  # history keeps the hello it was given
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
            allowed = a.get("allowed_s")
            agent.allowed_s = float(allowed) if allowed is not None else None
            agent.elapsed_s = float(a.get("elapsed_s") or 0.0)
            agent.dropped = {str(k): int(v) for k, v in (a.get("dropped") or {}).items()}
            agent.mode = str(a.get("mode") or agent.mode)
            agent.last_seen = float(a.get("last_seen") or 0.0)
            s.agents[agent.agent_id] = agent
        s.errors.extend(str(e) for e in state.get("errors") or ())
        for m in state.get("marks") or ():
            s.marks.append((float(m[0]), str(m[1]), str(m[2])))
        for event in state.get("triggers") or ():
            if isinstance(event, dict):
                s.triggers.append(dict(event))
        s.triggers_seen = int(state.get("triggers_seen") or len(s.triggers))
        s.elapsed_at_reset = float(state.get("elapsed_at_reset") or 0.0)
        reset_t = state.get("reset_t")
        s.reset_t = float(reset_t) if reset_t is not None else None
        for name, kept in (state.get("analyzers") or {}).items():
            analyzer = s.analyzers.get(str(name))
            if analyzer is not None and isinstance(kept, dict):
                try:
                    analyzer.restore(kept)
                except Exception as exc:
                    s.errors.append(f"proflet {name}: history not restored: {type(exc).__name__}: {exc}")
        s.counts = counts
        return s

    # --- the whole run ------------------------------------------------------------------

    @property
    def counts(self) -> dict[StackKey, list[int]]:
        """Whole run: stack -> [wall samples, cpu samples], in the order stacks were first counted.

        Made from the session's arrays when asked (and kept until the next
        report): read it, do not change it.
        """
        view = self._counts_view
        if view is None:
            keys, wall, cpu = self.stack_keys, self._wall, self._cpu
            view = self._counts_view = {keys[i]: [wall[i], cpu[i]] for i in self._count_order}
        return view

    @counts.setter
    def counts(self, counts: dict[StackKey, list[int]]) -> None:
        """Whole-run counts from elsewhere (history, for a restored session): they replace the session's."""
        self._grow()
        for i in self._count_order:
            self._wall[i] = self._cpu[i] = self._counted[i] = 0
        self._count_order.clear()
        for (tid, frames), (wall, cpu) in counts.items():
            i = self._index(tid, tuple(frames))
            self._grow()
            self._wall[i] += wall
            self._cpu[i] += cpu
            if not self._counted[i]:
                self._counted[i] = 1
                self._count_order.append(i)
        self._counts_view = None

    def _index(self, tid: int, frames: tuple[FrameId, ...]) -> int:
        """The stack index of (thread, frames), numbered if new."""
        number = self.frames.intern_stack(frames)
        tid = self._tids.setdefault(tid, tid)
        i = self._stack_index.get((tid, number))
        if i is None:
            i = self._stack_index[(tid, number)] = len(self.stack_keys)
            self.stack_keys.append((tid, self.frames.stacks[number]))
        return i

    def _grow(self) -> None:
        """Room in the whole-run arrays for every stack index."""
        more = len(self.stack_keys) - len(self._counted)
        if more > 0:
            zeros = bytes(8 * more)
            self._wall.frombytes(zeros)
            self._cpu.frombytes(zeros)
            self._counted.extend(bytes(more))

    # --- windows ------------------------------------------------------------------------

    @property
    def oldest_in_memory(self) -> int:
        """The number of the oldest report kept in memory; older ones are only in history."""
        return self.windows[0].n if self.windows else self.reports + 1

    def slice(self, start: float | None, end: float | None) -> Slice:
        """The in-memory reports ending in ``(start, end]`` (see :attr:`oldest_in_memory`)."""
        out = Slice()
        chosen = []
        for w in self.windows:
            if (start is not None and w.t <= start) or (end is not None and w.t > end):
                continue
            out.add_report(w.t, w.window_s, w.samples)
            chosen.append(w)
        out.counts = _merge_windows(chosen, self.stack_keys)
        return out

    def window_counts(self, seconds: float | None) -> tuple[dict[StackKey, list[int]], int]:
        """Counts and sampling passes of the last ``seconds`` (None: the whole run)."""
        if seconds is None:
            return self.counts, self.samples
        if not self.windows:
            return {}, 0
        since = self.windows[-1].t - seconds
        chosen = [w for w in self.windows if w.t > since]
        return _merge_windows(chosen, self.stack_keys), sum(w.samples for w in chosen)


class RecentSums:
    """Running sums of per-window summaries over the last ``seconds`` of a session's windows (time-ordered)."""

    def __init__(self, seconds: float, summarize: Callable[[Window], dict[Any, int]]) -> None:
        self.seconds = seconds
        self.summarize = summarize
        #: the windows summed, oldest first, with their summaries
        self.parts: deque[tuple[Window, dict[Hashable, int]]] = deque()
        self.totals: dict[Hashable, int] = {}
        self.samples = 0
        #: the number of the newest window looked at
        self.newest_n = 0

    def clear(self) -> None:
        self.parts.clear()
        self.totals = {}
        self.samples = 0
        self.newest_n = 0

    def update(self, windows: deque[Window], since: float) -> None:
        """Sum the windows ending after ``since``: add the new ones, take out those now older."""
        new: list[Window] = []
        for w in reversed(windows):
            if w.n <= self.newest_n or w.t <= since:
                break
            new.append(w)
        for w in reversed(new):
            part = self.summarize(w)
            self.parts.append((w, part))
            _add_sums(self.totals, part, 1)
            self.samples += w.samples
        self.newest_n = windows[-1].n
        oldest = windows[0].n
        parts = self.parts
        while parts and (parts[0][0].t <= since or parts[0][0].n < oldest):
            w, part = parts.popleft()
            _add_sums(self.totals, part, -1)
            self.samples -= w.samples


def _add_sums(totals: dict[K, int], part: dict[K, int], sign: int) -> None:
    for k, v in part.items():
        n = totals.get(k, 0) + sign * v
        if n:
            totals[k] = n
        else:
            del totals[k]


def _merge_windows(windows: list[Window], table: list[StackKey]) -> dict[StackKey, list[int]]:
    """The counts of windows of one session (stack ``table``) summed, in new lists, stacks in the order they came."""
    merged: dict[int, list[int]] = {}
    for w in windows:
        for i, wall, cpu in w.items():
            slot = merged.get(i)
            if slot is None:
                merged[i] = [wall, cpu]
            else:
                slot[0] += wall
                slot[1] += cpu
    return {table[i]: slot for i, slot in merged.items()}


def stacks_as_bytes(rows: list[list[Any]]) -> list[list[Any]]:
    """A report's stacks with their ids as msgpack bytes, as ``protocol.decode(raw_stacks=True)`` gives them.

    Reports made in this process (tests, tools) have them as lists.
    """
    if rows and type(rows[0][2]) is not bytes:
        return [[tid, n, msgpack.packb(ids)] for tid, n, ids in rows]
    return rows


@functools.lru_cache(maxsize=64)  # flags are a few bit combinations; bounded against odd agents
def _kind_code(flags: int) -> int:
    return _KIND_CODES[leaf_kind(flags)]


def leaf_kind(flags: int) -> str:
    """What a thread whose stack ends at a location with these flags is doing (proflets.base.KINDS)."""
    if not flags & LOC_BLOCKING:
        return "run"
    if flags & LOC_GIL:
        return "gil"
    if flags & LOC_RUNQ:
        return "runq"
    if flags & LOC_LOCK:
        return "lock"
    if flags & LOC_SLEEP:
        return "sleep"
    if flags & LOC_IO:
        return "io"
    # LOC_WAIT, and agents from before the kinds, which flagged blocking only
    return "wait"


#: Analyzer classes of the registered proflets, loaded once per monitor, and
#: proflet name -> why its analyzer could not be loaded (the same for every session)
_ANALYZER_CLASSES: tuple[dict[str, type[Analyzer]], dict[str, str]] | None = None


def analyzer_classes() -> tuple[dict[str, type[Analyzer]], dict[str, str]]:
    """The analyzer class of each registered proflet, and why any could not be loaded."""
    global _ANALYZER_CLASSES
    if _ANALYZER_CLASSES is None:
        from dyper import proflets

        found: dict[str, type[Analyzer]] = {}
        failed: dict[str, str] = {}
        for name, module in proflets.available().items():
            try:
                cls = getattr(proflets.load(name, module, "analyzer"), "ANALYZER", None)
            except Exception as exc:  # one broken plug-in must not take the monitor down
                failed[name] = f"{type(exc).__name__}: {exc}"
                continue
            if cls is not None:
                found[name] = cls
        _ANALYZER_CLASSES = (found, failed)
    return _ANALYZER_CLASSES


def make_analyzers(session: Session, off: dict[str, str]) -> dict[str, Analyzer]:
    """``session``'s analyzers; ``off`` gets why any proflet has none (this session's, not the monitor's)."""
    classes, failed = analyzer_classes()
    off.update(failed)
    out: dict[str, Analyzer] = {}
    for name, cls in classes.items():
        try:
            out[name] = cls(session)
        except Exception as exc:
            off[name] = f"{type(exc).__name__}: {exc}"
    return out


def _add(counts: dict[StackKey, list[int]], key: StackKey, wall: int, cpu: int) -> None:
    slot = counts.get(key)
    if slot is None:
        counts[key] = [wall, cpu]
    else:
        slot[0] += wall
        slot[1] += cpu


#: unsigned array type codes by size, smallest first
_UNSIGNED = sorted((array(code).itemsize, code) for code in "BHILQ")


def _compact(values: Collection[int]) -> array[int]:
    """``values`` (non-negative) in the smallest unsigned array that holds the largest."""
    top = max(values, default=0)
    for size, code in _UNSIGNED:
        if top < 1 << (8 * size):
            return array(code, values)
    raise OverflowError(f"{top} does not fit in 64 bits")


def merge_counts(into: dict[StackKey, list[int]], other: dict[StackKey, list[int]]) -> None:
    """Add ``other``'s counts into ``into``."""
    for key, (wall, cpu) in other.items():
        _add(into, key, wall, cpu)
