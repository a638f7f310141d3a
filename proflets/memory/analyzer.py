"""The memory proflet's monitor half (see :mod:`dyper.proflets.memory`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dyper.proflets.base import Analyzer, ReportView, SessionView, Status, confidence_of
from dyper.proflets.memory.common import DYPER, OTHER, PRIORITY_REPORTS

# --- monitor half ------------------------------------------------------------------------

SiteKey = tuple[Any, ...]


class SiteTotals:
    """Allocation sites summed over the bursts: count and bytes, and the seconds traced."""

    #: sites kept in the monitor; past it the smallest half goes
    MAX_SITES = 2000

    def __init__(self) -> None:
        self.sites: dict[SiteKey, list[float]] = {}
        self.burst_s = 0.0
        self.bursts = 0
        self.own = [0.0, 0.0]
        #: frames per traceback, at the last burst
        self.nframe = 0
        #: bursts that could not trace, and the last one's reason
        self.skipped = 0
        self.skip_reason = ""
        #: how many times slower the cheapest allocation ran traced, as calibrated in the target
        self.factor = 0.0
        #: what the bursts cost, as the agent measured: fixed (start and end) and slowdown charged
        self.fixed_s = 0.0
        self.slowdown_s = 0.0
        #: the bursts sampled allocations (what was allocated during them), rather than
        #: traced them with tracemalloc (what was still alive at their ends)
        self.sampled = False

    def add(self, burst: Mapping[str, Any]) -> None:
        length = float(burst.get("length_s") or 0.0)
        self.fixed_s += float(burst.get("fixed_s") or 0.0)
        self.slowdown_s += float(burst.get("slowdown_s") or 0.0)
        if burst.get("skipped") or length <= 0:
            self.skipped += 1
            self.skip_reason = str(burst.get("skipped") or "")
            return
        self.burst_s += length
        self.bursts += 1
        self.nframe = int(burst.get("nframe") or self.nframe)
        self.factor = float(burst.get("factor") or self.factor)
        self.sampled = self.sampled or bool(burst.get("sampled"))
        own = burst.get("dyper") or (0, 0)
        self.own[0] += float(own[0])
        self.own[1] += float(own[1])
        for row in burst.get("sites") or ():
            key: SiteKey = (str(row[0]), int(row[1]), str(row[2]))
            if len(row) > 5:
                key += (tuple((str(f), int(ln), str(fn)) for f, ln, fn in row[5]),)
            total = self.sites.setdefault(key, [0.0, 0.0])
            total[0] += float(row[3])
            total[1] += float(row[4])
        if len(self.sites) > self.MAX_SITES:
            kept = sorted(self.sites.items(), key=lambda kv: -kv[1][1])[: self.MAX_SITES // 2]
            self.sites = dict(kept)

    def rows(self, seconds: float, limit: int = 20) -> list[dict[str, Any]]:
        """Sites by bytes: rates over the bursts, extrapolated to ``seconds``."""
        if self.burst_s <= 0:
            return []
        grand = sum(v[1] for v in self.sites.values())
        out = []
        for key, (count, size) in sorted(self.sites.items(), key=lambda kv: -kv[1][1])[:limit]:
            row: dict[str, Any] = {
                "file": key[0],
                "line": key[1],
                "function": key[2],
                "count_per_s": count / self.burst_s,
                "bytes_per_s": size / self.burst_s,
                "count": round(count / self.burst_s * seconds),
                "bytes": round(size / self.burst_s * seconds),
                "bytes_pct": 100.0 * size / grand if grand else 0.0,
            }
            if len(key) > 3:
                row["stack"] = [{"file": f, "line": ln, "function": fn} for f, ln, fn in key[3]]
            out.append(row)
        return out

    def summary(self) -> dict[str, Any]:
        """The bursts behind the rows, for a report."""
        out: dict[str, Any] = {
            "bursts": self.bursts,
            "burst_s": self.burst_s,
            "nframe": self.nframe,
            "slowdown_factor": self.factor,
            # per burst, skipped ones included: what the agent charged
            "burst_fixed_ms": 1000.0 * self.fixed_s / max(1, self.bursts + self.skipped),
            "burst_slowdown_s": self.slowdown_s / max(1, self.bursts + self.skipped),
            "dyper_bytes_per_s": self.own[1] / self.burst_s if self.burst_s > 0 else 0.0,
            "sampled": self.sampled,
        }
        if self.skipped:
            out["skipped"] = self.skipped
            out["skip_reason"] = self.skip_reason
        return out

    def state(self) -> dict[str, Any]:
        return {
            "sites": [[*k[:3], [list(s) for s in k[3]] if len(k) > 3 else None, *v] for k, v in self.sites.items()],
            "burst_s": self.burst_s,
            "bursts": self.bursts,
            "own": self.own,
            "nframe": self.nframe,
            "factor": self.factor,
            "costs": [self.fixed_s, self.slowdown_s],
            "skipped": [self.skipped, self.skip_reason],
            "sampled": self.sampled,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.sites = {}
        for row in state.get("sites") or ():
            key: SiteKey = (str(row[0]), int(row[1]), str(row[2]))
            if row[3] is not None:
                key += (tuple((str(f), int(ln), str(fn)) for f, ln, fn in row[3]),)
            self.sites[key] = [float(row[4]), float(row[5])]
        self.burst_s = float(state.get("burst_s") or 0.0)
        self.bursts = int(state.get("bursts") or 0)
        self.own = [float(x) for x in state.get("own") or (0.0, 0.0)]
        self.nframe = int(state.get("nframe") or 0)
        self.factor = float(state.get("factor") or 0.0)
        self.fixed_s, self.slowdown_s = (float(x) for x in state.get("costs") or (0.0, 0.0))
        skipped = state.get("skipped") or (0, "")
        self.skipped, self.skip_reason = int(skipped[0]), str(skipped[1])
        self.sampled = bool(state.get("sampled"))


GcSite = tuple[str, int, str]


@dataclass(slots=True)
class _Report:
    """One report's basic figures, as differences from the report before (rss: as it was)."""

    rss: int
    collections: list[int]
    pause_s: float
    callback_s: float
    window_s: float
    sites: dict[GcSite, list[float]]
    #: seconds the GC callback watched (None: an agent that watched all the time)
    watched_s: float | None = None


