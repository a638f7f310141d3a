"""Profiles: a frozen snapshot of stack counts, and the pure analyses over it.

A :class:`Profile` is what every view, export, report and saved file works
from: the frames it uses, flat ``(thread, stack) -> (wall, cpu)`` counts
with stacks root first, the thread names and what is known about the
process. A session's profile comes from the one builder,
:func:`dyper.monitor.profile.build_profile`; a saved one from dyper's own JSON
(:meth:`Profile.load`). The tables below (the cpu proflet's basic analysis,
DYPER section 5.1) and the call tree are pure functions of it.

Two metrics: ``wall`` counts every sample of every thread; ``cpu`` leaves out
samples whose leaf is a blocking call (sleep, lock wait, select, socket
read...), so a sleeping main thread does not hide where the work is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dyper.agent.protocol import TAG_FILE, TAG_PREFIX
from dyper.monitor.model.frames import Frame, FunctionKey, StackKey
from dyper.monitor.model.libraries import library_predicate
from dyper.monitor.model.lights import Status, cpu_light

FORMAT = "dyper-profile"
FORMAT_VERSION = 1

#: Tables show only what takes at least this share of the samples (DYPER's 0.5%:
#: below that a sampling profile is noise).
FLOOR_PCT = 0.5

Metric = str  # "cpu" or "wall"

#: (file, qualname, first line or line): a table's row key
Key = tuple[str, str, int]


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
    #: findings, off (see monitor.report.proflet_sections); empty for profiles without them
    proflets: dict[str, Any] = field(default_factory=dict)

    # --- construction ---------------------------------------------------------------

    @classmethod
    def from_counts(
        cls,
        frame_table: list[Frame],
        counts: dict[StackKey, list[int]],
        threads: dict[int, str],
        process: dict[str, Any],
        paths: dict[str, str],
        proflets: dict[str, Any] | None = None,
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
        return cls(frames, stacks, threads, process, paths, dict(proflets or {}))

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
        return library_predicate(self.paths)

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
        """Per function: self and total samples and percentages (see :func:`function_table`)."""
        return function_table(self, metric, charge_libraries=charge_libraries, floor_pct=floor_pct)

    def lines(
        self, metric: Metric = "cpu", *, charge_libraries: bool = False, floor_pct: float = 0.0
    ) -> list[dict[str, Any]]:
        """Per line: self and total samples and percentages (see :func:`line_table`)."""
        return line_table(self, metric, charge_libraries=charge_libraries, floor_pct=floor_pct)

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


def sample_interval_s(profile: Profile) -> float:
    """Seconds one sampling pass stands for: the profile's span over its passes (0 if unknown)."""
    seconds = _span_s(profile)
    passes = int(profile.process.get("samples") or 0)
    return seconds / passes if seconds > 0 and passes > 0 else 0.0


def _span_s(profile: Profile) -> float:
    """The seconds a profile covers: its window's, or the whole run's."""
    return float(profile.process.get("window_s") or profile.process.get("duration_s") or 0.0)


def cpu_functions(
    profile: Profile,
    rates: Mapping[FunctionKey, tuple[float, float | None]] | None = None,
    thread_cpu_s: Mapping[int, float] | None = None,
) -> list[dict[str, Any]]:
    """The cpu proflet's function rows (DYPER's Figure 6), the one place their columns are named.

    :func:`function_table` above the floor, plus: ``self_s``/``total_s``,
    seconds of CPU; and where cpu detailing counted the function's calls
    (``rates``: function -> (calls per second, seconds counted)),
    ``calls_per_s``, ``counted_s`` (what the rate rests on), ``calls`` (the
    rate over the profile's span) and ``s_per_call``; None where it did not.

    A cpu sample says a thread was on a CPU or ready for one (waiting for the
    GIL, or for a processor). Where a thread's CPU clock is known
    (``thread_cpu_s``: ident -> CPU seconds over the profile's span, from the
    threads or timing proflet), its samples share what the clock says; where
    it is not, each stands for the time of one sampling pass. Either way one
    thread's samples never stand for more than the time they were taken over:
    a function that ran 3 s in one thread shows at most 3 s, however many
    other threads ran beside it.
    """
    interval = sample_interval_s(profile)
    duration = _span_s(profile)
    rows = function_table(profile, floor_pct=FLOOR_PCT)
    self_s, total_s = _cpu_seconds(profile, _sample_worth(profile, interval, thread_cpu_s or {}))
    for row in rows:
        key = (row["file"], row["name"], row["line"])
        rate, counted = (rates or {}).get(key, (None, None))
        calls = round(rate * duration) if rate is not None else None
        row["self_s"] = self_s.get(key, 0.0)
        row["total_s"] = total_s.get(key, 0.0)
        row["calls_per_s"] = rate
        row["counted_s"] = counted
        row["calls"] = calls
        row["s_per_call"] = row["total_s"] / calls if calls else None
    return rows


