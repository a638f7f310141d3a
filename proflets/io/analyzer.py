"""The io proflet's monitor half (see :mod:`dyper.proflets.io`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dyper.monitor.model.libraries import library_roots
from dyper.proflets.io.common import IO_FIELDS, OTHER_KIND, Hit, classify, dotted_name, routines

if TYPE_CHECKING:
    from dyper.monitor.model.frames import StackKey
from dyper.proflets.base import (
    Analyzer,
    ReportView,
    SessionView,
    Status,
    WindowView,
    confidence_of,
)

# --- the resource file -------------------------------------------------------------------


# --- monitor half -----------------------------------------------------------------------

NOT_RUNNING = (
    "the io collector is not running in the target (name it: DYPER_PROFLETS=io,...): "
    "only listed Python routines are seen, not C calls such as a socket's recv"
)

#: a site: (file, qualname, first line, line)
SiteKey = tuple[str, str, int, int]


@dataclass
class _Row:
    """One (routine, calling function) pair's samples."""

    routine: str
    kind: str
    samples: int = 0
    #: the caller's frames (its lines) -> samples
    callers: dict[int, int] = field(default_factory=dict)
    #: thread ident -> samples
    threads: dict[int, int] = field(default_factory=dict)
    #: call site frame id -> samples
    sites: dict[int, int] = field(default_factory=dict)

    def caller(self) -> int:
        """The caller's line with the most samples (a frame id)."""
        return max(self.callers, key=lambda fid: self.callers[fid])


