"""Triggers: conditions the agent checks once a second that catch transient problems.

DYPER asks that analysis be "turned on and off ... automatically based on
conditions in the program" and names as future work proflets "that
automatically trigger detailed or high-frequency sampling when they detect an
anomalous event". A whole-run profile averages a slow minute away; a trigger
keeps it apart. The conditions (text form, case and spaces free)::

    cpu > 80% [for 10s]      process CPU (all threads, % of one core) above 80% for 10 s (default 5 s)
    rss > 1.5GB [for 5s]     resident memory above a size (for: default 0 s)
    rss + 50MB/s [for 5s]    resident memory growing faster than 50 MB/s, over 5 s (the default)
    blocked > 5s             a thread waiting for one lock (at one place) longer than 5 s
    mark:NAME                agent.mark(NAME) was called (NAME may hold * and ?)

and, from inside only, a predicate (``agent.trigger(callable, name=...)``).
Options follow, comma-separated: ``before 20s``, ``after 30s``, ``budget 10%``,
e.g. ``cpu > 80% for 10s, after 60s``.

When one fires, the agent (agent.core):

- splits the report it is gathering at ``before`` seconds ago (it keeps the
  counts of each second since its last report: the ring), so the monitor's
  window of the event begins exactly there;
- raises the budget for ``after`` seconds (a boost: never past the ceiling),
  starts detailing at once, and reports at the end, so the window ends there;
- sends the event; the monitor stores it (``dyper triggers PID``) and its
  window's profile is ``dyper export PID --trigger N``, or, against the
  window of the same length just before it, ``dyper bottlenecks PID --trigger N``.

A trigger fires when its condition starts to hold (for its ``for``), and again
only once the condition has stopped holding and the event has ended. The
checks cost microseconds (one ``times()`` call, one read of
``/proc/self/statm``, each thread's leaf frame) and are charged to the budget.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

from dyper.agent import procfs
from dyper.agent.protocol import LOC_LOCK, parse_budget

Kind = Literal["cpu", "rss", "rss_growth", "blocked", "mark", "predicate"]
KINDS: Final = ("cpu", "rss", "rss_growth", "blocked", "mark", "predicate")

#: how often the conditions are checked, and the ring's slices are cut
CHECK_S: Final = 1.0
DEFAULT_BEFORE_S: Final = 20.0
DEFAULT_AFTER_S: Final = 30.0
DEFAULT_CPU_FOR_S: Final = 5.0
DEFAULT_GROWTH_FOR_S: Final = 5.0
#: at most this much before (the ring holds up to it, but never past the last report)
MAX_BEFORE_S: Final = 300.0
MAX_AFTER_S: Final = 3600.0
#: without a ceiling, a trigger raises the budget to ten times the budget, at most this
DEFAULT_RAISED_MAX: Final = 0.10
MAX_TRIGGERS: Final = 32
#: past this many distinct stacks in a report window the ring stops copying (a copy a second)
RING_MAX_STACKS: Final = 5000
#: a predicate slower than this is switched off (it runs holding the GIL)
MAX_PREDICATE_S: Final = 0.005

_SIZE_UNITS: Final = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
                      "kib": 1024, "mib": 1024**2, "gib": 1024**3}  # fmt: skip
_TIME_UNITS: Final = {"": 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUM: Final = r"(\d+(?:\.\d+)?)"
_COND_RE: Final = re.compile(
    r"^(?:cpu\s*>\s*(?P<pct>\d+(?:\.\d+)?)\s*%"
    r"|rss\s*>\s*(?P<size>\d+(?:\.\d+)?)\s*(?P<sunit>[a-z]*)"
    r"|rss\s*\+\s*(?P<rate>\d+(?:\.\d+)?)\s*(?P<runit>[a-z]*)\s*/\s*s"
    r"|blocked\s*>\s*(?P<block>\d+(?:\.\d+)?)\s*(?P<bunit>[a-z]*)"
    r"|mark\s*[: ]\s*(?P<mark>\S.*?))"
    r"(?:\s+for\s+(?P<for>\d+(?:\.\d+)?)\s*(?P<funit>[a-z]*))?\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class TriggerSpec:
    """One trigger as configured: plain data, so it crosses into the process as JSON."""

    kind: Kind
    #: cpu: fraction of one core; rss: bytes; rss_growth: bytes/s; blocked: seconds; mark, predicate: 0
    threshold: float = 0.0
    #: how long the condition must hold (cpu, rss), or the span its growth is measured over (rss_growth)
    for_s: float = 0.0
    #: mark: the name pattern
    pattern: str = ""
    before_s: float = DEFAULT_BEFORE_S
    after_s: float = DEFAULT_AFTER_S
    #: the budget while the event lasts; None: the ceiling, else ten times the budget (at most 10%)
    budget: float | None = None
    #: as the user wrote it (predicate: the name given)
    name: str = ""
    #: predicate: how often it is called
    every_s: float = CHECK_S

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> TriggerSpec:
        """Checked, since it crosses a process boundary; raises ValueError."""
        if not isinstance(data, dict) or data.get("kind") not in KINDS:
            raise ValueError(f"not a trigger: {data!r}")
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for k in ("threshold", "for_s", "before_s", "after_s", "every_s"):
            if k in fields and not isinstance(fields[k], int | float):
                raise ValueError(f"trigger {data.get('name')!r}: {k} is not a number")
        spec = cls(**fields)
        return spec.checked()

    def checked(self) -> TriggerSpec:
        if not 0 <= self.before_s <= MAX_BEFORE_S:
            raise ValueError(f"trigger {self.name!r}: before must be 0 to {MAX_BEFORE_S:g} s")
        if not 0 < self.after_s <= MAX_AFTER_S:
            raise ValueError(f"trigger {self.name!r}: after must be more than 0 and at most {MAX_AFTER_S:g} s")
        if self.budget is not None:
            parse_budget(self.budget)
        return self

    def describe(self) -> str:
        return self.name or self.kind


def _seconds(value: str, unit: str, what: str) -> float:
    if unit not in _TIME_UNITS:
        raise ValueError(f"{what}: unknown time unit {unit!r} (use s, ms, m or h)")
    return float(value) * _TIME_UNITS[unit]


def _bytes(value: str, unit: str, what: str) -> float:
    if unit not in _SIZE_UNITS:
        raise ValueError(f"{what}: unknown size unit {unit!r} (use KB, MB, GB, KiB, MiB or GiB)")
    return float(value) * _SIZE_UNITS[unit]


def parse_trigger(text: str, defaults: dict[str, Any] | None = None) -> TriggerSpec:
    """``"cpu > 80% for 10s, after 60s"`` -> a :class:`TriggerSpec`; raises ValueError with a message for the user.

    ``defaults`` may give ``before``, ``after`` and ``budget`` (text or numbers) for options the text leaves out.
    """
    what = f"trigger {text.strip()!r}"
    head, *options = [part.strip() for part in text.split(",")]
    m = _COND_RE.match(head) if head else None
    if m is None:
        raise ValueError(
            f"{what}: write it like 'cpu > 80% for 10s', 'rss > 2GB', 'rss + 50MB/s', 'blocked > 5s' or 'mark:NAME'"
        )
    for_s = _seconds(m["for"], m["funit"].lower(), what) if m["for"] is not None else None
    kind: Kind
    pattern = ""
    if m["pct"] is not None:
        kind, threshold = "cpu", float(m["pct"]) / 100.0
        for_s = DEFAULT_CPU_FOR_S if for_s is None else for_s
    elif m["size"] is not None:
        kind, threshold = "rss", _bytes(m["size"], m["sunit"].lower(), what)
    elif m["rate"] is not None:
        kind, threshold = "rss_growth", _bytes(m["rate"], m["runit"].lower(), what)
        for_s = DEFAULT_GROWTH_FOR_S if for_s is None else for_s
        if for_s < CHECK_S:
            raise ValueError(f"{what}: growth is measured over some time: give for 1s or more")
    elif m["block"] is not None:
        kind, threshold = "blocked", _seconds(m["block"], m["bunit"].lower(), what)
    else:
        kind, threshold, pattern = "mark", 0.0, m["mark"]
    if kind in ("blocked", "mark") and m["for"] is not None:
        raise ValueError(f"{what}: 'for' applies to cpu and rss conditions")
    settings = dict(defaults or {})
    for option in options:
        om = re.fullmatch(r"(before|after|budget)\s*[= ]\s*(\S+)", option.lower())
        if om is None:
            raise ValueError(f"{what}: unknown option {option!r} (before 20s, after 30s or budget 10%)")
        settings[om[1]] = om[2]
    spec = TriggerSpec(
        kind=kind,
        threshold=threshold,
        for_s=for_s or 0.0,
        pattern=pattern,
        name=text.strip(),
        **parse_options(settings, what),
    )
    return spec.checked()


def parse_options(settings: dict[str, Any], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("before", "after"):
        if key in settings and settings[key] is not None:
            value = settings[key]
            if isinstance(value, int | float):
                out[f"{key}_s"] = float(value)
            else:
                sm = re.fullmatch(rf"{_NUM}\s*([a-z]*)", str(value).strip().lower())
                if sm is None:
                    raise ValueError(f"{what}: {key} {value!r} is not a duration (e.g. 30s, 2m)")
                out[f"{key}_s"] = _seconds(sm[1], sm[2], what)
    if settings.get("budget") is not None:
        try:
            out["budget"] = parse_budget(settings["budget"])
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
    return out


def load_file(path: str) -> list[TriggerSpec]:
    """The triggers of a TOML file: top-level before/after/budget as defaults, then ``[[trigger]] when = ...``."""
    import tomllib

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not TOML: {exc}") from None
    unknown = set(data) - {"before", "after", "budget", "trigger"}
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (before, after, budget, [[trigger]])")
    defaults = {k: data[k] for k in ("before", "after", "budget") if k in data}
    entries = data.get("trigger", [])
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: no [[trigger]] tables (each with when = 'cpu > 80% for 10s' or the like)")
    specs = []
    for i, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("when"), str):
            raise ValueError(f"{path}: trigger {i} has no when = '...'")
        extra = set(entry) - {"when", "before", "after", "budget"}
        if extra:
            raise ValueError(f"{path}: trigger {i}: unknown key(s) {', '.join(sorted(extra))}")
        own = {**defaults, **{k: entry[k] for k in ("before", "after", "budget") if k in entry}}
        try:
            specs.append(parse_trigger(entry["when"], own))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    return specs


# --- checking, in the agent ------------------------------------------------------------


@dataclass
class Fired:
    spec: TriggerSpec
    #: what was seen, in words: "process CPU 97% for 5 s"
    why: str


@dataclass
class _State:
    spec: TriggerSpec
    predicate: Callable[[], object] | None = None
    #: when the condition started to hold (None: it does not)
    since: float | None = None
    #: fired, and not yet re-armed (the condition must stop holding and the event end first)
    fired_until: float | None = None
    next_call: float = 0.0
    #: rss_growth: (time, rss) over the span
    history: deque[tuple[float, int]] = field(default_factory=deque)
    off: str | None = None


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class Triggers:
    """The configured triggers and what their conditions have looked like so far; the sampler thread's own."""

    def __init__(self, specs: Iterable[TriggerSpec], clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.states: list[_State] = []
        self.errors: list[str] = []
        for spec in specs:
            self.add(spec)
        self._last: tuple[float, float] | None = None
        #: thread ident -> (leaf key, since) of a thread waiting for a lock
        self._waiting: dict[int, tuple[int, float]] = {}
        #: leaf key -> (waits for a lock, where, in words)
        self._leaf_kinds: dict[int, tuple[bool, str]] = {}
        self._marks: deque[str] = deque(maxlen=256)

    def add(self, spec: TriggerSpec, predicate: Callable[[], object] | None = None) -> None:
        if len(self.states) >= MAX_TRIGGERS:
            raise ValueError(f"at most {MAX_TRIGGERS} triggers")
        self.states.append(_State(spec, predicate))

    @property
    def wants_marks(self) -> bool:
        return any(s.spec.kind == "mark" for s in self.states)

    def marked(self, name: str) -> None:
        """agent.mark(name) was called (any thread: a deque's append is atomic)."""
        self._marks.append(name)

    def check(self, now: float, skip: frozenset[int] = frozenset()) -> list[Fired]:
        """Evaluate every condition at ``now``; the triggers that fire.

        ``skip``: threads that are not the application's.
        """
        fired: list[Fired] = []
        cpu = self._cpu_fraction(now) if any(s.spec.kind == "cpu" for s in self.states) else None
        need_rss = any(s.spec.kind in ("rss", "rss_growth") for s in self.states)
        rss = procfs.rss_bytes() if need_rss else None
        blocked = self._blocked(now, skip) if any(s.spec.kind == "blocked" for s in self.states) else None
        marks = []
        while self._marks:
            marks.append(self._marks.popleft())
        for state in self.states:
            if state.off is not None:
                continue
            spec = state.spec
            holding, why = self._condition(state, now, cpu, rss, blocked, marks)
            if state.fired_until is not None:
                # Re-armed once the event is over and the condition has stopped holding.
                if now >= state.fired_until and not holding:
                    state.fired_until = None
                state.since = None if not holding else state.since
                continue
            if not holding:
                state.since = None
                continue
            if state.since is None:
                state.since = now
            if spec.kind in ("cpu", "rss") and now - state.since < spec.for_s:
                continue
            state.fired_until = now + spec.after_s
            fired.append(Fired(spec, why))
        return fired

    def _condition(
        self,
        state: _State,
        now: float,
        cpu: float | None,
        rss: int | None,
        blocked: tuple[float, str] | None,
        marks: list[str],
    ) -> tuple[bool, str]:
        spec = state.spec
        if spec.kind in ("rss", "rss_growth") and rss is None:
            state.off = "no /proc/self/statm here: rss triggers are off"
            self.errors.append(state.off)
            return False, ""
        if spec.kind == "cpu":
            if cpu is None:
                return False, ""
            held = now - state.since if state.since is not None else 0.0
            return cpu > spec.threshold, f"process CPU {100 * cpu:.0f}% for {max(held, spec.for_s):.0f} s"
        if spec.kind == "rss":
            assert rss is not None
            return rss > spec.threshold, f"RSS {rss / 1e6:.0f} MB"
        if spec.kind == "rss_growth":
            assert rss is not None
            history = state.history
            history.append((now, rss))
            while len(history) > 1 and now - history[1][0] >= spec.for_s:
                history.popleft()
            t0, rss0 = history[0]
            if now - t0 < spec.for_s * 0.9:
                return False, ""
            rate = (rss - rss0) / (now - t0)
            return rate > spec.threshold, f"RSS grew {rate / 1e6:.1f} MB/s over {now - t0:.0f} s, to {rss / 1e6:.0f} MB"
        if spec.kind == "blocked":
            if blocked is None or blocked[0] <= spec.threshold:
                return False, ""
            return True, blocked[1]
        if spec.kind == "mark":
            hit = next((m for m in marks if fnmatch.fnmatchcase(m, spec.pattern)), None)
            return hit is not None, f"mark {hit!r}"
        # a predicate, called every every_s at most
        if now < state.next_call or state.predicate is None:
            return state.since is not None, "the predicate held"
        state.next_call = now + spec.every_s
        t0 = time.perf_counter()
        try:
            result = bool(state.predicate())
        except Exception as exc:  # the user's code must not stop the agent
            state.off = f"trigger {spec.describe()!r}: its predicate raised {type(exc).__name__}: {exc}; switched off"
            self.errors.append(state.off)
            return False, ""
        took = time.perf_counter() - t0
        if took > MAX_PREDICATE_S:
            state.off = (
                f"trigger {spec.describe()!r}: its predicate took {1000 * took:.1f} ms (at most "
                f"{1000 * MAX_PREDICATE_S:g} ms: it runs holding the GIL); switched off"
            )
            self.errors.append(state.off)
        return result, "the predicate held"

    def _cpu_fraction(self, now: float) -> float | None:
        cpu = _cpu_s()
        last, self._last = self._last, (now, cpu)
        if last is None or now <= last[0]:
            return None
        return (cpu - last[1]) / (now - last[0])

    def _blocked(self, now: float, skip: frozenset[int]) -> tuple[float, str] | None:
        """The thread that has waited longest for a lock at one place: (seconds, in words); None if none waits."""
        from dyper.agent.tables import wait_kind

        frames = sys._current_frames()
        waiting: dict[int, tuple[int, float]] = {}
        longest: tuple[float, int, str] | None = None
        for tid, frame in frames.items():
            if tid in skip:
                continue
            code = frame.f_code
            key = (frame.f_lasti << 48) | id(code)
            known = self._leaf_kinds.get(key)
            if known is None:
                where = f"{code.co_qualname} ({os.path.basename(code.co_filename)}:{frame.f_lineno})"
                known = (wait_kind(code, frame.f_lasti) == LOC_LOCK, where)
                if len(self._leaf_kinds) < 10_000:
                    self._leaf_kinds[key] = known
            if not known[0]:
                continue
            previous = self._waiting.get(tid)
            since = previous[1] if previous is not None and previous[0] == key else now
            waiting[tid] = (key, since)
            if longest is None or now - since > longest[0]:
                longest = (now - since, tid, known[1])
        del frames
        self._waiting = waiting
        if longest is None:
            return None
        waited, tid, where = longest
        return waited, f"a thread ({_thread_name(tid)}) waited {waited:.0f} s for a lock in {where}"


def _thread_name(ident: int) -> str:
    import threading

    thread = threading._active.get(ident)  # type: ignore[attr-defined]  # read-only
    return thread.name if thread is not None else f"thread {ident}"


Counts = dict[tuple[int, tuple[int, ...]], int]


class Ring:
    """What was counted at each second since the last report, so a report can be split at an instant past.

    Each cut keeps a copy of the counts as they were then (a dict copy, tens
    of microseconds for thousands of stacks: cheaper than a difference each
    second); a split takes the difference once, against the latest cut at or
    before the instant. Cut once a second, and only while triggers are
    configured; emptied with every report, as the counts are.
    """

    def __init__(self, max_slices: int = int(DEFAULT_BEFORE_S / CHECK_S) + 2) -> None:
        #: (time, samples, counts) at each cut, oldest first
        self.slices: deque[tuple[float, int, Counts]] = deque(maxlen=max_slices)
        #: when the counts began (the report window's start); None: not yet known
        self.start: float | None = None

    def clear(self, start: float) -> None:
        self.slices.clear()
        self.start = start

    def resize(self, before_s: float) -> None:
        """Keep enough cuts for a "before" of ``before_s``."""
        wanted = int(before_s / CHECK_S) + 2
        if wanted != self.slices.maxlen:
            self.slices = deque(self.slices, maxlen=wanted)

    def cut(self, now: float, counts: Counts, samples: int) -> None:
        if len(counts) > RING_MAX_STACKS:
            # Copies this large every second cost more than a split is worth: this
            # window is not split (an event's begins at the report window's start).
            self.clear(math.inf)
            return
        if len(self.slices) == self.slices.maxlen:
            # The oldest copy leaves: the window can no longer be split before the next one.
            self.start = self.slices[1][0]
        self.slices.append((now, samples, dict(counts)))

    def since(self, cut: float, counts: Counts, samples: int) -> tuple[float, int, Counts] | None:
        """(where the split falls, samples, counts) of what came after the latest cut at or before ``cut``.

        The split falls at or before ``cut``, so the part before it ends
        outside a window that begins at ``cut``. None when the window began
        at or after ``cut``, or no cut was made after it began and by ``cut``.
        """
        if self.start is None or self.start >= cut:
            return None
        at = None
        for entry in self.slices:
            if entry[0] > cut:
                break
            at = entry
        if at is None:
            return None
        boundary, then_samples, then = at
        after = {k: v - then.get(k, 0) for k, v in counts.items() if v != then.get(k, 0)}
        return boundary, samples - then_samples, after
