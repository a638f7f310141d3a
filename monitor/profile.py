"""Profiles: a frozen snapshot of counts, and the pure analyses over it.

A :class:`Profile` is what every view, export and saved file works from: the
frames it uses, flat ``(thread, stack) -> (wall, cpu)`` counts with stacks
root first, the thread names and what is known about the process. It comes
from a live session (:meth:`Profile.from_session`) or from dyper's own JSON
(:meth:`Profile.load`), and the analyses below are pure functions of it.

Two metrics: ``wall`` counts every sample of every thread; ``cpu`` leaves out
samples whose leaf is a blocking call (sleep, lock wait, select, socket
read...), so a sleeping main thread does not hide where the work is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dyper.agent.protocol import TAG_FILE, TAG_PREFIX
from dyper.monitor.session import Frame, Session, StackKey
from dyper.proflets import cpu as cpu_proflet
from dyper.proflets.cpu import FLOOR_PCT

FORMAT = "dyper-profile"
FORMAT_VERSION = 1

DEFAULT_FLOOR_PCT = FLOOR_PCT  # the cpu proflet's floor, used by the views

Metric = str  # "cpu" or "wall"


@dataclass(frozen=True)
class StackCount:
    thread: int
    frames: tuple[int, ...]  # indexes into Profile.frames, root first
    wall: int
    cpu: int


@dataclass
class Profile:
    frames: list[Frame]
    stacks: list[StackCount]
    threads: dict[int, str] = field(default_factory=dict)
    process: dict[str, Any] = field(default_factory=dict)
    #: the target's sysconfig paths, to tell library code from application code
    paths: dict[str, str] = field(default_factory=dict)
    #: what the proflets' analyzers said for the same span: status, results,
    #: findings, off (see monitor.report); empty for profiles without them
    proflets: dict[str, Any] = field(default_factory=dict)

    # --- construction ---------------------------------------------------------------

    @classmethod
    def from_session(cls, session: Session, window_s: float | None = None, *, proflets: bool = True) -> Profile:
        """The session's counts (whole run, or its last ``window_s`` seconds), with the proflets' sections."""
        counts, samples = session.window_counts(window_s)
        process = process_info(session)
        process.update(
            duration_s=session.duration_s() if window_s is None else window_s, samples=samples, window_s=window_s
        )
        profile = cls.from_counts(session.frames.frames, counts, dict(session.threads), process, session_paths(session))
        if not proflets:
            return profile
        from dyper.monitor.report import proflet_sections

        start = None if window_s is None or not session.windows else session.windows[-1].t - window_s
        profile.proflets = proflet_sections(session, start, None)
        return profile

    @classmethod
    def from_counts(
        cls,
        frame_table: list[Frame],
        counts: dict[StackKey, list[int]],
        threads: dict[int, str],
        process: dict[str, Any],
        paths: dict[str, str],
    ) -> Profile:
        """A profile of ``counts`` (stacks of ids into ``frame_table``), carrying only the frames it uses.

        Reads ``frame_table`` by index only, so it may run on another thread
        than the one that appends to it.
        """
        index: dict[int, int] = {}
        frames: list[Frame] = []
        stacks: list[StackCount] = []
        for (tid, stack), (wall, cpu) in counts.items():
            local = []
            for fid in stack:
                i = index.get(fid)
                if i is None:
                    i = index[fid] = len(frames)
                    frames.append(frame_table[fid])
                local.append(i)
            stacks.append(StackCount(tid, tuple(local), wall, cpu))
        return cls(frames, stacks, threads, process, paths)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Profile:
        """Read dyper's own JSON profile (see :meth:`to_json`)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read profile {path}: {exc}") from None
        return cls.from_json(data, str(path))

    @classmethod
    def from_json(cls, data: Any, origin: str = "profile") -> Profile:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f'{origin} is not a dyper profile (no "format": "{FORMAT}")')
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"{origin}: profile format version {data.get('version')} is not supported")
        try:
            frames = [Frame(str(f[0]), str(f[1]), int(f[2]), int(f[3])) for f in data["frames"]]
            stacks = [StackCount(int(s[0]), tuple(int(i) for i in s[3]), int(s[1]), int(s[2])) for s in data["stacks"]]
            threads = {int(k): str(v) for k, v in data.get("threads", {}).items()}
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"{origin}: malformed dyper profile ({type(exc).__name__}: {exc})") from None
        if any(i >= len(frames) or i < 0 for s in stacks for i in s.frames):
            raise ValueError(f"{origin}: malformed dyper profile (frame index out of range)")
        proflets = data.get("proflets")
        return cls(
            frames,
            stacks,
            threads,
            dict(data.get("process", {})),
            dict(data.get("paths", {})),
            dict(proflets) if isinstance(proflets, dict) else {},
        )

    def to_json(self) -> dict[str, Any]:
        """dyper's own profile format, version 1.

        ``frames``: ``[file, qualname, first line, line]``; ``stacks``:
        ``[thread ident, wall samples, cpu samples, [frame indexes, root first]]``;
        ``threads``: ident (as a string) -> name; ``process``: pid, host,
        argv, python, budget, overhead, duration_s, samples; ``paths``: the
        target's sysconfig paths; ``proflets`` (optional): the proflets'
        status, results, findings and why any were off, as ``dyper report`` shows them.
        """
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "process": self.process,
            "paths": self.paths,
            "threads": {str(k): v for k, v in self.threads.items()},
            "frames": [[f.file, f.name, f.firstline, f.line] for f in self.frames],
            "stacks": [[s.thread, s.wall, s.cpu, list(s.frames)] for s in self.stacks],
            **({"proflets": self.proflets} if self.proflets else {}),
        }

    # --- tags (agent.tag) ------------------------------------------------------------

    def tags(self, metric: Metric = "cpu") -> dict[str, int]:
        """Samples inside each tag (a stack under two tags counts for both), by tag name."""
        names = {i: f.name[len(TAG_PREFIX) :] for i, f in enumerate(self.frames) if f.file == TAG_FILE}
        out: dict[str, int] = {}
        for s in self.stacks:
            for name in {names[i] for i in s.frames if i in names}:
                out[name] = out.get(name, 0) + _value(s, metric)
        return out

    def with_tag(self, name: str) -> Profile:
        """The samples taken inside tag ``name`` only; ``process`` says which tag (``tag``).

        Raises ValueError, naming the tags there are, when no sample is inside it.
        """
        tags = self.tags("wall")
        if name not in tags:
            known = ", ".join(sorted(tags)) or "none (decorate functions with @dyper.tag(NAME))"
            raise ValueError(f"no samples inside tag {name!r}; the tags seen: {known}")
        label = TAG_PREFIX + name
        inside = {i for i, f in enumerate(self.frames) if f.file == TAG_FILE and f.name == label}
        stacks = [s for s in self.stacks if not inside.isdisjoint(s.frames)]
        process = dict(self.process, tag=name, tag_samples=sum(s.wall for s in stacks))
        # The proflets' sections are the whole process's: they do not split by tag.
        return Profile(self.frames, stacks, dict(self.threads), process, dict(self.paths))

    # --- analyses --------------------------------------------------------------------

    def total(self, metric: Metric = "cpu") -> int:
        return sum(_value(s, metric) for s in self.stacks)

    def library_predicate(self) -> Callable[[str], bool]:
        """True for files of the standard library or installed packages of the target."""
        roots = sorted(
            {os.path.normpath(p) + os.sep for k, p in self.paths.items() if k in _LIBRARY_PATHS and p},
            key=len,
            reverse=True,
        )

        def is_library(file: str) -> bool:
            return file.startswith("<frozen") or any(file.startswith(r) for r in roots)

        return is_library

    def charged_stacks(self, charge_libraries: bool) -> Iterable[tuple[StackCount, tuple[int, ...]]]:
        """Stacks, with library frames below the last application frame cut off when asked.

        Cutting them charges the time spent inside the standard library or a
        package to the application line that called it (DYPER's cpu proflet).
        """
        if not charge_libraries:
            for s in self.stacks:
                yield s, s.frames
            return
        is_library = self.library_predicate()
        app = [not is_library(f.file) for f in self.frames]
        for s in self.stacks:
            frames = s.frames
            cut = len(frames)
            while cut > 0 and not app[frames[cut - 1]]:
                cut -= 1
            yield s, (frames[:cut] if cut > 0 else frames)

    def functions(
        self, metric: Metric = "cpu", *, charge_libraries: bool = False, floor_pct: float = 0.0
    ) -> list[dict[str, Any]]:
        """Per function: self and total samples and percentages (the cpu proflet's table)."""
        return cpu_proflet.function_table(self, metric, charge_libraries=charge_libraries, floor_pct=floor_pct)

    def lines(
        self, metric: Metric = "cpu", *, charge_libraries: bool = False, floor_pct: float = 0.0
    ) -> list[dict[str, Any]]:
        """Per line: self and total samples and percentages (the cpu proflet's table)."""
        return cpu_proflet.line_table(self, metric, charge_libraries=charge_libraries, floor_pct=floor_pct)

    def tree(self, metric: Metric = "cpu", *, charge_libraries: bool = False) -> Node:
        """The call tree (all threads merged under one root)."""
        root = Node("<all>", None)
        for s, frames in self.charged_stacks(charge_libraries):
            n = _value(s, metric)
            if n == 0:
                continue
            node = root
            node.total += n
            for i in frames:
                child = node.children.get(i)
                if child is None:
                    child = node.children[i] = Node(self.frames[i].label(), i)
                child.total += n
                node = child
            node.self += n
        return root


