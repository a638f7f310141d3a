"""Where does alloc lose time around cpu bursts and reports? Unit-by-unit timing against the agent's own events.

    python bench/burst_timeline.py [--workload alloc|cpu-1|cpu-4] [--proflets cpu,...] [--seconds 60]
                                   [--budget 0.05] [--monitor ENDPOINT] [--json FILE]

In one process: alloc's unit in a loop on the main thread, each unit's end
time (perf_counter) recorded; dyper's agent (the cpu proflet, or
``--proflets``; no monitor: it schedules by itself) at the budget. Bursts are
told apart by proflet and kind (``memory:sites``); where two proflets' bursts
overlap, a unit counts for the later one only. Agent._start_burst / _stop_burst /
_detail_step are wrapped to log when they ran (perf_counter at entry and
exit), and so is _report. Then each unit is classed: plain (nothing of
the agent's near it but sampling), in a burst, touching a burst's start or
stop or a report (the unit running when the agent did it), or near one
(within 50 ms); per class, the time lost = sum(duration - mean plain
duration). Against: what the ledger charged (guard.spent_by), by line.
With ``--monitor`` (a running ``dyper monitor``) the agent reports and
follows the monitor's timings, as in the overhead benches; without, it
schedules by itself and sends nothing. A diagnostic for issue 3's question:
is alloc's slowdown under cpu detailing charged?

With ``--workload cpu-4`` four threads run cpu-1's unit, and a unit's
duration includes its waits for the GIL, so units cannot be classed one by
one. The figures are then rates: all threads' units per second inside each
burst against the plain time within a second of it, and the same for the
50 ms after each burst start, stop and report (``by_rate``).
"""

from __future__ import annotations

