"""Time windows: which of a session's reports a profile covers.

A window is a slice of one session's reports between two times. Each end is
open (the session's first or latest report), an absolute time, or an offset
from the session's first or latest report, so "the last 60 s", "the whole
run", "from 10:00 to 10:05" and "the first five minutes" are all one type.
A report belongs to a window when the time it ends (its ``t``) falls in
``(start, end]``; agents report every 1 to 30 s, so a window's edges are
that coarse.

The monitor resolves a :class:`WindowSpec` against a session
(:meth:`WindowSpec.resolve`) and builds the profile from its in-memory
reports and, for older ones, its history (``Monitor.window_profile``).
Clients send the spec as plain data (:meth:`WindowSpec.to_json`).

Text form (``dyper export --window START:END``), each side one of::

    (empty)                 open: the session's first / latest report
    -N[s|m|h|d]             N before the session's latest report ("now" for a live process)
    N[s|m|h|d], +N[s|m|h|d] N after the session's first report
    @UNIX                   an absolute time, seconds since the epoch
    YYYY-MM-DDTHH:MM[:SS]   an absolute local time
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

Base = Literal["abs", "first", "last"]

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_ISO = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?"
_EPOCH = r"@\d+(?:\.\d+)?"
_OFFSET = r"[+-]?\d+(?:\.\d+)?[smhd]?"
_SIDE = rf"(?:{_ISO}|{_EPOCH}|{_OFFSET})?"
_WINDOW_RE = re.compile(rf"^\s*({_SIDE})\s*:\s*({_SIDE})\s*$")


@dataclass(frozen=True)
class TimeRef:
    """One end of a window: an absolute time, or an offset from the session's first or latest report."""

    base: Base
    value: float

    def resolve(self, first_t: float | None, last_t: float | None) -> float | None:
        if self.base == "abs":
            return self.value
        anchor = first_t if self.base == "first" else last_t
        return None if anchor is None else anchor + self.value

    def describe(self) -> str:
        if self.base == "abs":
            return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.value))
        where = "the first report" if self.base == "first" else "the latest report"
        if self.value == 0:
            return where
        return f"{_seconds(abs(self.value))} {'after' if self.value > 0 else 'before'} {where}"


@dataclass(frozen=True)
class WindowSpec:
    """A slice of a session's reports; ``None`` ends are open. ``WindowSpec()`` is the whole run."""

    start: TimeRef | None = None
    end: TimeRef | None = None

    @classmethod
    def last(cls, seconds: float) -> WindowSpec:
        """The last ``seconds`` before the session's latest report ("now")."""
        if not seconds > 0:
            raise ValueError("a window's length must be positive")
        return cls(TimeRef("last", -float(seconds)))

    @classmethod
    def between(cls, start: float | None, end: float | None) -> WindowSpec:
        """Absolute times (seconds since the epoch); None for an open end."""
        return cls(
            None if start is None else TimeRef("abs", float(start)),
            None if end is None else TimeRef("abs", float(end)),
        )

    @classmethod
    def parse(cls, text: str) -> WindowSpec:
        """``START:END`` (see the module docstring). Raises ValueError with a message for the user."""
        m = _WINDOW_RE.match(text)
        if m is None:
            raise ValueError(
                f"window {text!r} is not START:END; each side empty, -N (before the latest report), "
                "N (after the first report), @UNIX or YYYY-MM-DDTHH:MM:SS, with s/m/h/d units, e.g. -10m:"
            )
        return cls(_parse_side(m.group(1)), _parse_side(m.group(2)))

    @property
    def whole(self) -> bool:
        return self.start is None and self.end is None

    def resolve(self, first_t: float | None, last_t: float | None) -> tuple[float | None, float | None]:
        """Absolute ``(start, end)`` for a session whose reports run from ``first_t`` to ``last_t``."""
        start = self.start.resolve(first_t, last_t) if self.start is not None else None
        end = self.end.resolve(first_t, last_t) if self.end is not None else None
        return start, end

    def describe(self) -> str:
        if self.whole:
            return "whole run"
        if self.end is None and self.start is not None and self.start.base == "last" and self.start.value < 0:
            return f"last {_seconds(-self.start.value)}"
        start = self.start.describe() if self.start is not None else "the start"
        end = self.end.describe() if self.end is not None else "the latest report"
        return f"from {start} to {end}"

    def to_json(self) -> dict[str, Any]:
        return {
            "start": None if self.start is None else [self.start.base, self.start.value],
            "end": None if self.end is None else [self.end.base, self.end.value],
        }

    @classmethod
    def from_json(cls, data: Any) -> WindowSpec:
        """The wire form; raises ValueError on anything else."""
        if not isinstance(data, dict):
            raise ValueError("window: give {start, end}")
        return cls(_ref_from_json(data.get("start")), _ref_from_json(data.get("end")))


def _ref_from_json(value: Any) -> TimeRef | None:
    if value is None:
        return None
    if (
        isinstance(value, list | tuple)
        and len(value) == 2
        and value[0] in ("abs", "first", "last")
        and isinstance(value[1], int | float)
        and not isinstance(value[1], bool)
        and value[1] == value[1]  # not NaN
    ):
        return TimeRef(value[0], float(value[1]))
    raise ValueError(f"window: bad end {value!r}: give [abs|first|last, seconds] or null")


def _parse_side(text: str) -> TimeRef | None:
    text = text.strip()
    if not text:
        return None
    if text.startswith("@"):
        return TimeRef("abs", float(text[1:]))
    if re.fullmatch(_ISO, text):
        return TimeRef("abs", datetime.fromisoformat(text.replace(" ", "T")).timestamp())
    unit = text[-1] if text[-1] in "smhd" else ""
    number = float(text[: len(text) - len(unit)])
    seconds = number * _UNITS[unit]
    if text.startswith("-"):
        return TimeRef("last", seconds)
    return TimeRef("first", seconds)


def parse_seconds(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d`` -> seconds. Raises ValueError."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if m is None:
        raise ValueError(f"{text!r} is not a duration: write it like 90s, 15m, 12h or 7d")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _seconds(s: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if s >= size and s % size == 0:
            return f"{s / size:g}{unit}"
    return f"{s:g}s"
