"""The native sampler's Python side (the C thread is agent/_native.c).

The C thread reads every thread's stack without the GIL, at random instants,
with each thread's state from the kernel and the GIL. This module gives the
agent that thread behind the interface it already drives for the C ticker
(``ticker_start``, ``ticker_set``, ``ticker_stats``, ``ticker_drain``,
``ticker_stop`` of agent/_fastsample.c), so the loop, the plan and the
budget guard stay as they are, and turns the raw states into what the
monitor already understands: a stack's leaf location says whether the thread
was running or waiting. A thread that the kernel had asleep while its leaf
is no blocking call was waiting for the GIL, and one the kernel had runnable
whose CPU clock did not move was in the run queue: such samples get one more
leaf frame, ``<waiting for the GIL>`` or ``<run queue>`` (file
``<dyper state>``), flagged blocking, so the CPU view leaves them out and
the wall view shows them where they happened.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import CodeType
from typing import Any, Final

from dyper.agent.protocol import GIL_WAIT, LOC_BLOCKING, LOC_GIL, LOC_RUNQ, LOC_WAIT, RUN_QUEUE, STATE_FILE
from dyper.agent.tables import WAITS, Tables

_native: Any
try:
    _native = importlib.import_module("dyper.agent._native")
    IMPORT_ERROR: Final = ""
except ImportError as exc:  # not built here, or its self-check refused this interpreter
    _native = None
    IMPORT_ERROR = str(exc) or type(exc).__name__  # type: ignore[misc]  # set once, in one branch

#: The native sampler is what the agent uses when it is there, unless
#: DYPER_SAMPLER=gil. (False: only with DYPER_SAMPLER=native.)
DEFAULT_NATIVE: Final = True

#: The frames put on a leaf to say what the thread was doing are wall time
#: only (blocking), of their own kind (proflets.base.KINDS: "gil", "runq").
#: LOC_WAIT too: a monitor from before those kinds counts them as waits.
_STATE_FLAGS: Final = {GIL_WAIT: LOC_BLOCKING | LOC_WAIT | LOC_GIL, RUN_QUEUE: LOC_BLOCKING | LOC_WAIT | LOC_RUNQ}
_STATE_CODES: Final = {
    name: compile("0", STATE_FILE, "eval").replace(co_name=name, co_qualname=name) for name in _STATE_FLAGS
}

#: Raw states (agent/_native.c), by name.
_STATES: Final = {name: i for i, name in enumerate(_native.STATES)} if _native is not None else {}
_SLEEP: Final = _STATES.get("sleep", -1)
_RUNQ: Final = _STATES.get("runq", -1)


def available() -> bool:
    return _native is not None


def choose_sampler(env: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """Which sampler the agent runs ("native" or "gil") and why, in a few words."""
    forced = env.get("DYPER_SAMPLER", "").strip().lower()
    if forced == "gil":
        return "gil", "DYPER_SAMPLER=gil"
    if _native is None:
        return "gil", f"no native sampler: {IMPORT_ERROR}"
    if forced == "native":
        return "native", "DYPER_SAMPLER=native"
    if not DEFAULT_NATIVE:
        return "gil", "the native sampler is opt-in: DYPER_SAMPLER=native"
    return "native", "stacks read without the GIL"


class NativeTicker:
    """agent/_native.c's sampler thread, driven like agent/_fastsample.c's ticker."""

    def __init__(self, tables: Tables, drain_at: int) -> None:
        self.tables = tables
        #: the queue length (in sampling instants) at which the agent drains
        self.drain_at = drain_at
        #: the sampler thread's CPU time in runs that ended (its clock ends with it)
        self._cpu_before = 0.0
        #: (epoch, state) -> the location of a state frame in that epoch
        self._state_locs: dict[tuple[int, str], int] = {}
        self._last_counters: dict[str, int] = {}
        #: the statistics ticker_stats() read last, for counters()
        self._stats: dict[str, Any] | None = None

    def ticker_start(self, skip_ident: int, wake_fd: int) -> None:
        _native.start(skip_ident, wake_fd)

    def ticker_set(self, mean_s: float, spread: float, rate: float, tokens: float, cap: float) -> None:
        _native.set(mean_s, spread, max(rate, 0.0), tokens, cap)

    def ticker_stop(self) -> None:
        if _native.stats()["running"]:
            _native.stop()
            self._cpu_before += float(_native.stats()["sampler_cpu_s"])

    def ticker_stats(self) -> dict[str, Any]:
        """The ticker's statistics, as far as they mean something here (nothing runs in the app's threads)."""
        s = _native.stats()
        self._stats = s
        queued = s["queued_ticks"]
        if s["queued"] >= _native.RING_SAMPLES // 4:
            # Many threads: the ring fills in fewer instants than the agent waits for.
            queued = max(queued, self.drain_at)
        return {
            "queued": queued,
            "dropped": s["overflow"],
            "app_cpu_s": 0.0,
            "ticker_cpu_s": self._cpu_before + (s["sampler_cpu_s"] if s["running"] else 0.0),
            "handoff_s": 0.0,
            "latency_s": s["late_s"],
            "tick_cost_s": s["cost_s"],  # the thread's CPU per instant, a moving average kept at every instant
            "latency_floor_s": 0.0,
            "ticks": s["ticks"],
            "busy_ticks": 0,
        }

    def counters(self) -> dict[str, int]:
        """Reads dropped since the last call, by why (for the report's ``dropped``).

        From the statistics ticker_stats() just read, if it did (the agent
        asks for both at each look at the sampler): one stats() a look.
        """
        s = self._stats if self._stats is not None else _native.stats()
        self._stats = None
        now = {
            "native_lost": s["lost"],  # thread samples given up (every walk torn or failing a check)
            "native_torn": s["torn"],
            "native_bad": s["bad"],
            "native_invalid": s["invalid"] + s["dropped"],
        }
        last = self._last_counters or dict.fromkeys(now, 0)
        self._last_counters = now
        return {k: v - last[k] for k, v in now.items() if v > last[k]}

    def ticker_drain(
        self,
        counts: dict[tuple[int, tuple[int, ...]], int],
        locs: dict[int, int],
        new_loc: Any,
        waiting: bytearray | None = None,
        activity: list[int] | None = None,
        pending: list[tuple[int, ...]] | None = None,
    ) -> int:
        """Move the ring's samples into ``counts``; returns how many sampling instants they were.

        ``activity`` (the histogram of threads ready to run: on a CPU, in the
        run queue or waiting for the GIL) is filled from the kernel's view and
        the leaves; ``waiting`` and ``pending`` are the ticker's way to the
        same and are not needed here.
        """
        raw: dict[tuple[int, int, tuple[int, ...]], int] = {}
        asleep: list[tuple[int, ...]] = []
        n = int(_native.drain(raw, locs, new_loc, activity, asleep if activity is not None else None))
        if raw:
            self._fold(raw, counts)
        if asleep and activity is not None:
            # Instants with threads asleep without the GIL: those whose leaf
            # is no blocking call were waiting for it (_fold decided the leaves).
            tables, top = self.tables, len(activity) - 1
            for instant in asleep:
                ready = instant[0] + sum(1 for loc in instant[1:] if not tables.waits(loc))
                activity[min(ready, top)] += 1
        return n

    def _fold(
        self, raw: dict[tuple[int, int, tuple[int, ...]], int], counts: dict[tuple[int, tuple[int, ...]], int]
    ) -> None:
        tables = self.tables
        tables.flag_leaves({stack[0] for (_tid, state, stack) in raw if state == _SLEEP and stack})
        for (tid, state, stack), n in raw.items():
            if state == _SLEEP and stack and not tables.waits(stack[0]):
                stack = (self._state_loc(GIL_WAIT), *stack)
            elif state == _RUNQ:
                stack = (self._state_loc(RUN_QUEUE), *stack)
            k = (tid, stack)
            counts[k] = counts.get(k, 0) + n

    def _state_loc(self, name: str) -> int:
        tables = self.tables
        loc = self._state_locs.get((tables.epoch, name))
        if loc is not None:
            return loc
        code: CodeType = _STATE_CODES[name]
        loc = tables.new_loc(id(code), code, 0, 0)
        tables.loc_rows[loc][5] |= _STATE_FLAGS[name]
        waiting = tables.waiting
        if len(waiting) <= loc:
            waiting.extend(bytes(loc + 1 - len(waiting)))
        waiting[loc] = WAITS
        self._state_locs = {k: v for k, v in self._state_locs.items() if k[0] == tables.epoch}
        self._state_locs[(tables.epoch, name)] = loc
        return loc