@dataclass
class Node:
    """A call-tree node: ``total`` includes descendants, ``self`` does not."""

    label: str
    frame: int | None
    self: int = 0
    total: int = 0
    children: dict[int, Node] = field(default_factory=dict)


_LIBRARY_PATHS = ("stdlib", "platstdlib", "purelib", "platlib")
#: Marks a profile carries (the newest).
MARKS_SHOWN = 200


def process_info(session: Session) -> dict[str, Any]:
    """What a profile says about its process (``duration_s``, ``samples`` and ``window_s`` are the caller's)."""
    hello = session.hello
    return {
        "pid": session.pid,
        "host": session.key[0],
        "start_time": session.key[2],
        "argv": list(hello.get("argv", [])),
        "python": hello.get("python", ""),
        "executable": hello.get("executable", ""),
        "cpus": hello.get("cpus"),
        "budget": session.budget(),
        "overhead": session.overhead(),
        # what the budgets in force allowed over the run (boosts and trigger events raise it); None: unknown
        "allowed": session.allowed(),
        # one-time start-up CPU seconds (loading the proflets), outside the budget
        "startup_s": sum(a.startup_s for a in session.agents.values()),
        # seconds spent per category over the run: sample, wake, report, detail
        "costs": dict(session.costs),
        "dropped": _sum_dropped(session),
        "paused": session.paused,
        # the whole-run statistics start here (dyper reset, agent.reset); None: never reset
        "reset_t": session.reset_t,
        # [wall time, name, kind] of the newest marks (agent.mark, pause, resume, reset)
        "marks": [list(m) for m in list(session.marks)[-MARKS_SHOWN:]],
        # the newest trigger events (agent.triggers), each with its window and a normal one before it
        "triggers": list(session.triggers)[-MARKS_SHOWN:],
    }


