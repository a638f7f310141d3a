"""Consolidation of many profiles: bottlenecks that only show up sometimes.

After seed 004 (multi-execution bottleneck detection). One profile is one
execution; a bottleneck that depends on the input or the thread schedule is
missed by a single profile and averaged away by a merged one. So each source
(a saved profile, a collapsed-stack file, one time window of a live process,
one process of a service) is first reduced to per-function shares of its own
samples, and the shares are then compared across sources.

The paper's quantities, per code block over the recorded executions, and how
they map onto sampled Python profiles:

``min``, ``max``
    The lowest and highest cost seen in any execution. Here: the lowest and
    highest share over *all* sources; a source where the function never ran
    counts as 0, because a window where it did not run is exactly the kind of
    variation the range is meant to show.
``avg``
    The paper's average time of one execution of the block. Here: the mean
    share over the sources where the function appears at all.
``frequency``
    The paper's execution frequency is how often the block runs in one
    execution; a sampled share already includes that. What is left to count
    across sources is how often the function runs at all: the share of
    sources in which it appears (is on any sampled stack).
``significance = frequency x avg``
    With the two definitions above this is the mean share over all sources,
    absent ones counting 0: what the function costs a typical source.
``range = max - min``
    As in the paper.
``occurrence``
    The probability that the block shows up as a cost in an execution. Here:
    the share of sources in which the function's share reaches the threshold.
``threshold``
    A percentage of each source's samples, as in the paper.

A row is *flagged* when it reached the threshold in at least one source
(``occurrence > 0``, the default rule), or, with the paper's own rule
(Algorithm 2, line 23), when both significance and range reach the threshold;
the paper's rule deliberately passes over a cost that is high but steady.

Shares are self shares (the leaf, as the paper's per-block costs are) unless
``basis="total"`` asks for inclusive shares, a function counted once per stack
however deep its recursion, as :mod:`proflets.cpu` does.

Functions are keyed by (qualified name, file) so that dyper profiles and
collapsed files, which do not carry a function's first line, consolidate
together; lines by (qualified name, file, line).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dyper.monitor.model.frames import Frame
from dyper.monitor.model.profile import Metric, Profile, StackCount, function_table, line_table

#: (qualified name, file, line); line is None for function keys.
Key = tuple[str, str, int | None]
#: (self %, total %) of one source's samples
Share = tuple[float, float]
Basis = Literal["self", "total"]
Rule = Literal["occurrence", "paper"]
Level = Literal["functions", "lines"]

DEFAULT_THRESHOLD_PCT = 5.0  # the paper's experiments all use 5%


@dataclass(frozen=True)
class SourceShares:
    """One source reduced to per-function and per-line shares of its samples, in percent."""

    label: str
    kind: str  # "profile", "collapsed", "window", "process"
    samples: int
    functions: dict[Key, Share]
    lines: dict[Key, Share]
    #: a function's first line, where the source knows it (dyper profiles do)
    first_lines: dict[Key, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "kind": self.kind, "samples": self.samples}


@dataclass(frozen=True)
class Consolidated:
    """One function (or line) over all sources."""

    name: str
    file: str
    line: int | None
    values_pct: tuple[float, ...]  # per source, in the order given; 0 where absent
    min_pct: float
    max_pct: float
    avg_pct: float
    frequency: float
    significance: float
    range_pct: float
    occurrence: float
    flagged: bool
    #: the other basis's mean over the sources where the row appears (total % for self, and back)
    other_avg_pct: float

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.file,
            "line": self.line,
            "min_pct": self.min_pct,
            "max_pct": self.max_pct,
            "avg_pct": self.avg_pct,
            "significance": self.significance,
            "range_pct": self.range_pct,
            "occurrence": self.occurrence,
            "flagged": self.flagged,
            "frequency": self.frequency,
            "values_pct": list(self.values_pct),
            "other_avg_pct": self.other_avg_pct,
        }


# --- sources ----------------------------------------------------------------------------


def from_profile(
    profile: Profile,
    label: str,
    kind: str = "profile",
    *,
    metric: Metric = "cpu",
    charge_libraries: bool = False,
) -> SourceShares:
    """A dyper profile's shares, computed by the cpu proflet so they match ``dyper top``."""
    functions: dict[Key, Share] = {}
    first_lines: dict[Key, int] = {}
    for row in function_table(profile, metric, charge_libraries=charge_libraries):
        key: Key = (row["name"], row["file"], None)
        # Two functions of one name in one file (a redefinition) become one row,
        # as they would in a collapsed file.
        own, total = functions.get(key, (0.0, 0.0))
        functions[key] = (own + row["self_pct"], total + row["total_pct"])
        first_lines.setdefault(key, row["line"])
    lines: dict[Key, Share] = {
        (row["name"], row["file"], row["line"]): (row["self_pct"], row["total_pct"])
        for row in line_table(profile, metric, charge_libraries=charge_libraries)
    }
    return SourceShares(label, kind, profile.total(metric), functions, lines, first_lines)


