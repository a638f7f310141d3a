"""Soak: the agent in a loaded WSGI service for a long time, streaming to a real monitor. Is memory flat?

    python bench/soak.py [--minutes 30] [--budget 5%] [--interval 10] [--warmup MIN] [--workers 1]
                         [--connections 4] [--python PY] [--json FILE] [--plot FILE.png]

The service is bench/overhead.py's: httpbin under gunicorn (sync workers),
started with ``dyper run --monitor EP --budget B`` against a standing
``dyper monitor`` (with its history file), so the agent runs in gunicorn's
master and in every forked worker, and driven by wrk (or
bench/workloads/loadgen.py when wrk is not installed) at --connections.
Needs gunicorn and httpbin in --python (pip install -r bench/requirements.txt).

The load runs in back-to-back chunks of --interval seconds; after each chunk
the harness records, for the master and each worker: RSS, threads, open file
descriptors, and what the agent reported to the monitor (samples, overhead
spent over its whole run and over the last 10 s); for the service: requests
per second and p99 latency of the chunk; and the monitor's own RSS. One
progress line per chunk.

At the end a line is fitted to each process's RSS after the warm-up (default:
a quarter of the run, at most 5 minutes), and its slope reported in KB/min
(1 KB = 1024 bytes) with a 95% confidence interval. Memory is **flat** when
that whole interval lies below --flat (default 16 KB/min, about 1 MiB per
hour), **growing** when it lies above, and **inconclusive** when it
straddles it (too short or too noisy a run: run longer). The interval
assumes independent residuals; RSS wanders slowly, so treat a verdict from
a run of a few minutes as a hint only. Threads and file descriptors after the
warm-up should not change at all.

--json FILE writes every record and figure; --plot FILE.png (default: next to
--json, if matplotlib is installed) draws RSS, requests/s and samples/s over
time. Samples reach the monitor with the agent's reports, every few seconds,
so samples/s is taken over the last three records.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from bench.overhead import (  # noqa: E402
    RunFailed,
    Settings,
    children,
    free_port,
    gunicorn_command,
    has_sampler,
    load,
    machine_info,
    stop_process,
    wait_http,
)
from dyper.monitor.client import MonitorClient, MonitorUnreachable, wait_for_monitor  # noqa: E402

#: Default threshold of "flat", KB (1024 bytes) per minute: about 1 MiB per hour.
FLAT_KB_PER_MIN = 16.0
#: Two-sided 95% quantiles of Student's t by degrees of freedom (the next lower one is used between them).
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18}
T975 |= {15: 2.13, 20: 2.09, 25: 2.06, 30: 2.04, 40: 2.02, 60: 2.00, 120: 1.98}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def t975(dof: int) -> float:
    return T975[max(k for k in T975 if k <= dof)] if dof >= 1 else math.inf


def fit(ts: list[float], ys: list[float]) -> dict[str, Any]:
    """Least-squares line through (t, y): slope with its 95% confidence interval (None with under 3 points)."""
    n = len(ts)
    if n < 3 or len(set(ts)) < 2:
        return {"n": n, "slope": None, "low": None, "high": None}
    reg = statistics.linear_regression(ts, ys)
    mean_t = statistics.fmean(ts)
    sxx = sum((t - mean_t) ** 2 for t in ts)
    residuals = sum((y - (reg.intercept + reg.slope * t)) ** 2 for t, y in zip(ts, ys, strict=True))
    stderr = math.sqrt(residuals / (n - 2) / sxx)
    half = t975(n - 2) * stderr
    return {"n": n, "slope": reg.slope, "low": reg.slope - half, "high": reg.slope + half}


def verdict(line: dict[str, Any], flat: float) -> str:
    if line["slope"] is None:
        return "inconclusive"
    if line["high"] <= flat:
        return "flat"
    if line["low"] > flat:
        return "growing"
    return "inconclusive"


def process_figures(pid: int) -> dict[str, Any]:
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return {"rss": p.memory_info().rss, "threads": p.num_threads(), "fds": p.num_fds()}
    except psutil.Error:
        return {"gone": True}


def agent_figures(sessions: list[dict[str, Any]], pid: int) -> dict[str, Any]:
    found = [s for s in sessions if s.get("pid") == pid]
    if not found:
        return {}
    s = found[-1]
    now = (s.get("spending") or {}).get("now") or {}
    return {
        "samples": s.get("samples"),
        "reports": s.get("reports"),
        "overhead": s.get("overhead"),
        "spent_now": sum(v for v in now.values() if isinstance(v, int | float)),
        "connected": s.get("connected"),
        "budget": s.get("budget"),
    }


class Service:
    """httpbin under gunicorn under ``dyper run --monitor``, and the standing monitor it streams to."""

    def __init__(self, settings: Settings, budget: str, workdir: Path) -> None:
        self.settings = settings
        self.budget = budget
        self.workdir = workdir
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{settings.service_path}"
        self.monitor: subprocess.Popen[bytes] | None = None
        self.runner: subprocess.Popen[bytes] | None = None
        self.master = 0
        self.workers: list[int] = []

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        with open(self.workdir / f"{name}.log", "wb") as out:
            return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)

    def log_tail(self, name: str, n: int = 800) -> str:
        with contextlib.suppress(OSError):
            return (self.workdir / f"{name}.log").read_text(errors="replace")[-n:]
        return ""

    def start(self) -> None:
        py = self.settings.python
        history = self.workdir / "history.sqlite3"
        self.monitor = monitor = self._spawn(
            [py, "-m", "dyper", "monitor", "--listen", self.endpoint, "--history", str(history)], "monitor"
        )
        try:
            wait_for_monitor(self.endpoint, 30, alive=lambda: monitor.poll() is None)
        except MonitorUnreachable:
            raise RunFailed(f"the monitor did not start: {self.log_tail('monitor')}") from None
        pidfile = self.workdir / "gunicorn.pid"
        gcmd = gunicorn_command(self.settings, self.port, pidfile, self.workdir / "gunicorn-error.log")
        run = [py, "-m", "dyper", "run", "--monitor", self.endpoint, "--budget", self.budget, "--", *gcmd]
        self.runner = self._spawn(run, "gunicorn")
        deadline = time.monotonic() + 60
        while not pidfile.exists() or not pidfile.read_text().strip():
            if self.runner.poll() is not None or time.monotonic() > deadline:
                raise RunFailed(f"gunicorn did not start: {self.log_tail('gunicorn')}")
            time.sleep(0.1)
        self.master = int(pidfile.read_text().strip())
        wait_http(self.url, 60)
        while time.monotonic() < deadline:
            self.workers = children(self.master)
            if len(self.workers) >= self.settings.service_workers and all(has_sampler(w) for w in self.workers):
                return
            time.sleep(0.1)
        raise RunFailed(f"gunicorn's workers {self.workers} did not all start dyper's sampler thread")

    def stop(self) -> None:
        if self.master:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.master, signal.SIGTERM)
        if self.runner is not None:
            try:
                self.runner.wait(30)
            except subprocess.TimeoutExpired:
                stop_process(self.runner)
        stop_process(self.monitor, wait_s=60)
        if self.master:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.master, signal.SIGKILL)


def soak(args: argparse.Namespace, settings: Settings, workdir: Path) -> dict[str, Any]:
    service = Service(settings, args.budget, workdir)
    records: list[dict[str, Any]] = []
    warnings: list[str] = []
    try:
        service.start()
        assert service.monitor is not None
        log(
            f"gunicorn master {service.master}, worker(s) {service.workers}, monitor {service.monitor.pid}; "
            f"{args.minutes:g} min of load at {settings.service_connections} connections by {settings.loadgen}, "
            f"a record every {args.interval:g} s"
        )
        started = time.monotonic()
        end = started + 60 * args.minutes
        client = MonitorClient(service.endpoint, timeout=30)
        try:
            while (left := end - time.monotonic()) >= 1.0:
                chunk = float(max(1, round(min(args.interval, left))))  # wrk takes whole seconds
                t0 = time.monotonic()
                try:
                    served = load(settings, service.url, chunk)
                except RunFailed as exc:
                    served = {"error": str(exc)}
                    # Keep the records' rhythm when the load generator fails.
                    time.sleep(max(0.0, chunk - (time.monotonic() - t0)))
                t = time.monotonic() - started
                try:
                    sessions = client.call("sessions")
                except Exception as exc:
                    sessions = []
                    warnings.append(f"at {t:.0f} s the monitor did not answer: {exc}")
                now_workers = children(service.master)
                if sorted(now_workers) != sorted(service.workers):
                    warnings.append(f"at {t:.0f} s gunicorn's workers changed: {service.workers} -> {now_workers}")
                    service.workers = now_workers
                rec: dict[str, Any] = {
                    "t": t,
                    "rps": served.get("rps"),
                    "p99_ms": served.get("p99_ms"),
                    "load_errors": served.get("errors"),
                    "processes": {},
                    "monitor": process_figures(service.monitor.pid),
                }
                if "error" in served:
                    rec["load_error"] = served["error"]
                for role, pid in [("master", service.master), *(("worker", w) for w in service.workers)]:
                    rec["processes"][str(pid)] = {"role": role, **process_figures(pid), **agent_figures(sessions, pid)}
                records.append(rec)
                progress(rec, records, args.minutes)
        finally:
            client.close()
    finally:
        service.stop()
    return {"records": records, "warnings": warnings, "master": service.master}


#: Records over which samples/s is taken: reports, which carry the samples, come every few seconds.
RATE_RECORDS = 3


def progress(rec: dict[str, Any], records: list[dict[str, Any]], minutes: float) -> None:
    prev = records[-1 - RATE_RECORDS] if len(records) > RATE_RECORDS else (records[0] if len(records) > 1 else None)
    parts = [
        f"[{rec['t'] / 60:5.1f}/{minutes:g} min] {_num(rec['rps'], '.0f')} req/s p99 {_num(rec['p99_ms'], '.1f')} ms"
    ]
    for pid, p in rec["processes"].items():
        if p.get("gone"):
            parts.append(f"{p['role']} {pid} gone")
            continue
        rate = ""
        before = prev["processes"].get(pid) if prev else None
        if before and before.get("samples") is not None and p.get("samples") is not None:
            assert prev is not None
            rate = f" (+{(p['samples'] - before['samples']) / (rec['t'] - prev['t']):.0f}/s)"
        parts.append(
            f"{p['role']} {pid}: RSS {p['rss'] / 2**20:.1f} MiB, {p['threads']} threads, {p['fds']} fds, "
            f"{_num(p.get('samples'), ',')} samples{rate}, spent {_pct(p.get('overhead'))} "
            f"(now {_pct(p.get('spent_now'))})"
        )
    mon = rec["monitor"]
    if not mon.get("gone"):
        parts.append(f"monitor RSS {mon['rss'] / 2**20:.1f} MiB")
    log(" | ".join(parts))


def _num(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def analyse(result: dict[str, Any], warmup_s: float, flat: float, budget: float) -> dict[str, Any]:
    records = result["records"]
    after = [r for r in records if r["t"] >= warmup_s]
    pids = list(dict.fromkeys(pid for r in records for pid in r["processes"]))
    processes: dict[str, Any] = {}
    for pid in pids:
        series = [(r["t"], r["processes"][pid]) for r in after if pid in r["processes"]]
        series = [(t, p) for t, p in series if not p.get("gone")]
        everything = [p for r in records if pid in r["processes"] for p in [r["processes"][pid]] if not p.get("gone")]
        if not everything:
            continue
        line = fit([t / 60 for t, _ in series], [p["rss"] / 1024 for _, p in series])
        samples = [(t, p["samples"]) for t, p in series if p.get("samples") is not None]
        rate = (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0]) if len(samples) > 1 else None
        last = everything[-1]
        processes[pid] = {
            "role": everything[0]["role"],
            "rss_start_mib": everything[0]["rss"] / 2**20,
            "rss_end_mib": last["rss"] / 2**20,
            "rss_slope_kb_per_min": line,
            "memory": verdict(line, flat),
            "threads": [min(p["threads"] for _, p in series), max(p["threads"] for _, p in series)] if series else None,
            "fds": [min(p["fds"] for _, p in series), max(p["fds"] for _, p in series)] if series else None,
            "samples": last.get("samples"),
            "samples_per_s": rate,
            "overhead": last.get("overhead"),
            "over_budget": last.get("overhead") is not None and last["overhead"] > budget,
        }
    mon = [(r["t"], r["monitor"]) for r in after if not r["monitor"].get("gone")]
    rps = [r["rps"] for r in after if r.get("rps") is not None]
    return {
        "warmup_s": warmup_s,
        "flat_kb_per_min": flat,
        "points_after_warmup": len(after),
        "processes": processes,
        "monitor_rss_mib": [mon[0][1]["rss"] / 2**20, mon[-1][1]["rss"] / 2**20] if mon else None,
        "monitor_rss_slope_kb_per_min": fit([t / 60 for t, _ in mon], [m["rss"] / 1024 for _, m in mon]),
        "rps": {"mean": statistics.fmean(rps), "min": min(rps), "max": max(rps)} if rps else None,
    }


def print_summary(out: dict[str, Any]) -> None:
    a = out["analysis"]
    m = out["machine"]
    s = out["settings"]
    print()
    print(
        f"dyper soak: {s['minutes']:g} min at budget {s['budget']} on httpbin under gunicorn ({s['workers']} sync "
        f"worker(s), {s['connections']} connections by {s['loadgen']}). Machine: {m['cpu_model']}, {m['cores']} cores, "
        f"CPython {m['python']}, dyper {m['dyper_commit']}, load average {m['load_avg_at_start'][0]:.2f} at start"
    )
    if a["rps"]:
        print(f"service: {a['rps']['mean']:.0f} req/s on average after the warm-up (min {a['rps']['min']:.0f})")
    print(
        f"RSS fitted after a warm-up of {a['warmup_s'] / 60:.1f} min ({a['points_after_warmup']} points); flat = "
        f"the slope's 95% interval below {a['flat_kb_per_min']:g} KB/min"
    )
    print()
    head = f"{'process':>16}{'RSS start':>11}{'RSS end':>9}{'slope KB/min':>14}{'95% interval':>20}{'memory':>14}"
    print(head + f"{'threads':>9}{'fds':>9}{'samples/s':>11}{'spent':>8}")
    for pid, p in a["processes"].items():
        line = p["rss_slope_kb_per_min"]
        interval = "-" if line["slope"] is None else f"[{line['low']:.1f}, {line['high']:.1f}]"
        threads = "-" if not p["threads"] else "{}-{}".format(*p["threads"])
        fds = "-" if not p["fds"] else "{}-{}".format(*p["fds"])
        print(
            f"{p['role'] + ' ' + pid:>16}{p['rss_start_mib']:>10.1f}M{p['rss_end_mib']:>8.1f}M"
            f"{_num(line['slope'], '14.1f'):>14}{interval:>20}{p['memory']:>14}{threads:>9}{fds:>9}"
            f"{_num(p['samples_per_s'], '11.0f'):>11}{_pct(p['overhead']):>8}"
        )
    line = a["monitor_rss_slope_kb_per_min"]
    if a["monitor_rss_mib"]:
        print(
            f"{'monitor':>16}{a['monitor_rss_mib'][0]:>10.1f}M{a['monitor_rss_mib'][1]:>8.1f}M"
            f"{_num(line['slope'], '14.1f'):>14}   (keeps 10 min of reports for 'now' windows: grows that long)"
        )
    for w in out["warnings"]:
        print(f"warning: {w}")
    flat = all(p["memory"] == "flat" for p in a["processes"].values())
    steady = all(p["threads"] and p["threads"][0] == p["threads"][1] for p in a["processes"].values()) and all(
        p["fds"] and p["fds"][0] == p["fds"][1] for p in a["processes"].values()
    )
    print()
    print(
        f"memory flat in every process: {'yes' if flat else 'no'}; threads and fds constant after the warm-up: "
        f"{'yes' if steady else 'no'}"
    )


def plot(out: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    records = out["records"]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    pids = list(dict.fromkeys(pid for r in records for pid in r["processes"]))
    for pid in pids:
        pts = [(r["t"] / 60, r["processes"][pid]) for r in records if pid in r["processes"]]
        pts = [(t, p) for t, p in pts if not p.get("gone")]
        label = f"{pts[0][1]['role']} {pid}"
        ax1.plot([t for t, _ in pts], [p["rss"] / 2**20 for _, p in pts], label=label)
        counted = [(t, p["samples"]) for t, p in pts if p.get("samples") is not None]
        rates = [
            (t1, (n1 - n0) / (60 * (t1 - t0)))
            for (t0, n0), (t1, n1) in zip(counted, counted[RATE_RECORDS:], strict=False)
            if t1 > t0
        ]
        ax3.plot([t for t, _ in rates], [r for _, r in rates], label=label)
    ax1.axvline(out["analysis"]["warmup_s"] / 60, color="grey", linestyle=":", label="end of warm-up")
    ax1.set_ylabel("RSS (MiB)")
    ax1.legend()
    ax2.plot([r["t"] / 60 for r in records], [r.get("rps") or 0 for r in records])
    ax2.set_ylabel("requests/s")
    ax3.set_ylabel("samples/s (agent)")
    ax3.set_xlabel("minutes")
    ax3.legend()
    ax1.set_title(f"dyper soak at {out['settings']['budget']}")
    fig.tight_layout()
    fig.savefig(path)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--budget", default="5%")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between records, whole (default 10)")
    ap.add_argument("--warmup", type=float, help="minutes left out of the fit (default: a quarter, at most 5)")
    ap.add_argument("--flat", type=float, default=FLAT_KB_PER_MIN, help="KB/min below which RSS counts as flat")
    ap.add_argument("--workers", type=int, default=1, help="gunicorn sync workers (default 1)")
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--path", default="/get", help="the httpbin endpoint the load hits")
    ap.add_argument("--loadgen", choices=("auto", "wrk", "python"), default="auto")
    ap.add_argument("--python", default=sys.executable, help="the Python of the service and the monitor")
    ap.add_argument("--json", type=Path, help="write every record and figure here")
    ap.add_argument("--plot", type=Path, help="PNG of RSS and requests/s over time (needs matplotlib)")
    args = ap.parse_args(argv)
    from dyper.agent.protocol import parse_budget

    try:
        budget = parse_budget(args.budget)
    except ValueError as exc:
        ap.error(str(exc))
    if args.minutes <= 0 or args.interval <= 0:
        ap.error("--minutes and --interval must be positive")
    missing = subprocess.run([args.python, "-c", "import gunicorn, httpbin"], capture_output=True, text=True)
    if missing.returncode != 0:
        print(
            f"bench/soak.py needs gunicorn and httpbin in {args.python}: "
            f"{args.python} -m pip install -r bench/requirements.txt",
            file=sys.stderr,
        )
        return 2
    loadgen = args.loadgen
    if loadgen == "auto":
        import shutil

        loadgen = "wrk" if shutil.which("wrk") else "python"
    extra = []
    helptext = subprocess.run([args.python, "-m", "gunicorn", "--help"], capture_output=True, text=True).stdout
    if "--no-control-socket" in helptext:
        extra.append("--no-control-socket")
    settings = Settings(
        python=args.python,
        repeats=1,
        budgets=[args.budget],
        workloads=["service"],
        units={},
        pyperf_values=0,
        pyperf_warmups=0,
        service_workers=args.workers,
        service_connections=args.connections,
        service_seconds=args.interval,
        service_warmup_s=0.0,
        service_path=args.path,
        service_agent="run",
        loadgen=loadgen,
        timeout_s=args.interval + 120,
        gunicorn_extra=extra,
    )
    warmup_s = 60 * (args.warmup if args.warmup is not None else min(5.0, args.minutes / 4))
    machine = machine_info(args.python)
    with tempfile.TemporaryDirectory(prefix="dyper-soak-") as tmpname:
        try:
            result = soak(args, settings, Path(tmpname))
        except RunFailed as exc:
            print(f"soak failed: {exc}", file=sys.stderr)
            return 1
    machine["load_avg_at_end"] = os.getloadavg()
    out: dict[str, Any] = {
        "machine": machine,
        "settings": {
            "minutes": args.minutes,
            "budget": args.budget,
            "interval_s": args.interval,
            "workers": args.workers,
            "connections": args.connections,
            "path": args.path,
            "loadgen": loadgen,
        },
        **result,
    }
    if not result["records"]:
        print("soak: no records", file=sys.stderr)
        return 1
    out["analysis"] = analyse(result, warmup_s, args.flat, budget)
    print_summary(out)
    png = args.plot or (args.json.with_suffix(".png") if args.json else None)
    if png is not None:
        if plot(out, png):
            print(f"plot written to {png}")
        else:
            print("no plot: matplotlib is not installed (pip install matplotlib)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
        print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