import argparse
import bisect
import gc
import json
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "workloads"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=("alloc", "cpu-1", "cpu-4"), default="alloc")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--proflets", default="cpu", help="the agent's proflets (default cpu)")
    parser.add_argument("--budget", type=float, default=0.05)
    parser.add_argument("--json")
    parser.add_argument("--monitor", default="tcp://127.0.0.1:9")
    args = parser.parse_args()

    import alloc
    import cpu1

    from dyper.agent.bursts import Bursts
    from dyper.agent.core import Agent

    unit = alloc.unit if args.workload == "alloc" else (lambda: cpu1.middle(2000))
    nthreads = 4 if args.workload == "cpu-4" else 1

    events: list[tuple[str, float, float]] = []  # (what, start, end)
    #: per burst, by proflet: (start op begins, start op ends, "proflet:kind")
    started: dict[str, list[tuple[float, float, str]]] = {}
    #: per burst, by proflet: (stop op begins, stop op ends, what the burst was charged in all)
    stopped: dict[str, list[tuple[float, float, float]]] = {}
    #: what is timed: (event name, the class, its method)
    timed = (
        ("_start_burst", Bursts, "start"),
        ("_stop_burst", Bursts, "stop"),
        ("_detail_step", Bursts, "step"),
        ("_report", Agent, "_report"),
    )

    def wrap(name: str, fn):  # type: ignore[no-untyped-def]
        def wrapper(self, *a, **k):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            before = self.guard.spent_by.get("detail", 0.0)
            burst = self.running.get(a[0]) if name == "_stop_burst" else None
            try:
                return fn(self, *a, **k)
            finally:
                t1 = time.perf_counter()
                events.append((name, t0, t1))
                if name == "_start_burst" and a[0] in self.running:
                    started.setdefault(a[0], []).append((t0, t1, f"{a[0]}:{self.running[a[0]].kind}"))
                elif name == "_stop_burst" and burst is not None:
                    # its fixed cost at the start, the slowdown charged by the stop, and the stop's settling
                    settled = self.guard.spent_by.get("detail", 0.0) - before
                    stopped.setdefault(a[0], []).append((t0, t1, burst.fixed_s + burst.charged_s + settled))

        return wrapper

    for name, cls, method in timed:
        setattr(cls, method, wrap(name, getattr(cls, method)))

    agent = Agent(args.monitor, args.budget, proflets=tuple(args.proflets.split(",")))
    agent.start()
    warm = time.perf_counter() + 5
    t_start = warm
    end = t_start + args.seconds
    by_thread: list[list[float]] = [[] for _ in range(nthreads)]
    spent_first: list[dict[str, float]] = []  # the ledger when the first thread passes the warm-up

    def work(mine: list[float]) -> None:
        while time.perf_counter() < warm:
            unit()
        if not spent_first:
            spent_first.append(dict(agent.guard.spent_by))
        while time.perf_counter() < end:
            unit()
            mine.append(time.perf_counter())

    gc_before = [s["collections"] for s in gc.get_stats()]
    if nthreads == 1:
        work(by_thread[0])
    else:
        workers = [threading.Thread(target=work, args=(m,)) for m in by_thread]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    spent1 = dict(agent.guard.spent_by)
    spent0 = spent_first[0]
    ends = sorted(t for m in by_thread for t in m)
    agent.stop()
    gc_after = [s["collections"] for s in gc.get_stats()]

    evs = [e for e in events if e[1] >= t_start]
    starts = [(a, z) for n, a, z in evs if n == "_start_burst"]
    stops = [(a, z) for n, a, z in evs if n == "_stop_burst"]
    reports = [(a, z) for n, a, z in evs if n == "_report"]
    # bursts, per proflet: from a start's end to the next stop's beginning (a proflet runs one at a time)
    bursts = []  # (begins, ends, "proflet:kind", what it was charged)
    for name, ss in started.items():
        for a0, a1, kind in ss:
            nxt = next((st for st in stopped.get(name, []) if st[0] >= a1), None)
            if nxt is not None and a0 >= t_start:
                bursts.append((a1, nxt[0], kind, nxt[2]))
    begins = [t_start, *ends[:-1]]
    units: list[tuple[float, float, str]] = []  # (end, duration, class)
    classes: dict[str, list[float]] = {"plain": [], "burst": [], "start": [], "stop": [], "report": [], "near": []}
    spans = sorted(
        [(a, b, "start") for a, b in starts]
        + [(a, b, "stop") for a, b in stops]
        + [(a, b, "report") for a, b in reports]
    )
    burst_edges = sorted(bursts)
    by_kind: dict[str, dict[str, float]] = {}
    for _, _, kind, charged in bursts:
        row = by_kind.setdefault(kind, {"bursts": 0, "seconds": 0.0, "charged_ms": 0.0, "lost_ms": 0.0})
        row["bursts"] += 1
        row["charged_ms"] += 1000 * charged
    for a, z, kind, _ in bursts:
        by_kind[kind]["seconds"] += z - a
    in_kind: dict[str, list[float]] = {k: [] for k in by_kind}
    for b, e in zip(begins, ends, strict=True):
        d = e - b
        cls = "plain"
        for a, z, what in spans[max(0, bisect.bisect_left(spans, (b - 1.0, 0, "")) - 1) :]:
            if a > e:
                break
            if z >= b and a <= e:
                cls = what
                break
        if cls == "plain":
            i = bisect.bisect_right(burst_edges, (e, float("inf"), "", 0.0)) - 1
            if i >= 0 and burst_edges[i][0] <= e and b <= burst_edges[i][1]:
                cls = "burst"
                in_kind[burst_edges[i][2]].append(d)
            else:
                # within 50 ms after a stop or before a start: aftermath
                j = bisect.bisect_left([x[0] for x in spans], b - 0.05)
                if j < len(spans) and spans[j][0] <= e + 0.05:
                    cls = "near"
        classes[cls].append(d)
        units.append((e, d, cls))
    base = statistics.fmean(classes["plain"])  # plain units carry the sampling: the baseline
    # Per burst, against the plain units of the second before it and the second after it: the
    # machine's speed drifts by tens of percent over tens of seconds here, which a run-wide
    # baseline would book on whichever class ran long stretches (call bursts do).
    unit_ends = [u[0] for u in units]
    local_loss: dict[str, float] = {k: 0.0 for k in by_kind}
    local_n: dict[str, int] = {k: 0 for k in by_kind}
    for a, z, kind, _ in bursts:
        lo, hi = bisect.bisect_left(unit_ends, a - 1.0), bisect.bisect_right(unit_ends, z + 1.0)
        near = [d for e, d, c in units[lo:hi] if c == "plain" and (e < a or e > z)]
        inside = [d for e, d, c in units[lo:hi] if c == "burst" and a <= e <= z]
        if len(near) >= 20 and inside:
            local = statistics.fmean(near)
            local_loss[kind] += sum(d - local for d in inside)
            local_n[kind] += 1
    by_rate = rate_losses(ends, t_start, end, bursts, starts, stops, reports)
    result = {
        "workload": args.workload,
        "threads": nthreads,
        "by_rate": by_rate,
        "seconds": args.seconds,
        "budget": args.budget,
        "units": len(ends),
        "base_unit_ms": 1000 * base,
        "bursts": len(bursts),
        "burst_s": sum(z - a for a, z, _, _ in bursts),
        "start_op_ms": 1000 * sum(z - a for a, z in starts),
        "stop_op_ms": 1000 * sum(z - a for a, z in stops),
        # the sampler's looks at running bursts (each a wake-up taking the GIL), per second of burst
        "detail_steps_per_burst_s": sum(
            1 for n, a, _ in evs if n == "_detail_step" and any(b0 <= a <= b1 for b0, b1, _, _ in bursts)
        )
        / max(1e-9, sum(z - a for a, z, _, _ in bursts)),
        "reports": len(reports),
        "report_op_ms": 1000 * sum(z - a for a, z in reports),
        "mode": agent._monitor_plan is not None,
        "charged_ms": {k: 1000 * (spent1.get(k, 0) - spent0.get(k, 0)) for k in spent1},
        "lost_ms": {k: 1000 * sum(d - base for d in v) for k, v in classes.items()},
        # per kind of burst: how many, their seconds, the detail charged from start to stop (fixed
        # costs, the reservation settled to the measured slowdown, the wake-ups) and the units' loss
        "by_kind": {
            k: dict(
                row,
                lost_ms=1000 * sum(d - base for d in in_kind[k]),
                lost_local_ms=1000 * local_loss[k],
                measured_locally=local_n[k],
            )
            for k, row in by_kind.items()
        },
        "units_by_class": {k: len(v) for k, v in classes.items()},
        "median_ms": {k: 1000 * statistics.median(v) if v else None for k, v in classes.items()},
        "gc": [a - b for a, b in zip(gc_after, gc_before, strict=True)],
        "python": sys.version.split()[0],
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result))