def _sample_worth(profile: Profile, interval: float, clocks: Mapping[int, float]) -> dict[int, float]:
    """Seconds of CPU one cpu sample of each thread stands for."""
    samples: dict[int, int] = {}
    for s in profile.stacks:
        if s.cpu:
            samples[s.thread] = samples.get(s.thread, 0) + s.cpu
    worth = {}
    for thread, n in samples.items():
        clock = clocks.get(thread)
        worth[thread] = min(interval, clock / n) if clock is not None and clock >= 0 else interval
    return worth


def _cpu_seconds(profile: Profile, worth: Mapping[int, float]) -> tuple[dict[Key, float], dict[Key, float]]:
    """Per function: CPU seconds as the leaf (self) and anywhere on the stack (total, once per stack)."""
    self_s: dict[Key, float] = {}
    total_s: dict[Key, float] = {}
    keys = [f.function for f in profile.frames]
    for s in profile.stacks:
        if not s.cpu or not s.frames:
            continue
        sec = s.cpu * worth.get(s.thread, 0.0)
        leaf = keys[s.frames[-1]]
        self_s[leaf] = self_s.get(leaf, 0.0) + sec
        for k in {keys[i] for i in s.frames}:
            total_s[k] = total_s.get(k, 0.0) + sec
    return self_s, total_s


def cpu_status(profile: Profile) -> Status:
    """The cpu light of a profile of a thread view (see :func:`dyper.monitor.model.lights.cpu_light`)."""
    return cpu_light(profile.total("cpu"), int(profile.process.get("samples") or 0))


def function_table(
    profile: Profile, metric: Metric = "cpu", *, charge_libraries: bool = False, floor_pct: float = 0.0
) -> list[dict[str, Any]]:
    """Per function (file, qualname, first line): self and total, sorted by self."""
    return _table(profile, metric, charge_libraries, floor_pct, lambda f: f.function)


def line_table(
    profile: Profile, metric: Metric = "cpu", *, charge_libraries: bool = False, floor_pct: float = 0.0
) -> list[dict[str, Any]]:
    """Per line (file, qualname, line): self and total, sorted by self."""
    return _table(profile, metric, charge_libraries, floor_pct, lambda f: (f.file, f.name, f.line))


def _table(
    profile: Profile,
    metric: Metric,
    charge_libraries: bool,
    floor_pct: float,
    key_of: Callable[[Frame], Key],
) -> list[dict[str, Any]]:
    keys = [key_of(f) for f in profile.frames]
    self_counts: dict[Key, int] = {}
    total_counts: dict[Key, int] = {}
    grand = 0
    for s, frames in profile.charged_stacks(charge_libraries):
        n = s.cpu if metric == "cpu" else s.wall
        if n == 0 or not frames:
            continue
        grand += n
        leaf = keys[frames[-1]]
        self_counts[leaf] = self_counts.get(leaf, 0) + n
        # A recursive function is counted once per stack, not once per frame.
        for k in {keys[i] for i in frames}:
            total_counts[k] = total_counts.get(k, 0) + n
    rows: list[dict[str, Any]] = []
    for k, total in total_counts.items():
        own = self_counts.get(k, 0)
        total_pct = 100.0 * total / grand if grand else 0.0
        if total_pct < floor_pct:
            continue
        rows.append(
            {
                "name": k[1],
                "file": k[0],
                "line": k[2],
                "self": own,
                "total": total,
                "self_pct": 100.0 * own / grand if grand else 0.0,
                "total_pct": total_pct,
            }
        )
    rows.sort(key=lambda r: (-r["self"], -r["total"], r["name"]))
    return rows


def _value(s: StackCount, metric: Metric) -> int:
    return s.cpu if metric == "cpu" else s.wall
