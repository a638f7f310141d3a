"""The threads proflet's monitor half (see :mod:`dyper.proflets.threads`)."""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Any

from dyper.proflets.base import KINDS, Analyzer, ReportView, SessionView, Status, confidence_of

# --- agent half ------------------------------------------------------------------------


# --- monitor half -----------------------------------------------------------------------

#: per-thread row: samples by kind, then CPU seconds in the window and the window's length
_RUN, _CPU, _SECONDS = 0, len(KINDS), len(KINDS) + 1

#: a report's rows as kept: thread idents, their samples by kind (flat), their CPU seconds
#: (None: all 0), the window's length and sampling passes, and who blocked whom (None: nobody)
_Row = tuple[tuple[int, ...], "array[Any]", "array[float] | None", float, int, "dict[int, int] | None"]
#: A thread asleep this much of the time is named among the sleepers ...
SLEEP_FINDING_PCT = 50.0
#: ... and the finding names this many of them.
SLEEPERS_NAMED = 5


def learn_names(names: dict[int, str], report: ReportView) -> None:
    """Add a report's thread names to ``names``: the agent's, then the collector's for threads that ended.

    A stand-in ("thread-<ident>", from an agent that no longer finds the
    thread) never replaces a name already known.
    """
    for ident, name in report.threads.items():
        if ident not in names or name != f"thread-{ident}":
            names[ident] = name
    for ident, name in (report.data or {}).get("names") or ():
        names[int(ident)] = str(name)


def _seconds(row: list[float], window_s: float, samples: int) -> float:
    """How long a thread was seen in a window: its share of the sampling passes, of the window."""
    seen = sum(row[: len(KINDS)])
    return window_s * min(1.0, seen / samples) if samples else 0.0


#: Kinds in histories written before the native sampler's "gil" and "runq".
_OLD_KINDS = 5


def _upgraded(total: list[float]) -> list[float]:
    """A saved row of totals with as many kinds as KINDS (older ones had fewer: none of the new)."""
    if len(total) == _OLD_KINDS + 2:
        return total[:_OLD_KINDS] + [0.0] * (len(KINDS) - _OLD_KINDS) + total[_OLD_KINDS:]
    return total


