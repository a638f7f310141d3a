"""Overhead by paired windows in one process: under the noise that separate runs carry.

    python bench/overhead_windows.py [--workloads cpu-1,cpu-4,alloc,service,raytrace,...] [--budgets 0.1%,1%,5%,10%,25%]
                                     [--cycles 8] [--window 4] [--settle 1.5] [--json out.json]

bench/overhead.py compares separate processes, and on a shared VM two runs of
the same process differ by 5 to 60%: a 1% overhead cannot be seen in that. Here
one process runs a workload's unit of work without end (bench/workloads/_windows.py
records when each unit ends), under ``dyper run`` with a standing monitor, and
this script switches the agent's budget live (the monitor's ``budget``
operation, which is what ``dyper budget PID 5%`` does) between a base budget
and each budget under test, in windows of a few seconds:

    base | B1 | base | B2 | base | ... | base        (budgets shuffled in every cycle)

The overhead of budget B in one of its windows is the work rate of the two base
windows beside it (their mean, which cancels a linear drift of the machine's
speed) over the rate in the window, minus one. Each window's first ``--settle``
seconds are left out: the agent takes the new budget at its next wake-up, and a
detailing burst started in one window may end in the next. The table gives the
median over cycles, with a distribution-free 90% confidence interval for it
from the order statistics of the windows (the binomial interval: with n windows,
the k-th smallest and largest, k the largest for which both tails hold at most
5%). A cell is over its target beyond the noise only when the whole interval is
above the target. Neighbouring windows of one budget share no base window, but
windows of different budgets do, so the intervals are a little narrower than
independent windows would give. The noise is the same figure for base windows
against their base neighbours two windows away (median of its absolute value), so
it is what two measurements of nothing differ by here.

``--reanalyse FILE`` prints the tables again from a ``--json`` file, without
running anything.

The service is httpbin under gunicorn with one sync worker (gunicorn and
httpbin from bench/requirements.txt), under a closed loop of GET requests on
four connections from bench/workloads/loadgen.py, which records when each
response ended; the budget is switched on the worker, and the work rate is
responses per second.

The base budget (default 0.01%, the least the agent takes) is not zero: the
agent is loaded and idles. What having it loaded costs at all (its imported
objects in every full garbage collection, its idle thread) is the same in every
window, so it is not in these figures: bench/overhead.py's separate processes
are what see it.

Beside each measured figure, the agent's own ledger: what it reported spending
over the windows of that budget (reports lag by up to a report interval, so
each window is counted with the base window after it; the base spends at most
0.01% of the pair), as the slowdown it amounts to over the windows' length
(seconds spent over the seconds left to the application: agent.budget.slowdown).
A second table gives the ledger over the same part of each window as the
measured figure (after --settle), each report's spend spread over the time it
covers. The two differ because the agent saves up before its first burst after
a budget change and spends it later in the window.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.overhead import children, free_port, log, machine_info, pct, wait_http, wait_port
from dyper.agent.budget import slowdown, slowdown_by
from dyper.monitor.client import MonitorClient

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DRIVER = HERE / "workloads" / "_windows.py"
LOADGEN = HERE / "workloads" / "loadgen.py"
PYPERFORMANCE = ("raytrace", "richards", "deltablue", "nbody", "json_dumps")
WORKLOADS = ("cpu-1", "cpu-4", "alloc", "service", *PYPERFORMANCE)


def rate(stamps: list[list[float]], t0: float, t1: float) -> float:
    """Units of work per second done in [t0, t1), all threads together.

    Each unit runs from the stamp before it to its own; a unit that straddles
    an edge of the window counts for the part of it inside. Counting whole
    units would move a window's figure by one unit either way: 4% of a
    2.5-s window of richards' 0.1-s units.
    """
    done = 0.0
    for ts in stamps:
        i = max(bisect.bisect_left(ts, t0), 1)
        j = min(bisect.bisect_right(ts, t1), len(ts) - 1)
        for k in range(i, j + 1):
            a, b = ts[k - 1], ts[k]
            if b > a:
                done += max(0.0, min(b, t1) - max(a, t0)) / (b - a)
    return done / (t1 - t0)


def wait_session(
    client: MonitorClient, runner: subprocess.Popen[bytes], timeout_s: float, pid: int | None = None
) -> int:
    """The pid of the workload's session (or of process ``pid``), once its agent is connected and reporting."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if runner.poll() is not None:
            raise RuntimeError(f"the workload exited with {runner.returncode} before its agent reported")
        for s in client.call("sessions"):
            mine = s["pid"] == pid if pid is not None else any("_windows.py" in a for a in s["argv"])
            if mine and s["connected"] and s["reports"] > 0:
                return int(s["pid"])
        time.sleep(0.2)
    raise RuntimeError("the workload's agent did not report to the monitor")