# dyper's and py-spy's "qualname (file:line)", py-spy's --nolineno "qualname (file)",
# Austin's "file:function:line" (older Austins write "L12").
_FRAME_LINE = re.compile(r"^(?P<name>.*) \((?P<file>.*):(?P<line>\d+)\)$")
_FRAME_NOLINE = re.compile(r"^(?P<name>.*) \((?P<file>.*)\)$")
_FRAME_AUSTIN = re.compile(r"^(?P<file>.*):(?P<name>[^:]+):L?(?P<line>\d+)$")
# Austin starts each stack with the process and the thread.
_AUSTIN_PROCESS = re.compile(r"^P\d+$")
_AUSTIN_THREAD = re.compile(r"^T[0-9a-fA-Fx:]+$")


def parse_frame(text: str) -> Key:
    """``(name, file, line)`` of one collapsed frame; file "" and line None where the format has none."""
    for pattern in (_FRAME_LINE, _FRAME_AUSTIN):
        m = pattern.match(text)
        if m:
            return (m["name"], m["file"], int(m["line"]))
    m = _FRAME_NOLINE.match(text)
    if m:
        return (m["name"], m["file"], None)
    return (text, "", None)


def parse_collapsed(text: str, label: str = "collapsed") -> SourceShares:
    """Folded stacks (``a;b;c 42`` per line, root first) reduced to shares.

    Blank lines and ``#`` lines (Austin's metadata) are skipped; a line that is
    not a stack and a count raises :class:`ValueError` naming the line.
    """
    self_f: dict[Key, int] = {}
    total_f: dict[Key, int] = {}
    self_l: dict[Key, int] = {}
    total_l: dict[Key, int] = {}
    parsed: dict[str, Key] = {}
    grand = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(None, 1)
        try:
            # Austin's --full writes "time,+mem,-mem": the first is the time.
            n = int(parts[1].split(",")[0]) if len(parts) == 2 else -1
        except ValueError:
            n = -1
        if n < 0:
            raise ValueError(f"{label}:{lineno}: not a collapsed stack line (frames;separated;by;semicolons COUNT)")
        frames = parts[0].split(";")
        if frames and _AUSTIN_PROCESS.match(frames[0]):
            frames = frames[1:]
            if frames and _AUSTIN_THREAD.match(frames[0]):
                frames = frames[1:]
        if n == 0 or not frames:
            continue
        keys = []
        for f in frames:
            k = parsed.get(f)
            if k is None:
                k = parsed[f] = parse_frame(f)
            keys.append(k)
        grand += n
        leaf = keys[-1]
        _bump(self_l, leaf, n)
        _bump(self_f, _function_of(leaf), n)
        # Once per stack, however deep the recursion (as proflets.cpu counts total).
        for k in set(keys):
            _bump(total_l, k, n)
        for k in {_function_of(k) for k in keys}:
            _bump(total_f, k, n)
    if grand == 0:
        raise ValueError(f"{label}: no samples (an empty or all-zero collapsed file)")
    return SourceShares(label, "collapsed", grand, _shares(self_f, total_f, grand), _shares(self_l, total_l, grand))