#: bins of the rate-based analysis, seconds
BIN_S = 0.01
#: how long after a burst's start or stop or a report its aftermath is looked at
EDGE_S = 0.05


def rate_losses(
    ends: list[float],
    t0: float,
    t1: float,
    bursts: list[tuple[float, float, str, float]],
    starts: list[tuple[float, float]],
    stops: list[tuple[float, float]],
    reports: list[tuple[float, float]],
) -> dict[str, dict[str, float]]:
    """Seconds of work lost per class of time, from all threads' units per 10-ms bin.

    Each bin is classed: the EDGE_S after a burst's start began, else after a
    stop, else after a report, else inside a burst (by kind), else plain. A bin's loss is
    its length times one minus its units over the mean units of the plain
    bins within a second of it: the machine's speed drifts too much here for
    a run-wide baseline. Charged against nothing: burst_timeline's other
    figures have the charges.
    """
    n = int((t1 - t0) / BIN_S)
    counts = [0] * n
    for e in ends:
        i = int((e - t0) / BIN_S)
        if 0 <= i < n:
            counts[i] += 1
    cls = ["plain"] * n
    for a, z, kind, _ in bursts:
        for i in range(max(0, int((a - t0) / BIN_S)), min(n, int((z - t0) / BIN_S) + 1)):
            cls[i] = "burst " + kind
    for name, spans in (("report", reports), ("stop", stops), ("start", starts)):
        for a, z in spans:
            for i in range(max(0, int((a - t0) / BIN_S)), min(n, int((max(z, a + EDGE_S) - t0) / BIN_S) + 1)):
                cls[i] = name
    plain_sum = [0.0] * (n + 1)
    plain_n = [0] * (n + 1)
    for i in range(n):
        plain_sum[i + 1] = plain_sum[i] + (counts[i] if cls[i] == "plain" else 0)
        plain_n[i + 1] = plain_n[i] + (cls[i] == "plain")
    reach = int(1.0 / BIN_S)
    out: dict[str, dict[str, float]] = {}
    for i in range(n):
        lo, hi = max(0, i - reach), min(n, i + reach + 1)
        k = plain_n[hi] - plain_n[lo]
        if k < reach // 2:
            continue
        local = (plain_sum[hi] - plain_sum[lo]) / k
        if local <= 0:
            continue
        row = out.setdefault(cls[i], {"seconds": 0.0, "lost_ms": 0.0})
        row["seconds"] += BIN_S
        row["lost_ms"] += 1000 * BIN_S * (1.0 - counts[i] / local)
    for row in out.values():
        row["lost_pct"] = 100 * row["lost_ms"] / 1000 / max(row["seconds"], 1e-9)
    return out


if __name__ == "__main__":
    main()