class IoAnalyzer(Analyzer):
    """I/O routines and their callers from the session's stacks; call counts and bytes from the collector."""

    name = "io"
    FROM_SAMPLES = True
    #: a thread doing I/O at least this share of its time is a finding
    FINDING_PCT = 50.0

    def __init__(self, session: SessionView | None = None) -> None:
        super().__init__(session)
        self._routines = routines()
        self._roots = library_roots(self.session.paths)
        #: leaf line -> (callee, whether the agent judged the call blocking)
        self.calls: dict[SiteKey, tuple[str, bool]] = {}
        #: per frame id: (listed Python routine or None, library code)
        self._frames: dict[int, tuple[tuple[str, str] | None, bool]] = {}
        #: per stack (root first): (hit, blocking C call), valid while self.calls is unchanged
        self._stacks: dict[tuple[int, ...], tuple[Hit | None, bool]] = {}
        #: the collector's (agent start, generation) -> its last cumulative counters
        self._io_last: dict[tuple[float, int], list[int]] = {}
        #: whole run: [seconds, *IO_FIELDS]
        self.io_total = [0.0] * (1 + len(IO_FIELDS))
        #: site -> [calls, seconds timed, calls timed, seconds counted]
        self.sites: dict[SiteKey, list[float]] = {}
        #: thread ident -> [seconds detailed, *IO_FIELDS]
        self.thread_io: dict[int, list[float]] = {}
        #: whether the collector ever reported: without it C routines go unseen
        self.collector_seen = False
        #: what detailing cost over the run (the last calibrated cost of one counted call)
        self.detailing: dict[str, float] = {"bursts": 0, "seconds": 0.0, "slowdown_s": 0.0, "fixed_s": 0.0}

    # --- merging ----------------------------------------------------------------------

    def merge(self, report: ReportView) -> None:
        if report.data is not None:
            self.collector_seen = True
        data = report.data or {}
        for row in data.get("calls") or ():
            try:
                key = (str(row[0]), str(row[1]), int(row[2]), int(row[3]))
                value = (str(row[4]), bool(row[5]))
            except (IndexError, TypeError, ValueError):
                continue
            if self.calls.get(key) != value:
                self.calls[key] = value
                self._stacks.clear()
                self.session.forget_recent("io")
        io, since = data.get("io"), data.get("since")
        if isinstance(io, list) and isinstance(since, list) and len(io) == len(IO_FIELDS) and len(since) == 2:
            key2 = (float(since[0]), int(since[1]))
            last = self._io_last.get(key2)
            self._io_last[key2] = [int(v) for v in io]
            if last is not None:
                # The first report of a collector only sets where the counting starts.
                row2 = [float(report.window_s)] + [max(0, int(v) - w) for v, w in zip(io, last, strict=True)]
                self.rows.append((report.t, row2))
                for i, v in enumerate(row2):
                    self.io_total[i] += v

    def merge_detail(self, burst: Mapping[str, Any]) -> None:
        length = float(burst.get("length_s") or 0.0)
        if length <= 0:
            return
        d = self.detailing
        d["bursts"] += 1
        d["seconds"] += length
        d["slowdown_s"] += float(burst.get("slowdown_s") or 0.0)
        d["fixed_s"] += float(burst.get("fixed_s") or 0.0)
        if burst.get("call_cost_s") is not None:
            d["call_cost_s"] = float(burst["call_cost_s"])
        if burst.get("counted"):
            for row in burst.get("sites") or ():
                try:
                    key = (str(row[0]), str(row[1]), int(row[2]), int(row[3]))
                    calls, seconds, timed = float(row[5]), float(row[6]), float(row[7])
                except (IndexError, TypeError, ValueError):
                    continue
                slot = self.sites.setdefault(key, [0.0, 0.0, 0.0, 0.0])
                slot[0] += calls
                slot[1] += seconds
                slot[2] += timed
                slot[3] += length
        for row in burst.get("threads") or ():
            if len(row) != 1 + len(IO_FIELDS):
                continue
            t = self.thread_io.setdefault(int(row[0]), [0.0] * (1 + len(IO_FIELDS)))
            t[0] += float(burst.get("threads_s") or length)
            for i, v in enumerate(row[1:]):
                t[i + 1] += max(0.0, float(v))

    # --- the analysis -----------------------------------------------------------------

    def _frame(self, fid: int) -> tuple[tuple[str, str] | None, bool]:
        got = self._frames.get(fid)
        if got is None:
            f = self.session.frames.frames[fid]
            dotted, library = dotted_name(f.file, f.name, self._roots)
            got = self._frames[fid] = (self._routines.function(dotted, library), library)
        return got

    def hit(self, stack: tuple[int, ...]) -> tuple[Hit | None, bool]:
        """Where a stack (frame ids, root first) does I/O, and whether its leaf's call is a blocking one."""
        known = self._stacks.get(stack)
        if known is not None:
            return known
        frames = self.session.frames.frames
        info = [self._frame(fid) for fid in stack]
        leaf = frames[stack[-1]]
        entry = self.calls.get((leaf.file, leaf.name, leaf.firstline, leaf.line))
        leaf_call = None
        if entry is not None:
            leaf_call = self._routines.call(entry[0]) or (entry[0], OTHER_KIND)
        hit = classify([i[0] for i in info], leaf_call, [i[1] for i in info])
        known = (hit, entry is not None and entry[1])
        if len(self._stacks) >= 100_000:
            self._stacks.clear()
        self._stacks[stack] = known
        return known

    def _counts(self, start: float | None, end: float | None) -> tuple[Mapping[StackKey, list[int]], int, float]:
        session = self.session
        if start is None and end is None:
            return session.counts, session.samples, session.duration_s()
        part = session.slice(start, end)
        return part.counts, part.samples, part.seconds

    def _rows(
        self, counts: Mapping[Any, list[int]]
    ) -> tuple[dict[tuple[str, tuple[str, str, int]], _Row], dict[int, list[int]], int]:
        """(rows by (routine, caller function), thread ident -> [I/O samples, samples], all samples)."""
        frames = self.session.frames.frames
        rows: dict[tuple[str, tuple[str, str, int]], _Row] = {}
        threads: dict[int, list[int]] = {}
        grand = 0
        for (tid, stack), (wall, cpu) in counts.items():
            if not stack or wall <= 0:
                continue
            grand += wall
            per = threads.setdefault(tid, [0, 0])
            per[1] += wall
            hit, blocking = self.hit(stack)
            if hit is None:
                continue
            # A blocking call's samples are those not counted as CPU (the
            # leaf's instruction is the call); any other listed routine's are all.
            n = wall - cpu if hit.c_call and blocking else wall
            if n <= 0:
                continue
            per[0] += n
            caller = stack[hit.caller]
            key = (hit.routine, frames[caller].function)
            row = rows.get(key)
            if row is None:
                row = rows[key] = _Row(hit.routine, hit.kind)
            row.samples += n
            row.callers[caller] = row.callers.get(caller, 0) + n
            row.threads[tid] = row.threads.get(tid, 0) + n
            if hit.site is not None:
                row.sites[stack[hit.site]] = row.sites.get(stack[hit.site], 0) + n
        return rows, threads, grand

    def results(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        counts, passes, seconds = self._counts(start, end)
        rows, threads, grand = self._rows(counts)
        frames = self.session.frames.frames
        names = self.session.threads
        per_pass = seconds / passes if passes > 0 else 0.0
        # every row's samples at a site: the site's counted calls are shared by them
        at_site: dict[int, int] = {}
        for row in rows.values():
            for fid, n in row.sites.items():
                at_site[fid] = at_site.get(fid, 0) + n
        out_rows = []
        for row in sorted(rows.values(), key=lambda r: -r.samples):
            caller = frames[row.caller()]
            rate: float | None = None
            timed_s = timed_n = 0.0
            for fid, n in row.sites.items():
                f = frames[fid]
                site = self.sites.get((f.file, f.name, f.firstline, f.line))
                if site is None or site[3] <= 0:
                    continue
                share = n / at_site[fid]
                rate = (rate or 0.0) + share * site[0] / site[3]
                timed_s += share * site[1]
                timed_n += share * site[2]
            row_s = row.samples * per_pass
            calls = round(rate * seconds) if rate is not None else None
            if timed_n > 0:
                s_per_call: float | None = timed_s / timed_n
            else:
                s_per_call = row_s / calls if calls else None
            by_thread = sorted(row.threads.items(), key=lambda kv: -kv[1])
            out_rows.append(
                {
                    "routine": row.routine,
                    "kind": row.kind,
                    "caller": caller.name,
                    "caller_file": caller.file,
                    "caller_line": caller.line,
                    "threads": [names.get(tid, f"thread-{tid}") for tid, _ in by_thread],
                    "pct": 100.0 * row.samples / grand if grand else 0.0,
                    "samples": row.samples,
                    "seconds": row_s,
                    "calls_per_s": rate,
                    "calls": calls,
                    "s_per_call": s_per_call,
                    "s_per_call_measured": timed_n > 0,
                }
            )
        io_samples = sum(r.samples for r in rows.values())
        result: dict[str, Any] = {
            "io_pct": 100.0 * io_samples / grand if grand else 0.0,
            "routines": out_rows,
            "threads": self._threads(rows.values(), threads, names),
            "samples": grand,
            "seconds": seconds,
            "detailing": dict(self.detailing),
        }
        if not self.collector_seen:
            result["note"] = NOT_RUNNING
        result.update(self._bytes(start, end))
        return result

    def _threads(
        self, rows: Iterable[_Row], threads: Mapping[int, list[int]], names: Mapping[int, str]
    ) -> list[dict[str, Any]]:
        frames = self.session.frames.frames
        top: dict[int, _Row] = {}
        for row in rows:
            for tid, n in row.threads.items():
                best = top.get(tid)
                if best is None or n > best.threads.get(tid, 0):
                    top[tid] = row
        out: list[dict[str, Any]] = []
        for tid, (io, samples) in threads.items():
            busiest = top.get(tid)
            detail = self.thread_io.get(tid)
            d = detail[0] if detail else 0.0
            out.append(
                {
                    "name": names.get(tid, f"thread-{tid}"),
                    "ident": tid,
                    "io_pct": 100.0 * io / samples if samples else 0.0,
                    "samples": samples,
                    "routine": busiest.routine if busiest is not None else None,
                    "caller": frames[busiest.caller()].name if busiest is not None else None,
                    "read_bytes_per_s": detail[1] / d if detail and d > 0 else None,
                    "write_bytes_per_s": detail[2] / d if detail and d > 0 else None,
                }
            )
        out.sort(key=lambda r: (-float(r["io_pct"]), str(r["name"])))
        return out

    def _bytes(self, start: float | None, end: float | None) -> dict[str, Any]:
        if start is None and end is None:
            total = self.io_total
        else:
            total = [0.0] * (1 + len(IO_FIELDS))
            for row in self.window_rows(start, end):
                for i, v in enumerate(row):
                    total[i] += v
        secs = total[0]

        def rate(field: str) -> float | None:
            return total[1 + IO_FIELDS.index(field)] / secs if secs > 0 else None

        return {
            "read_bytes_per_s": rate("rchar"),
            "write_bytes_per_s": rate("wchar"),
            "read_calls_per_s": rate("syscr"),
            "write_calls_per_s": rate("syscw"),
            "disk_read_bytes_per_s": rate("read_bytes"),
            "disk_write_bytes_per_s": rate("write_bytes"),
        }

    # --- status, priority, findings ---------------------------------------------------

    def _share(self, window_s: float | None) -> tuple[float, int, int]:
        """(I/O share of the threads' samples, routines seen, samples) over the last ``window_s`` seconds."""
        if window_s is not None:
            # Asked after every report: running sums of the windows' rows, not a merge of their stacks.
            sums, _ = self.session.recent("io", window_s, self._window_rows)
            grand = sums.get(None, 0)
            io = sum(sums.values()) - grand
            return (io / grand if grand else 0.0), len(sums) - (None in sums), grand
        counts, _ = self.session.window_counts(window_s)
        rows, _, grand = self._rows(counts)
        io = sum(r.samples for r in rows.values())
        return (io / grand if grand else 0.0), len(rows), grand

    def _window_rows(self, window: WindowView) -> dict[tuple[str, tuple[str, str, int]] | None, int]:
        """One window's I/O samples by (routine, caller function), as :meth:`_rows` counts them; None: all samples."""
        frames = self.session.frames.frames
        table = window.table
        out: dict[tuple[str, tuple[str, str, int]] | None, int] = {}
        grand = 0
        for i, wall, cpu in window.items():
            stack = table[i][1]
            if not stack or wall <= 0:
                continue
            grand += wall
            hit, blocking = self.hit(stack)
            if hit is None:
                continue
            n = wall - cpu if hit.c_call and blocking else wall
            if n <= 0:
                continue
            key = (hit.routine, frames[stack[hit.caller]].function)
            out[key] = out.get(key, 0) + n
        if grand:
            out[None] = grand
        return out

    def status(self) -> Status:
        share, _, samples = self._share(None)
        # Without the collector only Python routines are seen: a share, but not one to trust.
        return Status(share, confidence_of(samples) if self.collector_seen else 0.0)

    def priority(self) -> float | None:
        # DYPER: from the amount of I/O seen and the number of routines doing it
        share, routines_seen, _ = self._share(10.0)
        if routines_seen == 0:
            return 0.1
        return min(1.0, 0.1 + share * (0.5 + 0.5 * min(1.0, routines_seen / 4)))

    def findings(self) -> list[str]:
        result = self.results()
        out = []
        for t in result["threads"]:
            if t["samples"] >= 20 and t["io_pct"] >= self.FINDING_PCT and t["routine"]:
                out.append(
                    f"thread {t['name']} spends {t['io_pct']:.0f}% of its time in I/O, "
                    f"mostly {t['routine']} called from {t['caller']}"
                )
        return out[:3]

    # --- history ----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "calls": [[*k, callee, int(blocking)] for k, (callee, blocking) in self.calls.items()],
            "io_total": list(self.io_total),
            "sites": [[*k, *v] for k, v in self.sites.items()],
            "thread_io": {str(k): v for k, v in self.thread_io.items()},
            "detailing": dict(self.detailing),
            "collector_seen": self.collector_seen,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.calls = {
            (str(r[0]), str(r[1]), int(r[2]), int(r[3])): (str(r[4]), bool(r[5])) for r in state.get("calls") or ()
        }
        self._stacks.clear()
        total = [float(v) for v in state.get("io_total") or ()]
        if len(total) == len(self.io_total):
            self.io_total = total
        self.sites = {
            (str(r[0]), str(r[1]), int(r[2]), int(r[3])): [float(v) for v in r[4:8]] for r in state.get("sites") or ()
        }
        self.thread_io = {int(k): [float(x) for x in v] for k, v in (state.get("thread_io") or {}).items()}
        self.detailing.update({str(k): float(v) for k, v in (state.get("detailing") or {}).items()})
        self.collector_seen = bool(state.get("collector_seen"))


ANALYZER = IoAnalyzer