class ThreadsAnalyzer(Analyzer):
    name = "threads"
    FROM_SAMPLES = True

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        #: ident -> last cumulative CPU seconds seen (to turn them into deltas)
        self._cpu_seen: dict[int, float] = {}
        self.names: dict[int, str] = {}
        #: whole run: ident -> [samples per kind..., cpu seconds, seconds observed]
        self.totals: dict[int, list[float]] = {}
        #: whole run: blocked ident -> {owner ident: reports seen blocked by it}
        self.blockers: dict[int, dict[int, int]] = {}
        #: whole run: ident -> [bursts seconds, ns on CPU, ns waiting for a CPU, voluntary, involuntary]
        self.detail: dict[int, list[float]] = {}
        self.samples = 0
        #: the collector has sent thread CPU clocks: without them (the proflet
        #: is off in the agent) running cannot be told from waiting for the GIL
        self.clocks = False
        #: the thread idents of the last report (the next one's rows share them when they are the same)
        self._idents: tuple[int, ...] = ()

    def merge(self, report: ReportView) -> None:
        learn_names(self.names, report)
        data = report.data or {}
        if "threads" in data:
            self.clocks = True
        cpu_delta: dict[int, float] = {}
        for row in data.get("threads") or ():
            ident, cpu = int(row[0]), float(row[2])
            last = self._cpu_seen.get(ident)
            # Cumulative since profiling began; less than last time is a new
            # thread under a reused ident (or a new agent), counted from zero.
            cpu_delta[ident] = cpu - last if last is not None and cpu >= last else cpu
            self._cpu_seen[ident] = cpu
        rows: dict[int, list[float]] = {}
        for ident, kinds in report.kinds.items():
            row = [float(kinds.get(k, 0)) for k in KINDS] + [cpu_delta.get(ident, 0.0), 0.0]
            row[_SECONDS] = _seconds(row, report.window_s, report.samples)
            rows[ident] = row
        for ident, delta in cpu_delta.items():
            rows.setdefault(ident, [0.0] * len(KINDS) + [delta, 0.0])
        blocked = {int(b): int(o) for b, o in data.get("blocked_by") or ()}
        self.rows.append((report.t, self._compact(rows, blocked, report)))
        self.samples += report.samples
        for ident, row in rows.items():
            total = self.totals.setdefault(ident, [0.0] * len(row))
            for i, v in enumerate(row):
                total[i] += v
        for b, o in blocked.items():
            per = self.blockers.setdefault(b, {})
            per[o] = per.get(o, 0) + 1

    def _compact(self, rows: dict[int, list[float]], blocked: dict[int, int], report: ReportView) -> _Row:
        """A report's rows as kept for windows (an hour of them): some 300 bytes instead of some 3,000."""
        idents = tuple(rows)
        if idents == self._idents:
            idents = self._idents  # the same threads, report after report: kept once
        self._idents = idents
        counts = [row[i] for row in rows.values() for i in range(len(KINDS))]
        kinds: array[Any]
        try:
            whole = [int(v) for v in counts]
            top = max(whole, default=0)
            code = "B" if top < 1 << 8 else "H" if top < 1 << 16 else "I"
            kinds = array(code, whole) if whole == counts else array("d", counts)
        except (ValueError, OverflowError):  # not sample counts (NaN, infinite, huge): kept as they are
            kinds = array("d", counts)
        cpu = [row[_CPU] for row in rows.values()]
        return idents, kinds, array("d", cpu) if any(cpu) else None, report.window_s, report.samples, blocked or None

    @staticmethod
    def _expand(kept: _Row) -> tuple[dict[int, list[float]], dict[int, int]]:
        """The rows and blockers :meth:`_compact` kept, as :meth:`merge` made them."""
        idents, kinds, cpu, window_s, samples, blocked = kept
        rows: dict[int, list[float]] = {}
        n = len(KINDS)
        for j, ident in enumerate(idents):
            row = [float(k) for k in kinds[j * n : (j + 1) * n]] + [cpu[j] if cpu is not None else 0.0, 0.0]
            row[_SECONDS] = _seconds(row, window_s, samples)
            rows[ident] = row
        return rows, blocked or {}

    def merge_detail(self, burst: Mapping[str, Any]) -> None:
        length = float(burst.get("length_s") or 0.0)
        for row in burst.get("threads") or ():
            ident = int(row[0])
            d = self.detail.setdefault(ident, [0.0] * 5)
            d[0] += length
            for i in range(4):
                d[i + 1] += float(row[i + 1])

    def _window(
        self, start: float | None, end: float | None
    ) -> tuple[dict[int, list[float]], dict[int, dict[int, int]]]:
        if start is None and end is None:
            return self.totals, self.blockers
        totals: dict[int, list[float]] = {}
        blockers: dict[int, dict[int, int]] = {}
        for kept in self.window_rows(start, end):
            rows, blocked = self._expand(kept)
            for ident, row in rows.items():
                total = totals.setdefault(ident, [0.0] * len(row))
                for i, v in enumerate(row):
                    total[i] += v
            for b, o in blocked.items():
                per = blockers.setdefault(b, {})
                per[o] = per.get(o, 0) + 1
        return totals, blockers

    def table(self, start: float | None = None, end: float | None = None) -> list[dict[str, Any]]:
        totals, blockers = self._window(start, end)
        out = []
        for ident, row in totals.items():
            seen = sum(row[: len(KINDS)])
            if seen <= 0:
                continue
            share = {k: row[i] / seen for i, k in enumerate(KINDS)}
            seconds = row[_SECONDS]
            cpu = row[_CPU]
            d = self.detail.get(ident)
            # The native sampler saw the GIL waits and the run queue themselves: its "run" is on a CPU.
            seen_ready = share["gil"] + share["runq"] > 0
            # The GIL sampler's "run" is running or ready: of the time a thread was not waiting, the
            # CPU clock says how much it ran.
            ran = min(share["run"], cpu / seconds) if seconds > 0 and self.clocks and not seen_ready else share["run"]
            # Of the rest, the share the kernel's run queue held it (the bursts
            # measure it) is the machine's shortage of processors, not the GIL.
            queued = min(1.0, d[2] / 1e9 / d[0]) if d is not None and d[0] > 0 else 0.0
            by = blockers.get(ident)
            owner = max(by, key=lambda o: by[o]) if by else None
            entry: dict[str, Any] = {
                "name": self.names.get(ident, f"thread-{ident}"),
                "ident": ident,
                "run_pct": 100.0 * ran,
                "gil_pct": (
                    100.0 * share["gil"]
                    if seen_ready
                    else 100.0 * max(0.0, share["run"] - ran - queued)
                    if self.clocks
                    else None
                ),
                "block_pct": 100.0 * share["lock"],
                "wait_pct": 100.0 * share["wait"],
                "io_pct": 100.0 * share["io"],
                "sleep_pct": 100.0 * share["sleep"],
                "blocked_by": self.names.get(owner, f"thread-{owner}") if owner is not None else None,
                "run_s": cpu,
                "block_s": share["lock"] * seconds,
                "wait_s": share["wait"] * seconds,
                "io_s": share["io"] * seconds,
                "seconds": seconds,
                "samples": int(seen),
            }
            if d is not None and d[0] > 0:
                # Kernel figures over the bursts: the voluntary switches are the thread's waits
                # (of every kind), extrapolated to the whole time observed.
                entry["switches_per_s"] = d[3] / d[0]
                entry["waits"] = round(d[3] / d[0] * seconds)
                entry["runqueue_pct"] = 100.0 * d[2] / 1e9 / d[0]
            if seen_ready:
                # The native sampler's own count, over the whole time as the other columns (they add up
                # to 100); the kernel's, over the bursts, beside it.
                if "runqueue_pct" in entry:
                    entry["runqueue_kernel_pct"] = entry["runqueue_pct"]
                entry["runqueue_pct"] = 100.0 * share["runq"]
            out.append(entry)
        out.sort(key=lambda r: -r["seconds"])
        return out

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        return {"threads": self.table(start, end)}

    def _lost(self) -> tuple[float, float]:
        """(share of the threads' not-sleeping time lost to locks and the GIL, samples behind it)."""
        lost = busy = 0.0
        for r in self.table():
            gil = r["gil_pct"] or 0.0
            lost += r["block_pct"] + gil
            busy += r["run_pct"] + r["block_pct"] + gil
        return (lost / busy if busy > 0 else 0.0), float(self.samples)

    def status(self) -> Status:
        lost, samples = self._lost()
        return Status(min(1.0, lost), confidence_of(samples))

    def priority(self) -> float | None:
        lost, _ = self._lost()
        return min(1.0, 0.1 + lost)

    def findings(self) -> list[str]:
        out = []
        for r in self.table():
            if r["samples"] < 20:
                continue
            if r["block_pct"] >= 20:
                by = f", held by {r['blocked_by']}" if r["blocked_by"] else ""
                out.append(f"thread {r['name']} is blocked on a lock {r['block_pct']:.0f}% of the time{by}")
            if (r["gil_pct"] or 0.0) >= 20:
                out.append(f"thread {r['name']} is ready to run but not running {r['gil_pct']:.0f}% of the time (GIL)")
        # Idle threads in one line: true, and worth knowing (a pool that never
        # works), but not one finding each.
        sleepers = [r for r in self.table() if r["samples"] >= 20 and r["sleep_pct"] >= SLEEP_FINDING_PCT]
        if sleepers:
            names = ", ".join(f"{r['name']} ({r['sleep_pct']:.0f}%)" for r in sleepers[:SLEEPERS_NAMED])
            more = f" and {len(sleepers) - SLEEPERS_NAMED} more" if len(sleepers) > SLEEPERS_NAMED else ""
            plural = "s" if len(sleepers) > 1 else ""
            out.append(f"sleeping most of the time (time.sleep): thread{plural} {names}{more}")
        return out

    def state(self) -> dict[str, Any]:
        return {
            "names": {str(k): v for k, v in self.names.items()},
            "totals": {str(k): v for k, v in self.totals.items()},
            "blockers": {str(k): {str(o): n for o, n in v.items()} for k, v in self.blockers.items()},
            "detail": {str(k): v for k, v in self.detail.items()},
            "samples": self.samples,
            "clocks": self.clocks,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.names = {int(k): str(v) for k, v in (state.get("names") or {}).items()}
        self.totals = {int(k): _upgraded([float(x) for x in v]) for k, v in (state.get("totals") or {}).items()}
        self.blockers = {
            int(k): {int(o): int(n) for o, n in v.items()} for k, v in (state.get("blockers") or {}).items()
        }
        self.detail = {int(k): [float(x) for x in v] for k, v in (state.get("detail") or {}).items()}
        self.samples = int(state.get("samples") or 0)
        # histories written before this key had clocks whenever they had CPU seconds
        self.clocks = bool(state.get("clocks", any(v[_CPU] for v in self.totals.values())))


ANALYZER = ThreadsAnalyzer