def ledger(client: MonitorClient, pid: int) -> tuple[dict[str, float], int]:
    """Seconds the agent reported spending so far, by what on (sample, report, detail), and samples."""
    for s in client.call("sessions"):
        if s["pid"] == pid:
            return dict(s.get("spent_s", {})), int(s["samples"])
    raise RuntimeError(f"process {pid} left the monitor")


def make_schedule(args: argparse.Namespace) -> tuple[list[float], float, list[float]]:
    """The budgets under test, the base, and the windows' budgets in order: base | B | base | B' | ... | base."""
    budgets = [pct(b) for b in args.budgets.split(",")]
    base = pct(args.base)
    rng = random.Random(args.seed)
    schedule: list[float] = []
    for _ in range(args.cycles):
        order = budgets[:]
        rng.shuffle(order)
        for b in order:
            schedule += [base, b]
    schedule.append(base)
    return budgets, base, schedule


def switch_windows(
    args: argparse.Namespace, client: MonitorClient, pid: int, schedule: list[float], label: str
) -> tuple[list[dict[str, Any]], dict[str, float], int]:
    """Warm up, then set each window's budget in turn; the windows, and the ledger after the last."""
    # Warm-up at a middling budget: the agent measures what its samples and reports cost.
    client.call("budget", pid=pid, budget=0.05)
    time.sleep(args.warmup)
    log(f"  {label}: pid {pid}, {len(schedule)} windows of {args.window:g} s")
    windows: list[dict[str, Any]] = []
    reports: dict[float, tuple[float, float]] = {}
    for i, b in enumerate(schedule):
        client.call("budget", pid=pid, budget=b)
        t0, w0 = time.monotonic(), time.time()
        spent0, samples0 = ledger(client, pid)
        time.sleep(args.window)
        windows.append(
            {"budget": b, "t0": t0, "t1": time.monotonic(), "w0": w0, "w1": time.time(), "spent0": spent0,
             "samples0": samples0}
        )  # fmt: skip
        if i % 10 == 9:
            log(f"  {label}: {i + 1}/{len(schedule)} windows")
            reports.update(report_spend(client, pid))
    time.sleep(args.window)  # the last window's report
    spent_end, samples_end = ledger(client, pid)
    reports.update(report_spend(client, pid))
    for w in windows:
        w["spent_measured"] = spend_between(reports, w["w0"] + args.settle, w["w1"])
    return windows, spent_end, samples_end


def report_spend(client: MonitorClient, pid: int) -> dict[float, tuple[float, float]]:
    """The agent's recent reports: when each was made (its clock) -> (seconds it covered, seconds it spent)."""
    # Buckets of a millisecond hold one report each (they come at least a second apart).
    tl = client.call("timeline", pid=pid, window_s=120.0, bucket_s=0.001)
    # [bucket start, sampling passes, reports, seconds spent, seconds covered, budget]
    return {round(row[0], 2): (row[4], row[3]) for row in tl["buckets"] if row[2] == 1}