def task_profile(session: Session, start: float | None = None, end: float | None = None) -> Profile:
    """The task view of ``session`` for reports ending in (start, end]: asyncio tasks' await chains as stacks.

    Its "threads" are task names (numbered ones without their number), its
    counts milliseconds of task wall time (``cpu``: of running), so every
    export and the bottleneck search read it as they read the thread view.
    Raises ValueError when the process has shown no asyncio task.
    """
    from dyper.proflets.tasks import TasksAnalyzer

    analyzer = session.analyzers.get("tasks")
    if not isinstance(analyzer, TasksAnalyzer) or not analyzer.frames:
        raise ValueError(
            f"process {session.pid} has no task view: no asyncio tasks seen "
            "(the tasks proflet runs by default; was it left out of --proflets?)"
        )
    profile: Profile = analyzer.profile(start, end)
    process = process_info(session)
    process.update(
        view="tasks",
        unit="ms",
        duration_s=session.duration_s() if start is None and end is None else None,
        window={"start": start, "end": end},
    )
    profile.process = process
    profile.paths = session_paths(session)
    return profile


def session_paths(session: Session) -> dict[str, str]:
    return dict(session.hello.get("paths") or {})


def _value(s: StackCount, metric: Metric) -> int:
    return s.cpu if metric == "cpu" else s.wall


def _sum_dropped(session: Session) -> dict[str, int]:
    total: dict[str, int] = {}
    for a in session.agents.values():
        for k, v in a.dropped.items():
            total[k] = total.get(k, 0) + v
    return total
