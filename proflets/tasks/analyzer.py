"""The tasks proflet's monitor half (see :mod:`dyper.proflets.tasks`)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dyper.monitor.model.libraries import library_predicate
from dyper.proflets.base import Analyzer, ReportView, SessionView, Status, confidence_of
from dyper.proflets.tasks.common import BLOCK_S, _accumulate

if TYPE_CHECKING:
    from dyper.monitor.model.profile import Profile


# --- the monitor's half -----------------------------------------------------------------------

#: Whole-run stacks kept, at most: beyond, new chains are counted in "dropped_s" only.
MAX_TOTAL_STACKS = 50_000
#: Blocks kept for the whole run (the newest).
BLOCKS_KEPT = 1000
#: Lags kept for the whole run's percentiles (the newest).
LAGS_KEPT = 20_000
#: Rows of a results' timeline, at most.
TIMELINE_POINTS = 120

StackKey = tuple[int, tuple[int, ...]]  # (task group id, frame ids root first)


class _LoopTotals:
    __slots__ = (
        "blocked_s",
        "blocks",
        "busy_s",
        "lags",
        "name",
        "passes",
        "seconds",
        "tasks_max",
        "tasks_n",
        "tasks_sum",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.passes = 0
        self.seconds = self.busy_s = self.blocked_s = 0.0
        self.tasks_sum = self.tasks_n = self.tasks_max = self.blocks = 0
        self.lags: deque[float] = deque(maxlen=LAGS_KEPT)

    def add(self, loop: Mapping[str, Any], blocks: list[dict[str, Any]]) -> None:
        self.name = str(loop.get("name") or self.name)
        self.passes += int(loop.get("passes") or 0)
        self.seconds += float(loop.get("seconds") or 0.0)
        self.busy_s += float(loop.get("busy_s") or 0.0)
        tasks = [int(n) for n in loop.get("tasks") or ()]
        self.tasks_sum += sum(tasks)
        self.tasks_n += len(tasks)
        self.tasks_max = max([self.tasks_max, *tasks])
        self.lags.extend(float(x) for x in loop.get("lag_s") or ())
        self.blocks += len(blocks)
        self.blocked_s += sum(float(b["duration_s"]) for b in blocks)

    def to_json(self, thread: int) -> dict[str, Any]:
        lags = sorted(self.lags)
        return {
            "thread": self.name,
            "ident": thread,
            "tasks_mean": self.tasks_sum / self.tasks_n if self.tasks_n else 0.0,
            "tasks_max": self.tasks_max,
            "busy_pct": 100.0 * self.busy_s / self.seconds if self.seconds > 0 else 0.0,
            "lag_ms_p50": 1000.0 * _quantile(lags, 0.5),
            "lag_ms_p99": 1000.0 * _quantile(lags, 0.99),
            "lag_ms_max": 1000.0 * lags[-1] if lags else 0.0,
            "lag_probes": len(lags),
            "blocks": self.blocks,
            "blocked_s": self.blocked_s,
            "blocked_pct": 100.0 * self.blocked_s / self.seconds if self.seconds > 0 else 0.0,
            "passes": self.passes,
            "seconds": self.seconds,
        }


class TasksAnalyzer(Analyzer):
    name = "tasks"

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        #: frames (file, function, first line, line) and task groups, interned
        self.frames: list[tuple[str, str, int, int]] = []
        self._frame_ids: dict[tuple[str, str, int, int], int] = {}
        self.groups: list[str] = []
        self._group_ids: dict[str, int] = {}
        #: whole run: (group, stack) -> [wall s, cpu s]
        self.total: dict[StackKey, list[float]] = {}
        self.loops: dict[int, _LoopTotals] = {}
        self.blocks: deque[dict[str, Any]] = deque(maxlen=BLOCKS_KEPT)
        self.passes = 0
        self.dropped_s = 0.0
        self.pass_s = 0.0
        self.interval_s = 0.0

    def _frame(self, f: Any) -> int:
        key = (str(f[0]), str(f[1]), int(f[2]), int(f[3]))
        i = self._frame_ids.get(key)
        if i is None:
            i = self._frame_ids[key] = len(self.frames)
            self.frames.append(key)
        return i

    def _group(self, name: str) -> int:
        i = self._group_ids.get(name)
        if i is None:
            i = self._group_ids[name] = len(self.groups)
            self.groups.append(name)
        return i

    def merge(self, report: ReportView) -> None:
        data = report.data
        if not data:
            return
        fids = [self._frame(f) for f in data.get("frames") or ()]
        stacks: dict[StackKey, list[float]] = {}
        for group, wall, cpu, ids in data.get("stacks") or ():
            key = (self._group(str(group)), tuple(fids[i] for i in ids))
            row = stacks.setdefault(key, [0.0, 0.0])
            row[0] += float(wall)
            row[1] += float(cpu)
        blocks = []
        for b in data.get("blocks") or ():
            blocks.append(
                {
                    "t": float(b["t"]),
                    "thread": b.get("thread"),
                    "task": str(b.get("task") or ""),
                    "duration_s": float(b["duration_s"]),
                    "passes": int(b.get("passes") or 0),
                    "stack": tuple(fids[i] for i in b.get("stack") or ()),
                }
            )
        loops = {}
        for loop in data.get("loops") or ():
            thread = int(loop.get("thread") or 0)
            loops[thread] = loop
            mine = [b for b in blocks if b["thread"] == loop.get("thread")]
            self.loops.setdefault(thread, _LoopTotals(str(loop.get("name") or thread))).add(loop, mine)
        self.blocks.extend(blocks)
        for key, (wall, cpu) in stacks.items():
            self.dropped_s += _accumulate(self.total, key, wall, cpu, MAX_TOTAL_STACKS)
        self.passes += int(data.get("passes") or 0)
        self.dropped_s += float(data.get("dropped_s") or 0.0)
        self.pass_s = float(data.get("pass_s") or 0.0)
        self.interval_s = float(data.get("interval_s") or 0.0)
        self.rows.append((report.t, (stacks, loops, blocks, report.window_s)))

    # --- windows -------------------------------------------------------------------------------

    def window(
        self, start: float | None, end: float | None
    ) -> tuple[dict[StackKey, list[float]], dict[int, _LoopTotals], list[dict[str, Any]]]:
        """The stacks, loops and blocks of the reports ending in (start, end] (whole run: both None)."""
        if start is None and end is None:
            return self.total, self.loops, list(self.blocks)
        stacks: dict[StackKey, list[float]] = {}
        loops: dict[int, _LoopTotals] = {}
        blocks: list[dict[str, Any]] = []
        for part, per_loop, blocks_of, _ in self.window_rows(start, end):
            for key, (wall, cpu) in part.items():
                row = stacks.setdefault(key, [0.0, 0.0])
                row[0] += wall
                row[1] += cpu
            for thread, loop in per_loop.items():
                mine = [b for b in blocks_of if b["thread"] == loop.get("thread")]
                loops.setdefault(thread, _LoopTotals(str(loop.get("name") or thread))).add(loop, mine)
            blocks.extend(blocks_of)
        return stacks, loops, blocks

    def _is_library(self) -> Callable[[str], bool]:
        return library_predicate(self.session.paths)

    def _where(self, fid: int) -> dict[str, Any]:
        file, name, _, line = self.frames[fid]
        return {"function": name, "file": file, "line": line}

    def handlers(self, stacks: Mapping[StackKey, list[float]], limit: int = 10) -> list[dict[str, Any]]:
        """Per handler (a chain's outermost application coroutine): its wall time and what it awaited.

        "awaiting" splits the handler's wall time by where its suspended chains
        waited: the innermost application frame, and the library call below it
        it was in (``via``); time running is "running".
        """
        is_library = self._is_library()
        app = [not is_library(f[0]) and not f[0].startswith("<") for f in self.frames]
        total = sum(w for w, _ in stacks.values())
        by: dict[tuple[str, str, int], dict[str, Any]] = {}
        for (gid, frames), (wall, cpu) in stacks.items():
            if not frames:
                continue
            mine = [i for i, fid in enumerate(frames) if app[fid]]
            outer = mine[0] if mine else 0
            hf = self.frames[frames[outer]]
            h = by.setdefault(
                (hf[0], hf[1], hf[2]),
                {
                    "handler": hf[1],
                    "file": hf[0],
                    "line": hf[2],
                    "task": self.groups[gid],
                    "app": bool(mine),
                    "wall_s": 0.0,
                    "running_s": 0.0,
                    "awaiting": {},
                },
            )
            h["wall_s"] += wall
            h["running_s"] += cpu
            waiting = wall - cpu
            if waiting <= 0:
                continue
            inner = mine[-1] if mine else len(frames) - 1
            what = self.frames[frames[inner]]
            via = self.frames[frames[inner + 1]][1] if inner + 1 < len(frames) else ""
            key = (what[1], what[0], what[3], via)
            h["awaiting"][key] = h["awaiting"].get(key, 0.0) + waiting
        out = []
        for h in sorted(by.values(), key=lambda h: -h["wall_s"])[:limit]:
            wall = h["wall_s"]
            awaiting = [
                {"function": fn, "file": file, "line": line, "via": via, "pct": 100.0 * s / wall, "wall_s": s}
                for (fn, file, line, via), s in sorted(h["awaiting"].items(), key=lambda kv: -kv[1])[:5]
            ]
            out.append(
                {
                    **{k: h[k] for k in ("handler", "file", "line", "task", "app", "wall_s")},
                    "share_pct": 100.0 * wall / total if total > 0 else 0.0,
                    "running_pct": 100.0 * h["running_s"] / wall if wall > 0 else 0.0,
                    "awaiting": awaiting,
                }
            )
        return out

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        stacks, loops, blocks = self.window(start, end)
        if not stacks and not loops:
            return {}
        shown = sorted(blocks, key=lambda b: -b["duration_s"])[:20]
        out: dict[str, Any] = {
            "loops": [totals.to_json(thread) for thread, totals in loops.items()],
            "handlers": self.handlers(stacks),
            "blocks": [
                {
                    "t": b["t"],
                    "thread": loops[int(b["thread"] or 0)].name if int(b["thread"] or 0) in loops else b["thread"],
                    "task": b["task"],
                    "duration_ms": 1000.0 * b["duration_s"],
                    "stack": [self._where(fid) for fid in b["stack"]],
                }
                for b in shown
            ],
            "task_wall_s": sum(w for w, _ in stacks.values()),
            "passes": self.passes,
            "pass_us": 1e6 * self.pass_s,
            "interval_ms": 1000.0 * self.interval_s,
            "block_threshold_ms": 1000.0 * BLOCK_S,
            "dropped_s": self.dropped_s,
        }
        out["timeline"] = self.timeline(start, end)
        out["findings"] = _findings(out)
        return out

    def timeline(self, start: float | None, end: float | None, points: int = TIMELINE_POINTS) -> list[list[float]]:
        """The window over time, per report: [end time, tasks, seconds blocked, worst lag in seconds].

        Tasks: every loop's, the mean of its censuses in the report.

        Consecutive reports are merged to at most ``points`` rows (tasks: their
        mean; blocked: the sum; lag: the worst).
        """
        rows = []
        for t, (_, loops, blocks, _) in (
            r for r in self.rows if (start is None or r[0] > start) and (end is None or r[0] <= end)
        ):
            tasks = 0.0
            for loop in loops.values():
                counts = [int(n) for n in loop.get("tasks") or ()]
                tasks += sum(counts) / len(counts) if counts else 0.0
            lags = [float(x) for loop in loops.values() for x in loop.get("lag_s") or ()]
            rows.append(
                [
                    t,
                    tasks,
                    sum(b["duration_s"] for b in blocks),
                    max(lags, default=0.0),
                ]
            )
        step = max(1, math.ceil(len(rows) / points))
        merged = []
        for i in range(0, len(rows), step):
            part = rows[i : i + step]
            merged.append(
                [part[-1][0], sum(r[1] for r in part) / len(part), sum(r[2] for r in part), max(r[3] for r in part)]
            )
        return merged

    def profile(self, start: float | None = None, end: float | None = None) -> Profile:
        """The task view of the window as a :class:`~dyper.monitor.model.profile.Profile` (milliseconds as counts)."""
        # here, not at the top: the target loads this module with the collector, and needs no profiles
        from dyper.monitor.model.frames import Frame
        from dyper.monitor.model.profile import Profile

        stacks, _, _ = self.window(start, end)
        counts = {key: [round(1000.0 * wall), round(1000.0 * cpu)] for key, (wall, cpu) in stacks.items()}
        frames = [Frame(*f) for f in self.frames]
        threads = {gid: f"task {name}" for gid, name in enumerate(self.groups)}
        profile = Profile.from_counts(frames, {k: v for k, v in counts.items() if v[0] > 0}, threads, {}, {})
        return profile

    def status(self) -> Status:
        loops = [t.to_json(k) for k, t in self.loops.items()]
        if not loops:
            return Status()
        blocked = max(r["blocked_pct"] for r in loops) / 100.0
        lag = max(r["lag_ms_p99"] for r in loops) / 1000.0
        problem = min(1.0, max(10.0 * blocked, lag / (5.0 * BLOCK_S)))
        return Status(problem, confidence_of(self.passes))

    def findings(self) -> list[str]:
        if self.passes < 20:
            return []
        return _findings(self.results())

    def state(self) -> dict[str, Any]:
        return {
            "frames": [list(f) for f in self.frames],
            "groups": self.groups,
            "total": [[g, list(s), w, c] for (g, s), (w, c) in self.total.items()],
            "passes": self.passes,
            "dropped_s": self.dropped_s,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.frames = [(str(f[0]), str(f[1]), int(f[2]), int(f[3])) for f in state.get("frames") or ()]
        self._frame_ids = {f: i for i, f in enumerate(self.frames)}
        self.groups = [str(g) for g in state.get("groups") or ()]
        self._group_ids = {g: i for i, g in enumerate(self.groups)}
        self.total = {
            (int(g), tuple(int(i) for i in s)): [float(w), float(c)] for g, s, w, c in state.get("total") or ()
        }
        self.passes = int(state.get("passes") or 0)
        self.dropped_s = float(state.get("dropped_s") or 0.0)


def _quantile(values: list[float], q: float) -> float:
    """``values`` sorted; the nearest-rank quantile (0 for none)."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def _findings(r: Mapping[str, Any]) -> list[str]:
    """What the task view says in words: blocked loops, lag, and where handlers wait."""
    out = []
    for loop in r.get("loops") or ():
        if loop["blocks"]:
            worst = max(
                (b for b in r["blocks"] if b["thread"] == loop["thread"]), key=lambda b: b["duration_ms"], default=None
            )
            where = ""
            if worst is not None and worst["stack"]:
                leaf = worst["stack"][-1]
                task = f" in task {worst['task']}" if worst["task"] else ""
                where = (
                    f"; the longest, {worst['duration_ms']:.0f} ms{task}, "
                    f"in {leaf['function']} ({leaf['file']}:{leaf['line']})"
                )
            out.append(
                f"the event loop in thread {loop['thread']} was blocked {loop['blocks']} time(s) for "
                f"{loop['blocked_s']:.2f} s by callbacks of {r['block_threshold_ms']:.0f} ms or more{where}"
            )
        elif loop["lag_ms_p99"] >= r["block_threshold_ms"]:
            out.append(
                f"the event loop in thread {loop['thread']} lags: 99% of callbacks start within "
                f"{loop['lag_ms_p99']:.0f} ms"
            )
    for h in (r.get("handlers") or ())[:3]:
        if h["share_pct"] < 10 or not h["awaiting"] or not h.get("app"):
            continue
        top = h["awaiting"][0]
        if top["pct"] >= 50:
            via = f" in {top['via']}" if top["via"] and top["via"] != top["function"] else ""
            what = top["function"] if top["file"] == "<asyncio>" else f"awaiting {top['function']}"
            out.append(
                f"{h['handler']} spent {top['pct']:.0f}% of its wall time {what}{via} ({top['file']}:{top['line']})"
            )
    return out


ANALYZER = TasksAnalyzer