def spend_between(reports: dict[float, tuple[float, float]], a: float, b: float) -> float:
    """Seconds the agent reported spending in [a, b], each report's spend spread evenly over what it covered."""
    spent = 0.0
    for t, (covered, s) in reports.items():
        if covered > 0:
            overlap = min(b, t) - max(a, t - covered)
            if overlap > 0:
                spent += s * overlap / covered
    return spent


def window_figures(
    args: argparse.Namespace,
    windows: list[dict[str, Any]],
    stamps: list[list[float]],
    spent_end: dict[str, float],
    samples_end: int,
) -> None:
    """Each window's work rate (its first --settle seconds left out), spend and samples."""
    ends = [w["spent0"] for w in windows[1:]] + [spent_end]
    sample_ends = [w["samples0"] for w in windows[1:]] + [samples_end]
    for w, spent1, samples1 in zip(windows, ends, sample_ends, strict=True):
        w["rate"] = rate(stamps, w["t0"] + args.settle, w["t1"])
        w["spent_by"] = {k: v - w["spent0"].get(k, 0.0) for k, v in spent1.items()}
        w["spent"] = sum(w["spent_by"].values())
        w["samples"] = samples1 - w["samples0"]


def run_workload(args: argparse.Namespace, workload: str, endpoint: str, tmp: Path) -> dict[str, Any]:
    if workload == "service":
        return run_service(args, endpoint, tmp)
    budgets, base, schedule = make_schedule(args)
    seconds = args.warmup + len(schedule) * args.window + 30
    out = tmp / f"{workload}.json"
    cmd = [
        args.python, "-m", "dyper", "run", "-q", "--monitor", endpoint, "--budget", args.base, "--",
        args.python, str(DRIVER), workload, f"{seconds:g}", str(out),
    ]  # fmt: skip
    log_path = tmp / f"{workload}.log"
    with open(log_path, "wb") as logf:
        runner = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        with MonitorClient(endpoint, timeout=10) as client:
            pid = wait_session(client, runner, 60)
            windows, spent_end, samples_end = switch_windows(args, client, pid, schedule, workload)
            client.call("detach", pid=pid)
        os.kill(pid, signal.SIGTERM)  # the workload writes its stamps and ends
        runner.wait(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    if not out.exists():
        raise RuntimeError(f"{workload} wrote no stamps:\n{log_path.read_text()[-1500:]}")
    window_figures(args, windows, json.loads(out.read_text())["threads"], spent_end, samples_end)
    return analyse(windows, budgets, base, args.settle)


def run_service(args: argparse.Namespace, endpoint: str, tmp: Path) -> dict[str, Any]:
    """httpbin under gunicorn (one sync worker) with the agent, under a closed loop of requests.

    The work rate is responses per second, from bench/workloads/loadgen.py
    (it records when each response ended). The budget is switched on the
    worker, where the requests are served; gunicorn's master idles.
    """
    budgets, base, schedule = make_schedule(args)
    port = free_port()
    pidfile, out = tmp / "gunicorn.pid", tmp / "service.json"
    gunicorn = [
        args.python, "-m", "gunicorn", "-w", "1", "-k", "sync", "-b", f"127.0.0.1:{port}",
        "--pid", str(pidfile), "--error-logfile", str(tmp / "gunicorn.log"), "httpbin:app",
    ]  # fmt: skip
    cmd = [args.python, "-m", "dyper", "run", "-q", "--monitor", endpoint, "--budget", args.base, "--", *gunicorn]
    log_path = tmp / "service.log"
    with open(log_path, "wb") as logf:
        runner = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    loadgen: subprocess.Popen[bytes] | None = None
    master = 0
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() or not pidfile.read_text().strip():
            if runner.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not start:\n{log_path.read_text()[-1500:]}")
            time.sleep(0.1)
        master = int(pidfile.read_text().strip())
        wait_http(f"http://127.0.0.1:{port}/get", 60)
        workers = children(master)
        while not workers and time.monotonic() < deadline:
            time.sleep(0.1)
            workers = children(master)
        if len(workers) != 1:
            raise RuntimeError(f"gunicorn has {len(workers)} workers, not 1")
        seconds = args.warmup + len(schedule) * args.window + 30
        with open(tmp / "loadgen.log", "wb") as lf:
            loadgen = subprocess.Popen(
                [args.python, str(LOADGEN), f"http://127.0.0.1:{port}/get", "--connections", "4",
                 "--duration", f"{seconds:g}", "--stamps", str(out)],
                stdout=lf, stderr=subprocess.STDOUT, cwd=REPO,
            )  # fmt: skip
        with MonitorClient(endpoint, timeout=10) as client:
            pid = wait_session(client, runner, 60, pid=workers[0])
            windows, spent_end, samples_end = switch_windows(args, client, pid, schedule, "service")
        loadgen.send_signal(signal.SIGTERM)  # it writes its stamps and ends
        loadgen.wait(timeout=60)
    finally:
        if loadgen is not None and loadgen.poll() is None:
            loadgen.kill()
            loadgen.wait()
        if master:
            with contextlib.suppress(ProcessLookupError):
                os.kill(master, signal.SIGTERM)
        try:
            runner.wait(timeout=30)
        except subprocess.TimeoutExpired:
            runner.kill()
            runner.wait()
    if not out.exists():
        raise RuntimeError(f"the load generator wrote no stamps:\n{(tmp / 'loadgen.log').read_text()[-1500:]}")
    window_figures(args, windows, json.loads(out.read_text())["threads"], spent_end, samples_end)
    return analyse(windows, budgets, base, args.settle)


def median_interval(xs: list[float], level: float = 0.9) -> tuple[float, float, float]:
    """A distribution-free confidence interval for the median of ``xs``: (low, high, coverage).

    The k-th smallest and the k-th largest value, k the largest for which
    P(Binomial(n, 1/2) < k) <= (1 - level) / 2; the coverage is then at least
    ``level``. With fewer than 5 values no such k exists at 90%, and the interval
    is the whole range (coverage 1 - 2 / 2**n).
    """
    ys = sorted(xs)
    n = len(ys)
    if n == 0:
        raise ValueError("no values")

    def below(k: int) -> float:  # P(Binomial(n, 1/2) < k)
        return sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= n // 2 and below(k + 1) <= (1 - level) / 2:
        k += 1
    return ys[k - 1], ys[n - k], 1 - 2 * below(k)


def loss_per_ledger(cells: list[dict[str, Any]], resamples: int = 2000) -> tuple[float, float, float]:
    """How much the application lost per unit the agent charged: (slope, low, high).

    The slope through the origin of each window's measured overhead against its
    ledger over the same part of the window (least squares), pooled over every
    budget, with a 90% bootstrap interval over windows. Pooling uses every window
    at once, so it resolves what one budget's median cannot: a slope of 1 is a
    ledger that sees every cost, above 1 a cost it misses.
    """
    pairs = [(x, y) for c in cells for x, y in zip(c["reported_measureds"], c["overheads"], strict=True)]

    def slope(ps: list[tuple[float, float]]) -> float:
        return sum(x * y for x, y in ps) / max(sum(x * x for x, _ in ps), 1e-12)

    rng = random.Random(0)
    boot = sorted(slope([rng.choice(pairs) for _ in pairs]) for _ in range(resamples))
    return slope(pairs), boot[int(0.05 * resamples)], boot[int(0.95 * resamples) - 1]


def analyse(windows: list[dict[str, Any]], budgets: list[float], base: float, settle: float) -> dict[str, Any]:
    per: dict[float, dict[str, list[float]]] = {
        b: {"overhead": [], "spent": [], "seconds": [], "samples": [], "spent_measured": []} for b in budgets
    }
    spent_by: dict[float, dict[str, float]] = {b: {} for b in budgets}
    noise: list[float] = []
    for i, w in enumerate(windows):
        if w["budget"] == base:
            if 2 <= i < len(windows) - 2:
                around = (windows[i - 2]["rate"] + windows[i + 2]["rate"]) / 2
                noise.append(around / w["rate"] - 1)
            continue
        around = (windows[i - 1]["rate"] + windows[i + 1]["rate"]) / 2
        cell = per[w["budget"]]
        cell["overhead"].append(around / w["rate"] - 1)
        # the window's spend with the base window after it: reports lag
        cell["spent"].append(w["spent"] + windows[i + 1]["spent"])
        for pair in (w, windows[i + 1]):
            for k, v in pair["spent_by"].items():
                spent_by[w["budget"]][k] = spent_by[w["budget"]].get(k, 0.0) + v
        cell["seconds"].append(w["t1"] - w["t0"])
        cell["spent_measured"].append(slowdown(w["spent_measured"], w["w1"] - w["w0"] - settle))
        cell["samples"].append((w["samples"] + windows[i + 1]["samples"]) / (w["t1"] - w["t0"]))
    result: dict[str, Any] = {"budgets": {}, "noise": statistics.median(abs(x) for x in noise) if noise else None}
    for b, cell in per.items():
        low, high, coverage = median_interval(cell["overhead"])
        result["budgets"][f"{100 * b:g}%"] = {
            "overhead": statistics.median(cell["overhead"]),
            "overheads": cell["overhead"],
            "interval": [low, high],
            "coverage": coverage,
            # as a slowdown, like the budget and the measured figure (agent.budget.slowdown)
            "reported": slowdown(sum(cell["spent"]), sum(cell["seconds"])),
            # over the same part of each window as the overhead (median)
            "reported_measured": statistics.median(cell["spent_measured"]),
            "reported_measureds": cell["spent_measured"],
            "reported_by": slowdown_by(dict(sorted(spent_by[b].items())), sum(cell["seconds"])),
            "samples_per_s": statistics.median(cell["samples"]),
        }
    result["windows"] = windows
    return result


def print_table(results: dict[str, dict[str, Any]], budgets: list[str]) -> None:
    names = list(results)
    print("\nactual overhead %, median over cycles [90% confidence interval] (the agent's reported spend)\n")
    print("| target | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    over: list[str] = []
    for b in budgets:
        key = f"{100 * pct(b):g}%"
        cells = []
        for n in names:
            c = results[n]["budgets"][key]
            low, high = c["interval"]
            mark = ""
            if low > pct(b):  # the whole interval above the target: over beyond the noise
                mark = " **over**"
                over.append(f"{n} at {b}")
            figure = f"{100 * c['overhead']:.1f} [{100 * low:.1f}, {100 * high:.1f}]"
            cells.append(f"{figure} ({100 * c['reported']:.2f}){mark}")
        print(f"| {b} | " + " | ".join(cells) + " |")
    print("| noise ± | " + " | ".join(f"{100 * results[n]['noise']:.2f}" for n in names) + " |")
    coverage = min(c["coverage"] for r in results.values() for c in r["budgets"].values())
    print(f"\nintervals cover the median with probability at least {coverage:.2f}")
    print("over the target beyond the noise: " + (", ".join(over) if over else "none"))
    for n in names:
        a, lo, hi = loss_per_ledger(list(results[n]["budgets"].values()))
        print(f"{n}: lost per unit charged {a:.2f} [{lo:.2f}, {hi:.2f}] (every window, 90% bootstrap interval)")
    for n in names:
        used = []
        for b in budgets:
            if pct(b) >= 0.05:
                c = results[n]["budgets"][f"{100 * pct(b):g}%"]
                used.append(f"{b} {c['overhead'] / pct(b):.2f} (ledger {c['reported_measured'] / pct(b):.2f})")
        if used:
            print(f"{n}: share of the target used, measured: " + ", ".join(used))
    print("\nthe reported spend over the measured part of each window (after --settle), median %\n")
    print("| target | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for b in budgets:
        key = f"{100 * pct(b):g}%"
        cells = [f"{100 * results[n]['budgets'][key]['reported_measured']:.2f}" for n in names]
        print(f"| {b} | " + " | ".join(cells) + " |")
    print("\nthe reported spend by what it went on, %\n")
    for n in names:
        for b in budgets:
            key = f"{100 * pct(b):g}%"
            by = results[n]["budgets"][key]["reported_by"]
            print(f"{n} {b}: " + ", ".join(f"{k} {100 * v:.2f}" for k, v in by.items()))
    print("\nsamples/s in the windows of each budget (median)\n")
    print("| target | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for b in budgets:
        key = f"{100 * pct(b):g}%"
        print(f"| {b} | " + " | ".join(f"{results[n]['budgets'][key]['samples_per_s']:.0f}" for n in names) + " |")


def reanalyse(path: Path) -> int:
    """The tables of an earlier run, from its --json file, with this version's analysis."""
    saved = json.loads(path.read_text())
    old = saved["args"]
    budgets = [b.strip() for b in old["budgets"].split(",")]
    results = {
        name: analyse(r["windows"], [pct(b) for b in budgets], pct(old["base"]), old["settle"])
        for name, r in saved["results"].items()
    }
    print_table(results, budgets)
    print(f"\nmachine: {json.dumps(saved['machine'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--workloads",
        default="cpu-1,cpu-4,alloc,service",
        help=f"some of {', '.join(WORKLOADS)} (default: the first four)",
    )
    ap.add_argument("--budgets", default="0.1%,1%,5%,10%,25%")
    ap.add_argument("--base", default="0.01%", help="the budget between windows (default 0.01%%, the least)")
    ap.add_argument("--cycles", type=int, default=8, help="windows per budget (default 8)")
    ap.add_argument("--window", type=float, default=4.0, help="seconds per window (default 4)")
    ap.add_argument("--settle", type=float, default=1.5, help="seconds left out at each window's start (default 1.5)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds at 5%% before the first window")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--reanalyse", metavar="FILE", help="print the tables again from a --json file and stop")
    args = ap.parse_args(argv)
    if args.reanalyse:
        return reanalyse(Path(args.reanalyse))
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload {unknown[0]!r}: give some of {', '.join(WORKLOADS)}")
    if args.settle >= args.window:
        ap.error("--settle must be shorter than --window")
    if any(w in PYPERFORMANCE for w in workloads):
        probe = subprocess.run([args.python, "-c", "import pyperf, pyperformance"], capture_output=True)
        if probe.returncode != 0:
            ap.error(
                f"pyperformance workloads need pyperformance: {args.python} -m pip install -r bench/requirements.txt"
            )
    if "service" in workloads:
        probe = subprocess.run([args.python, "-c", "import gunicorn, httpbin"], capture_output=True)
        if probe.returncode != 0:
            ap.error(f"the service needs gunicorn and httpbin: {args.python} -m pip install -r bench/requirements.txt")
    machine = machine_info(args.python)
    log(f"machine: {machine['cpu_model']}, {machine['cores']} cores, Python {machine['python']}")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="dyper-windows-") as tmpname:
        tmp = Path(tmpname)
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        mlog = open(tmp / "monitor.log", "wb")  # noqa: SIM115
        monitor = subprocess.Popen(
            [args.python, "-m", "dyper", "monitor", "--listen", endpoint, "--no-history"],
            stdout=mlog, stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip
        try:
            wait_port(int(endpoint.rsplit(":", 1)[1]), 30)
            for w in workloads:
                log(f"{w}: starting")
                results[w] = run_workload(args, w, endpoint, tmp)
        finally:
            monitor.terminate()
            monitor.wait(timeout=30)
            mlog.close()
    budgets = [b.strip() for b in args.budgets.split(",")]
    print_table(results, budgets)
    print(f"\nmachine: {json.dumps(machine)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
