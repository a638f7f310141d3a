"""The heap proflet's monitor half (see :mod:`dyper.proflets.heap`)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from dyper.proflets.base import Analyzer, ReportView, SessionView, Status, confidence_of

# --- monitor half ------------------------------------------------------------------

#: A type is a leak suspect when its count was at a new high in each of this
#: many consecutive censuses (five censuses in all: at 1% with every proflet
#: on, about a minute of following it; six took 70 to 90 s) ...
LEAK_CENSUSES = 4
#: ... and grew by at least this many objects and this share of its count over them.
LEAK_MIN_GROWTH = 20
LEAK_MIN_SHARE = 0.01
#: While a type's count is rising, a census is asked for this often (see HeapAnalyzer.wants_detail).
FOLLOW_S = 5.0
#: Censuses kept (a new high is against all of them); reports kept for the priority.
CENSUSES_KEPT = 120
RSS_REPORTS = 50
#: Rows of the types table: the largest by bytes, plus every suspect.
TABLE_ROWS = 20
#: Censuses and rows per census kept in the monitor's history.
STATE_CENSUSES = 12
STATE_ROWS = 100


Census = tuple[float, Mapping[str, Any], dict[str, tuple[int, int]]]


def growth(series: Sequence[tuple[float, int]]) -> tuple[int, float | None, bool]:
    """How one type's count moved over the censuses, from its (time, count) series, oldest first.

    Returns the censuses of its current growth run (the trailing censuses
    that each set a new high, beating every count before them, and the
    census the run started from; 0 with no run), its growth per minute
    (over the run, or with no run over the last LEAK_CENSUSES censuses;
    None with fewer than two censuses), and whether it is a leak suspect: a
    run of at least LEAK_CENSUSES new highs, growing by at least
    LEAK_MIN_GROWTH objects and LEAK_MIN_SHARE of its count.
    """
    if len(series) < 2:
        return 0, None, False
    highs = [False] * len(series)
    best = series[0][1]
    for i in range(1, len(series)):
        highs[i] = series[i][1] > best
        best = max(best, series[i][1])
    steps = 0
    while steps < len(series) - 1 and highs[-1 - steps]:
        steps += 1
    back = steps or min(len(series) - 1, LEAK_CENSUSES)
    (t0, c0), (t1, c1) = series[-1 - back], series[-1]
    per_min = (c1 - c0) / (t1 - t0) * 60.0 if t1 > t0 else None
    suspect = steps >= LEAK_CENSUSES and c1 - c0 >= max(LEAK_MIN_GROWTH, LEAK_MIN_SHARE * c0)
    return (steps + 1 if steps else 0), per_min, suspect


class HeapAnalyzer(Analyzer):
    """The censuses of one process, their types' growth, and the leak suspects."""

    name = "heap"

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        #: (time, totals, type name -> (count, bytes)), oldest first
        self.censuses: deque[Census] = deque(maxlen=CENSUSES_KEPT)
        self.total = 0
        self.skipped = 0
        self.skip_reason: str | None = None
        self.max_pause_ms: float | None = None
        self.worst_scan_ms = 0.0
        #: the whole run's types as last judged (status, findings and priority ask often)
        self._judged: list[dict[str, Any]] | None = None
        #: when a census was last asked for ahead of the plan (wants_detail), wall-clock time
        self._asked_at = -math.inf

    def merge(self, report: ReportView) -> None:
        data = report.data
        if data and isinstance(data.get("rss"), int):
            self.rows.append((report.t, int(data["rss"])))

    def has_data(self) -> bool:
        return self.total + self.skipped > 0

    def merge_detail(self, burst: Mapping[str, Any]) -> None:
        if isinstance(burst.get("max_pause_ms"), int | float):
            self.max_pause_ms = float(burst["max_pause_ms"])
        if burst.get("skipped"):
            self.skipped += 1
            self.skip_reason = f"heap census skipped: {burst['skipped']}"
            return
        if "types" not in burst:
            return
        t = float(burst.get("at") or burst.get("t") or 0.0)
        rows = {str(name): (int(count), int(nbytes)) for name, count, nbytes in burst["types"]}
        totals = {k: burst.get(k) for k in ("objects", "bytes", "types_seen", "sampled_every", "scan_ms", "pause_ms")}
        self.censuses.append((t, totals, rows))
        self._judged = None
        self.total += 1
        self.worst_scan_ms = max(self.worst_scan_ms, float(burst.get("scan_ms") or 0.0))
        self.skip_reason = None  # the last word is the census that ran

    def _window(self, start: float | None, end: float | None) -> list[Census]:
        if start is None and end is None:
            return list(self.censuses)
        return [c for c in self.censuses if (start is None or c[0] > start) and (end is None or c[0] <= end)]

    def _types(self, censuses: Sequence[Census]) -> list[dict[str, Any]]:
        """Every type of the last census: count, bytes, growth per minute, suspect or not."""
        if not censuses:
            return []
        out = []
        for name, (count, nbytes) in censuses[-1][2].items():
            run, per_min, suspect = growth([(t, rows.get(name, (0, 0))[0]) for t, _, rows in censuses])
            out.append(
                {
                    "type": name,
                    "count": count,
                    "bytes": nbytes,
                    "growth_per_min": per_min,
                    "suspect_leak": suspect,
                    "censuses_growing": run,
                }
            )
        return out

    def _whole_run(self) -> list[dict[str, Any]]:
        if self._judged is None:
            self._judged = self._types(list(self.censuses))
        return self._judged

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        censuses = self._window(start, end)
        every = self._whole_run() if start is None and end is None else self._types(censuses)
        by_bytes = sorted(every, key=lambda r: -r["bytes"])
        table = by_bytes[:TABLE_ROWS] + [r for r in by_bytes[TABLE_ROWS:] if r["suspect_leak"]]
        out: dict[str, Any] = {
            "types": table,
            "censuses": len(censuses),
            "skipped": self.skipped,
            "skip_reason": self.skip_reason,
            "max_pause_ms": self.max_pause_ms,
            "worst_scan_ms": self.worst_scan_ms,
        }
        if censuses:
            t, totals, _ = censuses[-1]
            out.update({"census_at": t, **totals})
        elif not self.skipped:
            out["note"] = self._none_yet()
        return out

    def _none_yet(self) -> str:
        """Why there is no census yet, in words: the planned cost against what the budget can save up."""
        from dyper.agent.budget import Guard

        agents = list(self.session.agents.values())
        if agents and not any(self.name in agent.proflets for agent in agents):
            return "the heap proflet is not running in the target: name it (DYPER_PROFLETS=...,heap)"
        for agent in agents:
            state = agent.proflets.get(self.name) or {}
            planned = state.get("ovhd_ms")
            if isinstance(planned, int | float) and agent.budget > 0:
                guard = Guard(agent.budget, 0.0)
                bucket_ms = 1000.0 * guard.rate * guard.capacity_s
                if planned > bucket_ms:
                    return (
                        f"no census yet: one is expected to take {planned:.0f} ms, more than a "
                        f"{100 * agent.budget:g}% budget saves up ({bucket_ms:.0f} ms)"
                    )
        return "no census yet"

    def suspects(self) -> list[dict[str, Any]]:
        rows = [r for r in self._whole_run() if r["suspect_leak"]]
        return sorted(rows, key=lambda r: -(r["growth_per_min"] or 0.0))

    def status(self) -> Status:
        # A problem when something leaks: the more types, the surer it is not one odd cache.
        found = self.suspects()
        problem = min(1.0, 0.6 + 0.1 * len(found)) if found else 0.0
        return Status(problem, confidence_of(len(self.censuses), half=LEAK_CENSUSES))

    def findings(self) -> list[str]:
        words = [
            f"instances of {r['type']} grew by {r['growth_per_min']:,.0f}/min over "
            f"{r['censuses_growing']} censuses: a leak?"
            for r in self.suspects()[:3]
        ]
        if self.skip_reason:
            words.append(self.skip_reason)
        return words

    def _rss_growth(self) -> float:
        """Relative growth of the process's size over the last RSS_REPORTS reports (0 when it did not grow)."""
        recent: list[int] = [int(rss) for _, rss in list(self.rows)[-RSS_REPORTS:]]
        if len(recent) < 2 or min(recent) <= 0:
            return 0.0
        return max(0.0, (recent[-1] - min(recent)) / min(recent))

    def priority(self) -> float | None:
        # Memory growth makes a census worth more; suspects make the next one
        # worth more still (to follow them). Never nothing: a leak must be
        # seen to be found.
        prty = min(1.0, 0.2 + 5.0 * self._rss_growth())
        if self.suspects():
            return max(prty, 0.6)
        # A type on a run of new highs is a leak in the making, and only more
        # censuses tell: at the collector's own priority they came 15 to 30 s
        # apart at 1%, and a leak took minutes to be named. The first censuses
        # come soon for the same reason.
        if len(self.censuses) < 2 or self._building():
            return 1.0
        return prty

    def wants_detail(self, now: float) -> bool:
        # Following a type on a run of new highs (or taking the first census):
        # a census every FOLLOW_S, so the verdict comes in LEAK_CENSUSES of
        # them, about a minute at 1%. By the plan alone censuses came 15 to
        # 30 s apart there (the dear proflets' TPRI outweighs a census), and a
        # leak took minutes to name. Asked for no more once a verdict is in.
        if self.suspects() or self.skip_reason:
            return False
        # A census asked for comes back with a report, seconds later: not asked again meanwhile.
        last = max(self.censuses[-1][0] if self.censuses else -math.inf, self._asked_at)
        if not (not self.censuses or self._building()) or now - last < FOLLOW_S:
            return False
        self._asked_at = now  # the monitor asks when told yes
        return True

    def _building(self) -> bool:
        """Whether some type's count is at a new high, on a run that would make it a suspect if it went on."""
        # Past LEAK_CENSUSES new highs with no verdict, it grew too little to be one: no more following.
        return any(
            2 <= r["censuses_growing"] <= LEAK_CENSUSES
            and (r["growth_per_min"] or 0.0) > 0
            and r["count"] >= LEAK_MIN_GROWTH
            for r in self._whole_run()
        )

    def state(self) -> dict[str, Any]:
        kept = []
        for t, totals, rows in list(self.censuses)[-STATE_CENSUSES:]:
            top = sorted(rows.items(), key=lambda kv: -kv[1][0])[:STATE_ROWS]
            kept.append([t, dict(totals), [[name, c, b] for name, (c, b) in top]])
        return {
            "censuses": kept,
            "total": self.total,
            "skipped": self.skipped,
            "skip_reason": self.skip_reason,
            "max_pause_ms": self.max_pause_ms,
            "worst_scan_ms": self.worst_scan_ms,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.censuses.clear()
        self._judged = None
        for t, totals, rows in state.get("censuses") or ():
            self.censuses.append((float(t), dict(totals), {str(name): (int(c), int(b)) for name, c, b in rows}))
        self.total = int(state.get("total") or len(self.censuses))
        self.skipped = int(state.get("skipped") or 0)
        reason = state.get("skip_reason")
        self.skip_reason = str(reason) if reason else None
        pause = state.get("max_pause_ms")
        self.max_pause_ms = float(pause) if isinstance(pause, int | float) else None
        self.worst_scan_ms = float(state.get("worst_scan_ms") or 0.0)


ANALYZER = HeapAnalyzer