def load_source(
    path: str | Path, *, metric: Metric = "cpu", charge_libraries: bool = False, label: str | None = None
) -> SourceShares:
    """A saved dyper JSON profile or a collapsed-stack file, told apart by content.

    Raises :class:`ValueError` with a one-line message for an unreadable or unknown file.
    """
    p = Path(path)
    name = label or str(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from None
    if p.suffix == ".json" or text.lstrip().startswith("{"):
        import json

        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{name} is not JSON: {exc}") from None
        profile = Profile.from_json(data, name)
        return from_profile(profile, name, "profile", metric=metric, charge_libraries=charge_libraries)
    return parse_collapsed(text, name)


def diff_profiles(later: Profile, earlier: Profile) -> Profile:
    """What ``later`` counted since ``earlier``: two snapshots of one process's whole run.

    Frames are matched by content, since each snapshot numbers its own frames.
    Negative differences (the process restarted between the two) are dropped.
    """

    def counts(p: Profile) -> dict[tuple[int, tuple[Frame, ...]], tuple[int, int]]:
        out: dict[tuple[int, tuple[Frame, ...]], tuple[int, int]] = {}
        for s in p.stacks:
            key = (s.thread, tuple(p.frames[i] for i in s.frames))
            wall, cpu = out.get(key, (0, 0))
            out[key] = (wall + s.wall, cpu + s.cpu)
        return out

    before = counts(earlier)
    frames: list[Frame] = []
    index: dict[Frame, int] = {}
    stacks: list[StackCount] = []
    for (thread, stack), (wall, cpu) in counts(later).items():
        w0, c0 = before.get((thread, stack), (0, 0))
        wall, cpu = max(0, wall - w0), max(0, cpu - c0)
        if wall == 0 and cpu == 0:
            continue
        local = []
        for f in stack:
            i = index.get(f)
            if i is None:
                i = index[f] = len(frames)
                frames.append(f)
            local.append(i)
        stacks.append(StackCount(thread, tuple(local), wall, cpu))
    process = dict(later.process)
    return Profile(frames, stacks, dict(later.threads), process, dict(later.paths))


# --- consolidation ----------------------------------------------------------------------


def consolidate(
    sources: Sequence[SourceShares],
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    *,
    level: Level = "functions",
    basis: Basis = "self",
    rule: Rule = "occurrence",
) -> list[Consolidated]:
    """Per function (or line): the paper's statistics over ``sources``, flagged rows first.

    Sorted by flagged, then significance, then max, descending. Every source
    must have samples, and there must be at least two.
    """
    if len(sources) < 2:
        raise ValueError(f"consolidation needs at least 2 sources, got {len(sources)}")
    for s in sources:
        if s.samples <= 0:
            raise ValueError(f"{s.label}: no samples")
    pick = 0 if basis == "self" else 1
    # 100 * 1 / 20 must reach a 5% threshold despite rounding ("equal to or above", as the paper says).
    bar = threshold_pct - 1e-9
    n = len(sources)
    tables = [s.functions if level == "functions" else s.lines for s in sources]
    keys: set[Key] = set()
    for t in tables:
        keys.update(t)
    rows: list[Consolidated] = []
    for key in keys:
        present = [t[key] for t in tables if key in t]
        values = tuple(t[key][pick] if key in t else 0.0 for t in tables)
        avg = sum(v[pick] for v in present) / len(present)
        frequency = len(present) / n
        lo, hi = min(values), max(values)
        significance = frequency * avg
        occurrence = sum(1 for v in values if v >= bar) / n
        rng = hi - lo
        flagged = (significance >= bar and rng >= bar) if rule == "paper" else occurrence > 0
        line = key[2]
        if level == "functions":
            line = next((s.first_lines[key] for s in sources if key in s.first_lines), None)
        rows.append(
            Consolidated(
                name=key[0],
                file=key[1],
                line=line,
                values_pct=values,
                min_pct=lo,
                max_pct=hi,
                avg_pct=avg,
                frequency=frequency,
                significance=significance,
                range_pct=rng,
                occurrence=occurrence,
                flagged=flagged,
                other_avg_pct=sum(v[1 - pick] for v in present) / len(present),
            )
        )
    rows.sort(key=lambda r: (not r.flagged, -r.significance, -r.max_pct, r.name, r.file, r.line or 0))
    return rows


def report(
    sources: Sequence[SourceShares],
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    *,
    lines: bool = False,
    basis: Basis = "self",
    rule: Rule = "occurrence",
    metric: Metric = "cpu",
) -> dict[str, Any]:
    """The whole consolidation as plain data (what ``dyper consolidate --json`` prints)."""

    def run(level: Level) -> list[dict[str, Any]]:
        return [r.to_json() for r in consolidate(sources, threshold_pct, level=level, basis=basis, rule=rule)]

    return {
        "sources": [s.to_json() for s in sources],
        "threshold_pct": threshold_pct,
        "basis": f"{basis}_pct",
        "rule": rule,
        "metric": metric,
        "functions": run("functions"),
        "lines": run("lines") if lines else [],
    }


def parse_threshold(text: str) -> float:
    """``"5%"`` or ``"5"`` -> 5.0 (a percentage of each source's samples)."""
    raw = text.strip()
    try:
        value = float(raw[:-1] if raw.endswith("%") else raw)
    except ValueError:
        raise ValueError(f"threshold {text!r} is not a percentage: write it like 5%") from None
    if not 0.0 < value <= 100.0:
        raise ValueError(f"threshold {text!r} is out of range: give a percentage above 0 and up to 100")
    return value


def parse_windows(text: str) -> tuple[int, float]:
    """``"6x10s"`` -> (6, 10.0): how many consecutive windows, of how many seconds."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\d+(?:\.\d*)?|\.\d+)\s*s?\s*", text)
    if not m:
        raise ValueError(f"windows {text!r}: write COUNTxSECONDS, e.g. 6x10s")
    count, seconds = int(m[1]), float(m[2])
    if count < 2 or seconds <= 0:
        raise ValueError(f"windows {text!r}: give at least 2 windows of more than 0 seconds")
    return count, seconds


def collect_windows(
    fetch: Callable[[], Profile],
    count: int,
    seconds: float,
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    progress: Callable[[int, Profile], None] | None = None,
) -> list[Profile]:
    """``count`` consecutive windows of ``seconds`` each from a live process.

    ``fetch`` returns the process's whole-run profile so far; each window is the
    difference of two snapshots ``seconds`` apart, so the windows neither
    overlap nor leave gaps, whatever the monitor's window retention. The
    deadlines are fixed from the start, so slow fetches do not make windows drift.
    """
    start = clock()
    previous = fetch()
    windows: list[Profile] = []
    for i in range(1, count + 1):
        delay = start + i * seconds - clock()
        if delay > 0:
            sleep(delay)
        current = fetch()
        window = diff_profiles(current, previous)
        window.process["window_s"] = seconds
        windows.append(window)
        if progress is not None:
            progress(i, window)
        previous = current
    return windows


def _bump(counts: dict[Key, int], key: Key, n: int) -> None:
    counts[key] = counts.get(key, 0) + n


def _function_of(key: Key) -> Key:
    return (key[0], key[1], None)


def _shares(own: dict[Key, int], total: dict[Key, int], grand: int) -> dict[Key, Share]:
    return {k: (100.0 * own.get(k, 0) / grand, 100.0 * t / grand) for k, t in total.items()}
