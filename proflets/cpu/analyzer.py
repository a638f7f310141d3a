"""The cpu proflet's monitor half (see :mod:`dyper.proflets.cpu`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dyper.agent.protocol import STATE_FILE
from dyper.monitor.model.lights import cpu_light
from dyper.proflets.base import Analyzer, SessionView, Status, WindowView

Key = tuple[str, str, int]


#: A function with at least this share of the cpu samples is a detailing candidate.
CANDIDATE_PCT = 5.0


def priority(session: SessionView, window_s: float = 10.0) -> float:
    """PRTY of cpu detailing for a session: how CPU-bound it is and how many candidates there are.

    CPU-boundness is running threads per sampling pass (1 or more: at least
    one thread always runs); candidates are functions with at least
    CANDIDATE_PCT of the cpu samples. A process with nothing hot gets a low
    priority, not zero, so its first candidates still get counted.
    """
    # Asked after every report: the last seconds' cpu samples by leaf frame are kept as
    # running sums, so a report's stacks are looked at once, not once per report in the window.
    by_leaf, passes = session.recent("cpu", window_s, cpu_by_leaf)
    if passes <= 0:
        return 0.1
    frames = session.frames.frames
    cpu_total = 0
    by_function: dict[tuple[str, str, int], int] = {}
    for fid, cpu in by_leaf.items():
        cpu_total += cpu
        f = frames[fid].function
        by_function[f] = by_function.get(f, 0) + cpu
    if cpu_total == 0:
        return 0.1
    candidates = sum(1 for n in by_function.values() if 100.0 * n / cpu_total >= CANDIDATE_PCT)
    busy = min(1.0, cpu_total / passes)
    return max(0.1, busy * (0.5 + 0.5 * min(1.0, candidates / 4)))


def cpu_by_leaf(window: WindowView) -> dict[int, int]:
    """A window's cpu samples by the frame id of the stack's leaf."""
    table = window.table
    out: dict[int, int] = {}
    for i, _, cpu in window.items():
        if cpu:
            stack = table[i][1]
            if stack:
                leaf = stack[-1]
                out[leaf] = out.get(leaf, 0) + cpu
    return out


# --- monitor half ------------------------------------------------------------------


class CpuAnalyzer(Analyzer):
    """Per function and line shares from the session's stacks, with the call counts detailing measured."""

    name = "cpu"
    FROM_SAMPLES = True
    #: native rows in the report, and the share of a function's time a C
    #: call must take to be a finding
    NATIVE_ROWS = 30
    NATIVE_FINDING_PCT = 30.0

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        #: over every native burst: each candidate's own time (s), and
        #: (function, callee) -> [calls, seconds] of the C calls it made
        self.native_own: dict[Key, float] = {}
        self.native_calls: dict[tuple[Key, str], list[float]] = {}

    def merge_detail(self, burst: Mapping[str, Any]) -> None:
        native = burst.get("native")
        if not isinstance(native, Mapping):
            return
        try:
            for file, name, line, sec in native.get("functions") or ():
                key = (str(file), str(name), int(line))
                self.native_own[key] = self.native_own.get(key, 0.0) + float(sec)
            for file, name, line, callee, n, sec in native.get("callees") or ():
                slot = self.native_calls.setdefault(((str(file), str(name), int(line)), str(callee)), [0.0, 0.0])
                slot[0] += int(n)
                slot[1] += float(sec)
        except (TypeError, ValueError):
            return  # a malformed burst adds nothing

    def native_rows(self) -> list[dict[str, Any]]:
        """The C calls the candidates made, dearest first: Paradyn-J's VM-interaction cost per method."""
        # A function's own time counts only its activations that began and
        # ended inside a burst; its C calls count each call that did. One
        # that ran across a burst's edge (a loop that never returns) has C
        # calls timed and little or no own time: its share is not known
        # (None), never above 100% nor a finding.
        calls_s: dict[Key, float] = {}
        for (key, _), (_, sec) in self.native_calls.items():
            calls_s[key] = calls_s.get(key, 0.0) + sec
        rows: list[dict[str, Any]] = []
        for (key, callee), (n, sec) in sorted(self.native_calls.items(), key=lambda kv: -kv[1][1]):
            own = self.native_own.get(key, 0.0)
            rows.append(
                {
                    "function": key[1],
                    "file": key[0],
                    "line": key[2],
                    "callee": callee,
                    "calls": int(n),
                    "seconds": sec,
                    "pct_of_function": 100.0 * sec / own if own > 0 and calls_s[key] <= own else None,
                }
            )
            if len(rows) == self.NATIVE_ROWS:
                break
        return rows

    def state(self) -> dict[str, Any]:
        # the shape of a burst's "native" part, so restoring is merging one
        return {
            "functions": [[*k, v] for k, v in self.native_own.items()],
            "callees": [[*k, c, n, sec] for (k, c), (n, sec) in self.native_calls.items()],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.merge_detail({"native": state})

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        """What detailing measured: call rates (whole run) and native rows.

        The tables themselves are made by the report from the window's profile
        (:func:`dyper.monitor.report.cpu_section`), with these rates.
        """
        counted = self.session.calls
        # No call counted in all the seconds counted says nothing of a rate
        # (a call that began before the bursts and runs on): no rate, not 0/s.
        rates = [
            {"file": k[0], "name": k[1], "line": k[2], "calls_per_s": rate, "counted_s": counted[k][1]}
            for k, rate in self.session.calls_per_s().items()
            if counted[k][0] > 0
        ]
        return {"call_rates": rates, "native": self.native_rows()}

    def _busy(self) -> tuple[Status, dict[Key, int]]:
        """The cpu light over the whole run, and the cpu samples per function at the stacks' leaves."""
        session = self.session
        frames = session.frames.frames
        cpu_total = ready = 0
        own: dict[Key, int] = {}
        for (_, stack), (wall, cpu) in session.counts.items():
            cpu_total += cpu
            if cpu and stack:
                key = frames[stack[-1]].function
                own[key] = own.get(key, 0) + cpu
            elif stack and frames[stack[-1]].file == STATE_FILE:
                # the native sampler's threads ready for the CPU: waiting for the GIL or in the run queue
                ready += wall
        return cpu_light(cpu_total + ready, session.samples), own

    def status(self) -> Status:
        # The light says how CPU-bound the process is: the share of sampling
        # passes that found a thread on the CPU (or ready for it).
        return self._busy()[0]

    def priority(self) -> float | None:
        return priority(self.session)

    def findings(self) -> list[str]:
        said = [
            f"{r['callee']} inside {r['function']}() is {r['pct_of_function']:.0f}% of {r['function']}()'s time "
            f"(native time, {r['calls']:,} calls measured)"
            for r in self.native_rows()[:3]
            if (r["pct_of_function"] or 0.0) >= self.NATIVE_FINDING_PCT
        ]
        light, own = self._busy()
        busy, samples = light.problem, self.session.samples
        if samples < 50 or busy < 0.5 or not own:
            return said
        (_, name, _), top = max(own.items(), key=lambda kv: kv[1])
        top_pct = 100.0 * top / sum(own.values())
        if top_pct < 10:
            return said
        return [
            f"the process is CPU-bound ({busy:.0%} of samples on the CPU); {name} takes "
            f"{top_pct:.0f}% of the CPU samples itself",
            *said,
        ]


ANALYZER = CpuAnalyzer