#: What a GC finding rests on at least: seconds observed and collections counted.
FINDING_MIN_S = 5.0
FINDING_MIN_COLLECTIONS = 20
#: An allocation site is a finding when it has this share of the bytes the
#: bursts sampled (allocated during them; with tracemalloc, still alive at their ends) ...
SITE_FINDING_PCT = 20.0
#: ... at this rate at least: a quiet process's top site is not news. What stays
#: alive (tracemalloc) is memory growth, news from 100 kB/s; what is allocated
#: (the sampler, temporaries included) costs CPU, news from 10 MB/s: some
#: 100,000 allocations a second, about 1% of a core in the allocator alone.
SITE_FINDING_BYTES_PER_S = 100_000.0
SAMPLED_SITE_FINDING_BYTES_PER_S = 10_000_000.0


class MemoryAnalyzer(Analyzer):
    name = "memory"

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        #: last cumulative figures seen from the collector (to turn them into differences)
        self._seen_gc: list[int] | None = None
        self._seen_pause = 0.0
        self._seen_callback = 0.0
        self._seen_watched = 0.0
        self._seen_sites: dict[GcSite, list[float]] = {}
        #: whole run
        self.collections = [0, 0, 0]
        self.pause_s = 0.0
        self.callback_s = 0.0
        self.callback_cost_s = 0.0
        self.seconds = 0.0
        #: seconds the GC callback watched (reports from agents that watch all the time count whole)
        self.watched_s = 0.0
        self.reports = 0
        self.gc_sites: dict[GcSite, list[float]] = {}
        self.rss_first: int | None = None
        self.rss_last: int | None = None
        self.rss_max = 0
        self.allocations = SiteTotals()

    def merge(self, report: ReportView) -> None:
        data = report.data
        if not data:
            return
        gens = [int(g[0]) for g in data.get("gc") or ()][:3]
        gens += [0] * (3 - len(gens))
        pause, callback = float(data.get("pause_s") or 0.0), float(data.get("callback_s") or 0.0)
        seen = self._seen_gc
        if seen is None or any(a < b for a, b in zip(gens, seen, strict=True)) or pause < self._seen_pause:
            # A new collector (re-attached, or a new process under the same
            # session): its totals start from zero.
            self._seen_gc, self._seen_pause, self._seen_callback, self._seen_sites = [0, 0, 0], 0.0, 0.0, {}
            self._seen_watched = 0.0
            seen = self._seen_gc
        delta_gc = [a - b for a, b in zip(gens, seen, strict=True)]
        sites: dict[GcSite, list[float]] = {}
        for row in data.get("sites") or ():
            site: GcSite = (str(row[0]), int(row[1]), str(row[2]))
            values = [float(v) for v in row[3:7]]
            before = self._seen_sites.get(site)
            if before is not None and all(a >= b for a, b in zip(values, before, strict=True)):
                diff = [a - b for a, b in zip(values, before, strict=True)]
            else:
                diff = values
            self._seen_sites[site] = values
            if any(diff):
                sites[site] = diff
        watched = data.get("watched_s")
        watched_s = None
        if watched is not None:
            watched_s = min(report.window_s, max(0.0, float(watched) - self._seen_watched))
            self._seen_watched = float(watched)
        row_ = _Report(
            int(data.get("rss") or 0),
            delta_gc,
            pause - self._seen_pause,
            max(0.0, callback - self._seen_callback),
            report.window_s,
            sites,
            watched_s,
        )
        self._seen_gc, self._seen_pause, self._seen_callback = gens, pause, callback
        self.callback_cost_s = float(data.get("callback_cost_s") or self.callback_cost_s)
        self.rows.append((report.t, row_))
        self.reports += 1
        for i in range(3):
            self.collections[i] += delta_gc[i]
        self.pause_s += row_.pause_s
        self.callback_s += row_.callback_s
        self.seconds += report.window_s
        self.watched_s += report.window_s if watched_s is None else watched_s
        _add_sites(self.gc_sites, sites)
        if row_.rss:
            if self.rss_first is None:
                self.rss_first = row_.rss
            self.rss_last = row_.rss
            self.rss_max = max(self.rss_max, row_.rss)

    def merge_detail(self, burst: Mapping[str, Any]) -> None:
        self.allocations.add(burst)

    def has_data(self) -> bool:
        return self.seconds > 0 or self.allocations.bursts + self.allocations.skipped > 0

    def _window(self, start: float | None, end: float | None) -> tuple[list[_Report], _Report]:
        """The window's reports and their sum (rss: the last one's)."""
        if start is None and end is None:
            total = _Report(
                self.rss_last or 0,
                list(self.collections),
                self.pause_s,
                self.callback_s,
                self.seconds,
                self.gc_sites,
                self.watched_s,
            )
            return [r for _, r in self.rows], total
        rows: list[_Report] = self.window_rows(start, end)
        total = _Report(0, [0, 0, 0], 0.0, 0.0, 0.0, {}, 0.0)
        for r in rows:
            for i in range(3):
                total.collections[i] += r.collections[i]
            total.pause_s += r.pause_s
            total.callback_s += r.callback_s
            total.window_s += r.window_s
            total.watched_s = (total.watched_s or 0.0) + (r.window_s if r.watched_s is None else r.watched_s)
            _add_sites(total.sites, r.sites)
            total.rss = r.rss or total.rss
        return rows, total

    def seconds_in(self, start: float | None, end: float | None) -> float:
        """Seconds the reports of the window cover."""
        return self._window(start, end)[1].window_s

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        rows, total = self._window(start, end)
        seconds = total.window_s
        pause = total.pause_s
        own_pause = sum(v[3] for k, v in total.sites.items() if k[2] == DYPER)
        app_pause = pause - own_pause
        by_site = sorted(((k, v) for k, v in total.sites.items() if k[2] != DYPER), key=lambda kv: -kv[1][3])
        rss = [r.rss for r in rows if r.rss]
        if start is None and end is None and self.rss_first is not None:
            rss = [self.rss_first, self.rss_max]  # what the history kept of the whole run
        return {
            "rss_bytes": total.rss or None,
            "rss_first_bytes": rss[0] if rss else None,
            "rss_max_bytes": max(rss) if rss else None,
            "gc": {
                "collections": total.collections,
                "collections_per_s": [c / seconds if seconds > 0 else 0.0 for c in total.collections],
                "pause_total_s": pause,
                "pause_pct": 100.0 * pause / seconds if seconds > 0 else 0.0,
                "pauses_by_site": [
                    {
                        "file": k[0],
                        "line": k[1],
                        "function": k[2],
                        "collections": round(sum(v[:3])),
                        "generations": [round(x) for x in v[:3]],
                        "pause_s": v[3],
                        "pause_pct": 100.0 * v[3] / app_pause if app_pause > 0 else 0.0,
                    }
                    for k, v in by_site[:20]
                ],
                "dyper_pause_s": own_pause,
                # What the callback cost the application's threads: calibrated cost times collections.
                "callback_cost_s": total.callback_s,
                "callback_s_per_collection": self.callback_cost_s,
                "callback_pct": 100.0 * total.callback_s / seconds if seconds > 0 else 0.0,
                # Under 100: the callback watched part of the time, to keep within the budget,
                # and the pauses and sites are extrapolated from what it saw.
                "watched_pct": min(100.0, 100.0 * (total.watched_s or 0.0) / seconds) if seconds > 0 else 100.0,
            },
            "sites": self.allocations.rows(seconds),
            **self.allocations.summary(),
            "seconds": seconds,
            "priority": self.priority(),
        }

    def _change(self) -> tuple[float, float]:
        """(GC activity, memory change) over the last PRIORITY_REPORTS reports, each 0-1."""
        recent = [r for _, r in list(self.rows)[-PRIORITY_REPORTS:]]
        seconds = sum(r.window_s for r in recent)
        if not recent or seconds <= 0:
            return 0.0, 0.0
        # A collection of an older generation goes through about ten times as
        # many objects as one of the next younger (the default thresholds).
        weighted = sum(r.collections[0] + 10 * r.collections[1] + 100 * r.collections[2] for r in recent)
        gc_term = min(1.0, weighted / seconds / 100.0)
        rss = [r.rss for r in recent if r.rss]
        # 10% up or down within the reports counts as much change as there is.
        mem_term = min(1.0, (max(rss) - min(rss)) / min(rss) / 0.1) if len(rss) >= 2 and min(rss) > 0 else 0.0
        return gc_term, mem_term

    def priority(self) -> float | None:
        gc_term, mem_term = self._change()
        return min(1.0, 0.1 + 0.9 * max(gc_term, mem_term))

    def _problem(self) -> float:
        """GC pauses over 5% of the time, or memory grown by half since the first report, is all the problem."""
        pause = min(1.0, self.pause_s / self.seconds / 0.05) if self.seconds > 0 else 0.0
        grown = 0.0
        if self.rss_first and self.rss_last:
            grown = min(1.0, max(0.0, self.rss_last / self.rss_first - 1.0) / 0.5)
        return max(pause, grown)

    def status(self) -> Status:
        # By the seconds observed, not the reports: at 1% they come seconds apart.
        return Status(self._problem(), confidence_of(self.seconds, half=20))

    def findings(self) -> list[str]:
        out = []
        # Enough to say: seconds observed and collections counted (exact, watched or not). Counting
        # reports instead left the finding out of short runs at 1%, whose reports come seconds apart.
        if self.seconds >= FINDING_MIN_S and sum(self.collections) >= FINDING_MIN_COLLECTIONS:
            share = 100.0 * self.pause_s / self.seconds
            by_site = sorted(((k, v) for k, v in self.gc_sites.items() if k[2] != DYPER), key=lambda kv: -kv[1][3])
            if share >= 1.0 and by_site:
                (file, line, function), v = by_site[0]
                out.append(
                    f"garbage collection pauses take {share:.1f}% of the time; "
                    f"{100.0 * v[3] / self.pause_s:.0f}% of it is triggered in {function} "
                    f"({os.path.basename(file)}:{line})"
                )
        least = SAMPLED_SITE_FINDING_BYTES_PER_S if self.allocations.sampled else SITE_FINDING_BYTES_PER_S
        for row in self.allocations.rows(self.seconds, limit=2):
            if row["bytes_pct"] >= SITE_FINDING_PCT and row["bytes_per_s"] >= least:
                out.append(
                    f"allocation site {row['function']} ({os.path.basename(row['file'])}:{row['line']}) "
                    f"allocates {_rate(row['bytes_per_s'])}, {row['bytes_pct']:.0f}% of the bytes traced "
                    f"in {self.allocations.bursts} burst{'s' if self.allocations.bursts != 1 else ''}"
                )
        if self.rss_first and self.rss_last and self.rss_last > 1.25 * self.rss_first + (20 << 20):
            out.append(
                f"resident memory grew from {self.rss_first / 2**20:.0f} MB to {self.rss_last / 2**20:.0f} MB "
                f"over {self.seconds:.0f} s"
            )
        return out

    def state(self) -> dict[str, Any]:
        return {
            "collections": self.collections,
            "pause_s": self.pause_s,
            "callback_s": self.callback_s,
            "callback_cost_s": self.callback_cost_s,
            "seconds": self.seconds,
            "watched_s": self.watched_s,
            "reports": self.reports,
            "gc_sites": [[*k, *v] for k, v in self.gc_sites.items()],
            "rss": [self.rss_first, self.rss_last, self.rss_max],
            "allocations": self.allocations.state(),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.collections = [int(x) for x in state.get("collections") or (0, 0, 0)]
        self.pause_s = float(state.get("pause_s") or 0.0)
        self.callback_s = float(state.get("callback_s") or 0.0)
        self.callback_cost_s = float(state.get("callback_cost_s") or 0.0)
        self.seconds = float(state.get("seconds") or 0.0)
        self.watched_s = float(state.get("watched_s", self.seconds))
        self.reports = int(state.get("reports") or 0)
        self.gc_sites = {
            (str(r[0]), int(r[1]), str(r[2])): [float(x) for x in r[3:7]] for r in state.get("gc_sites") or ()
        }
        first, last, most = state.get("rss") or (None, None, 0)
        self.rss_first, self.rss_last, self.rss_max = first, last, int(most or 0)
        self.allocations.restore(state.get("allocations") or {})


def _add_sites(into: dict[GcSite, list[float]], sites: Mapping[GcSite, list[float]]) -> None:
    for site, v in sites.items():
        if site not in into and len(into) >= SiteTotals.MAX_SITES:
            site = ("", 0, OTHER)
        total = into.setdefault(site, [0.0, 0.0, 0.0, 0.0])
        for i in range(4):
            total[i] += v[i]


def _rate(bytes_per_s: float) -> str:
    for unit, size in (("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= size:
            return f"{bytes_per_s / size:.1f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


ANALYZER = MemoryAnalyzer
