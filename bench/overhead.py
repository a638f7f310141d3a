"""Overhead of dyper on every workload the spec names, budget by budget, interleaved.

    python bench/overhead.py [--quick] [--repeats 5] [--budgets 0.1%,1%,5%,10%,25%]
                             [--workloads cpu-1,cpu-4,alloc,pyperformance,service] [--json out.json]

Benchmark dependencies (not dyper's own; install them into the same venv):

    .venv-3.11/bin/pip install -r bench/requirements.txt    # pyperformance, pyperf, httpbin, gunicorn
    apt-get install -y wrk                                   # optional: else a Python load generator is used

Workloads (--workloads takes names or the group ``pyperformance``):

  cpu-1       one thread of pure-Python CPU work (bench/workloads/cpu1.py)
  cpu-4       the same work in four threads contending for the GIL (bench/workloads/cpu4.py)
  alloc       many small objects and containers, cyclic garbage, frequent gc (bench/workloads/alloc.py)
  raytrace, richards, deltablue, nbody, json_dumps
              pyperformance benchmarks, each run as ONE pyperf worker process
              (run_benchmark.py --worker --loops L --values N --warmups 1 -o FILE);
              the figure is pyperf's own timing of the measured values
  service     httpbin under gunicorn (sync workers) driven by wrk (or bench/workloads/loadgen.py):
              throughput (req/s) and p99 latency at a fixed number of connections

Each repeat runs, per workload, the no-agent run and one run per budget in a
shuffled order, so that drift in the machine's speed hits every column alike.
Script and pyperformance workloads run through bench/workloads/_timed.py, with
and without the agent, which reports the process's CPU time (all threads, the
agent's included) while the script ran, and separately the CPU of the start-up
before it (interpreter, and the agent's own start-up: about 0.08 s here). With an agent they run under

    python -m dyper run -q --budget B -o prof.json -- python ...

and the profile's "process" object gives the samples and the overhead the agent
reports it spent. For the service the agent goes into gunicorn's master and
its forked workers through ``python -m dyper run --monitor EP --budget B --
python -m gunicorn ...`` against a standing monitor (``python -m dyper
monitor``), because ``run -o`` writes only the profile of the process it
started (gunicorn's master, which does no request work); each worker's samples
and reported overhead are read with ``python -m dyper top PID --json``, and
the harness checks that every worker runs dyper's sampler thread and took
samples. ``--service-agent attach`` instead starts gunicorn bare and attaches
to each worker with ``python -m dyper attach PID -o ...``.

Figures per workload and budget are medians over the repeats: the workload's
own timing (or req/s and p99), the target's CPU time, samples, samples/s, what
the agent reports it spent, and the actual overhead = slowdown against no
agent. On a shared VM wall time also carries noise from other tenants that adds
to a run and never subtracts from it, so the slowdown of the fastest runs (min
against min) is shown beside the median, and the spread of the no-agent runs
is printed as the noise. A run that fails is reported with its command and the
tail of its stderr, and the benchmark goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKLOADS_DIR = HERE / "workloads"
TIMED = WORKLOADS_DIR / "_timed.py"
LOADGEN = WORKLOADS_DIR / "loadgen.py"
MARKER = "@@dyper-bench "
SAMPLER_THREAD = "dyper-sampler"  # the OS-level name of the agent's sampler thread (agent.core.THREAD_NAME)

DEFAULT_BUDGETS = "0.1%,1%,5%,10%,25%"
QUICK_BUDGETS = "1%,25%"

# pyperformance benchmarks: loops per value, for values of about 0.5 s on a 2 GHz Xeon VM with CPython 3.11
PYPERF_LOOPS = {"raytrace": 1, "richards": 4, "deltablue": 60, "nbody": 3, "json_dumps": 20}
SCRIPT_WORKLOADS = {"cpu-1": "cpu1.py", "cpu-4": "cpu4.py", "alloc": "alloc.py"}
ALL_WORKLOADS = [*SCRIPT_WORKLOADS, *PYPERF_LOOPS, "service"]


@dataclass
class Settings:
    python: str
    repeats: int
    budgets: list[str]
    workloads: list[str]
    units: dict[str, int]
    pyperf_values: int
    pyperf_warmups: int
    service_workers: int
    service_connections: int
    service_seconds: float
    service_warmup_s: float
    service_path: str
    service_agent: str
    loadgen: str
    timeout_s: float
    gunicorn_extra: list[str] = field(default_factory=list)


class RunFailed(Exception):
    def __init__(self, message: str, cmd: list[str] | None = None, stderr: str = "") -> None:
        super().__init__(message)
        self.cmd = cmd
        self.stderr = stderr


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(budget: str) -> float:
    """'0.1%' -> 0.001."""
    b = budget.strip()
    return float(b[:-1]) / 100 if b.endswith("%") else float(b)


def tail(text: str | bytes | None, n: int = 1500) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-n:]


def file_tail(path: Path, n: int = 1500) -> str:
    try:
        return tail(path.read_bytes(), n)
    except OSError:
        return ""


def monitor_cmd(settings: Settings, *args: str) -> list[str]:
    return [settings.python, "-m", "dyper", *args]


# ---------------------------------------------------------------------------------------------------------------
# script and pyperformance workloads


def pyperf_dir(python: str) -> Path | None:
    out = subprocess.run(
        [python, "-c", "import os, pyperformance; print(os.path.dirname(pyperformance.__file__))"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        return None
    path = Path(out.stdout.strip()) / "data-files" / "benchmarks"
    return path if path.is_dir() else None


def target_command(settings: Settings, workload: str, tmp: Path, bench_dir: Path | None) -> list[str]:
    if workload in SCRIPT_WORKLOADS:
        script = WORKLOADS_DIR / SCRIPT_WORKLOADS[workload]
        return [settings.python, str(TIMED), str(script), str(settings.units[workload])]
    if bench_dir is None:
        raise RunFailed("pyperformance is not installed for this Python (pip install -r bench/requirements.txt)")
    script = bench_dir / f"bm_{workload}" / "run_benchmark.py"
    if not script.exists():
        raise RunFailed(f"no pyperformance benchmark {workload} ({script})")
    return [
        settings.python,
        str(TIMED),
        str(script),
        "--worker",
        "--loops",
        str(PYPERF_LOOPS.get(workload, 1)),
        "--values",
        str(settings.pyperf_values),
        "--warmups",
        str(settings.pyperf_warmups),
        "--output",
        str(tmp / "pyperf.json"),
    ]


def parse_marker(stdout: str) -> dict[str, Any]:
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            return dict(json.loads(line[len(MARKER) :]))
    raise RunFailed("the workload printed no @@dyper-bench line")


def first_number(text: str) -> float:
    for line in text.splitlines():
        token = line.split()[0] if line.split() else ""
        try:
            return float(token)
        except ValueError:
            continue
    raise RunFailed(f"no timing in the workload's output: {text[-300:]!r}")


def pyperf_work(path: Path) -> tuple[float, int]:
    """Seconds pyperf measured over all values (warmups excluded) and the number of values."""
    data = json.loads(path.read_text())
    meta = data.get("metadata", {})
    total, count = 0.0, 0
    for bench in data.get("benchmarks", []):
        bmeta = {**meta, **bench.get("metadata", {})}
        for run in bench.get("runs", []):
            rmeta = {**bmeta, **run.get("metadata", {})}
            loops = int(rmeta.get("loops", 1)) * int(rmeta.get("inner_loops", 1))
            values = run.get("values", [])
            total += sum(values) * loops
            count += len(values)
    if count == 0:
        raise RunFailed(f"pyperf wrote no values to {path}")
    return total, count


def run_script(settings: Settings, workload: str, budget: str | None, bench_dir: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dyper-bench-") as tmpname:
        tmp = Path(tmpname)
        target = target_command(settings, workload, tmp, bench_dir)
        prof = tmp / "prof.json"
        cmd = (
            target
            if budget is None
            else monitor_cmd(settings, "run", "-q", "--budget", budget, "-o", str(prof), "--", *target)
        )
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=settings.timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise RunFailed(f"timed out after {settings.timeout_s:.0f} s", cmd, tail(exc.stderr)) from None
        if out.returncode != 0:
            raise RunFailed(f"exit code {out.returncode}", cmd, tail(out.stderr) or tail(out.stdout))
        try:
            report = parse_marker(out.stdout)
            if report.get("exit_code"):
                raise RunFailed(f"the workload exited with {report['exit_code']}")
            result: dict[str, Any] = {
                "cpu_s": report["cpu_s"],  # while the script ran: the agent's start-up is in startup_cpu_s
                "cpu_total_s": report.get("cpu_total_s"),
                "startup_cpu_s": report.get("startup_cpu_s"),
                "process_wall_s": report["wall_s"],
            }
            result["gc_collections"] = report.get("gc_collections")
            if workload in SCRIPT_WORKLOADS:
                result["work_s"] = first_number(report["stdout"])
            else:
                result["work_s"], result["values"] = pyperf_work(tmp / "pyperf.json")
            if budget is not None:
                process = json.loads(prof.read_text())["process"]
                result.update(agent_figures(process))
        except (RunFailed, OSError, ValueError, KeyError) as exc:
            raise RunFailed(f"{type(exc).__name__}: {exc}", cmd, tail(out.stderr) or tail(out.stdout)) from None
        return result


def agent_figures(process: dict[str, Any]) -> dict[str, Any]:
    """The figures we use from a profile's "process" object (or a session view); new keys are ignored."""
    samples = int(process.get("samples") or 0)
    duration = float(process.get("duration_s") or 0.0)
    return {
        "samples": samples,
        "reported": float(process.get("overhead") or 0.0),
        "duration_s": duration,
        "samples_per_s": samples / duration if duration > 0 else 0.0,
        "budget_seen": process.get("budget"),
    }


# ---------------------------------------------------------------------------------------------------------------
# the service: httpbin under gunicorn, driven by wrk


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise RunFailed(f"nothing listens on port {port} after {timeout_s:.0f} s")


def wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise RunFailed(f"{url} not answering after {timeout_s:.0f} s ({last})")


def children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) == pid:
            kids.append(int(entry))
    return sorted(kids)


def cpu_seconds(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def has_sampler(pid: int) -> bool:
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() == SAMPLER_THREAD:
                    return True
    except OSError:
        pass
    return False


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_wrk(out: str) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("50%", "75%", "90%", "99%"):
            res[f"p{parts[0][:-1]}_ms"] = _ms(parts[1])
        elif line.startswith("Requests/sec:"):
            res["rps"] = float(parts[1])
        elif "requests in" in line:
            res["requests"] = int(parts[0])
            res["seconds"] = _ms(parts[3].rstrip(",")) / 1e3
        elif line.strip().startswith("Non-2xx"):
            res["non2xx"] = int(parts[-1])
        elif line.strip().startswith("Socket errors"):
            res["socket_errors"] = sum(int(x) for x in re.findall(r"\d+", line))
    if "rps" not in res or "p99_ms" not in res:
        raise RunFailed(f"cannot read wrk's output: {out[-500:]!r}")
    res["errors"] = res.get("non2xx", 0) + res.get("socket_errors", 0)
    return res


def load(settings: Settings, url: str, seconds: float) -> dict[str, Any]:
    if settings.loadgen == "wrk":
        cmd = ["wrk", "-t1", f"-c{settings.service_connections}", f"-d{seconds:g}s", "--latency", url]
    else:
        cmd = [
            settings.python,
            str(LOADGEN),
            url,
            "--connections",
            str(settings.service_connections),
            "--duration",
            str(seconds),
        ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    if out.returncode != 0:
        raise RunFailed(f"load generator exit code {out.returncode}", cmd, tail(out.stderr))
    if settings.loadgen == "wrk":
        return parse_wrk(out.stdout)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def stop_process(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, wait_s: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(5)


def view_figures(settings: Settings, endpoint: str, pid: int) -> dict[str, Any]:
    cmd = monitor_cmd(settings, "top", str(pid), "--monitor", endpoint, "--json")
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60)
    if out.returncode != 0:
        raise RunFailed(f"dyper top exit code {out.returncode}", cmd, tail(out.stderr) or tail(out.stdout))
    view = json.loads(out.stdout)
    session = view.get("session", {})
    samples = int(session.get("samples") or 0)
    # the view's samples_per_s is a recent rate, 0 until two reports came in: use the whole session's
    span = float(session.get("last_report") or 0.0) - float(session.get("start_time") or 0.0)
    return {
        "samples": samples,
        "reported": float(session.get("overhead") or 0.0),
        "samples_per_s": samples / span if span > 0 else float(view.get("samples_per_s") or 0.0),
        "budget_seen": session.get("budget"),
    }


def gunicorn_command(settings: Settings, port: int, pidfile: Path, errlog: Path) -> list[str]:
    return [
        settings.python,
        "-m",
        "gunicorn",
        "-w",
        str(settings.service_workers),
        "-k",
        "sync",
        "-b",
        f"127.0.0.1:{port}",
        "--pid",
        str(pidfile),
        "--error-logfile",
        str(errlog),
        *settings.gunicorn_extra,
        "httpbin:app",
    ]


def run_service(settings: Settings, budget: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dyper-bench-") as tmpname:
        tmp = Path(tmpname)
        port = free_port()
        pidfile, errlog = tmp / "gunicorn.pid", tmp / "gunicorn.log"
        gcmd = gunicorn_command(settings, port, pidfile, errlog)
        runner: subprocess.Popen[bytes] | None = None
        monitor: subprocess.Popen[bytes] | None = None
        attachers: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}
        outputs: list[Path] = []
        endpoint = ""
        cmd = gcmd
        master = 0

        def spawn(args: list[str], name: str) -> subprocess.Popen[bytes]:
            path = tmp / f"{name}.out"
            outputs.append(path)
            with open(path, "wb") as f:
                return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)

        def stderr_tails() -> str:
            parts = [f"--- {p.name}\n{file_tail(p, 800)}" for p in [*outputs, errlog] if file_tail(p, 800).strip()]
            return "\n".join(parts)

        try:
            if budget is not None and settings.service_agent == "run":
                endpoint = f"tcp://127.0.0.1:{free_port()}"
                monitor = spawn(monitor_cmd(settings, "monitor", "--listen", endpoint), "monitor")
                wait_port(int(endpoint.rsplit(":", 1)[1]), 30)
                cmd = monitor_cmd(settings, "run", "--monitor", endpoint, "--budget", budget, "--", *gcmd)
            runner = spawn(cmd, "gunicorn")
            url = f"http://127.0.0.1:{port}{settings.service_path}"
            deadline = time.monotonic() + 60
            while not pidfile.exists() or not pidfile.read_text().strip():
                if runner.poll() is not None or time.monotonic() > deadline:
                    raise RunFailed("gunicorn did not start")
                time.sleep(0.1)
            master = int(pidfile.read_text().strip())
            wait_http(url, 60)
            workers: list[int] = []
            while time.monotonic() < deadline:
                workers = children(master)
                if len(workers) >= settings.service_workers:
                    break
                time.sleep(0.1)
            if len(workers) < settings.service_workers:
                raise RunFailed(f"gunicorn has {len(workers)} workers, not {settings.service_workers}")
            if budget is not None and settings.service_agent == "attach":
                span = settings.service_warmup_s + settings.service_seconds + 15
                for w in workers:
                    prof = tmp / f"worker-{w}.json"
                    args = ["attach", str(w), "--budget", budget, "--duration", f"{span:g}", "-q", "-o", str(prof)]
                    attachers[w] = (spawn(monitor_cmd(settings, *args), f"attach-{w}"), prof)
            if budget is not None:
                deadline = time.monotonic() + 30
                while not all(has_sampler(w) for w in workers) and time.monotonic() < deadline:
                    time.sleep(0.1)
            samplers = {w: has_sampler(w) for w in workers}
            if settings.service_warmup_s > 0:
                load(settings, url, settings.service_warmup_s)
            pids = [master, *workers]
            # the monitor's side: the standing monitor, or the attach commands that host one each
            hosts = [p.pid for p in ([monitor] if monitor else []) + [a for a, _ in attachers.values()]]
            cpu0 = [cpu_seconds(p) for p in pids]
            host0 = [cpu_seconds(p) for p in hosts]
            result = load(settings, url, settings.service_seconds)
            cpu1 = [cpu_seconds(p) for p in pids]
            host1 = [cpu_seconds(p) for p in hosts]
            result["monitor_cpu_s"] = sum(b - a for a, b in zip(host0, host1, strict=True))
            worker_cpu = sum(b - a for a, b in zip(cpu0[1:], cpu1[1:], strict=True))
            result["cpu_s"] = worker_cpu + (cpu1[0] - cpu0[0])
            result["master_cpu_s"] = cpu1[0] - cpu0[0]
            result["cpu_ms_per_req"] = 1e3 * result["cpu_s"] / max(1, result["requests"])
            result["workers"] = {}
            if budget is not None:
                per: dict[int, dict[str, Any]] = {}
                if settings.service_agent == "run":
                    for p in pids:
                        per[p] = view_figures(settings, endpoint, p)
                else:
                    for w, (proc, prof) in attachers.items():
                        try:
                            proc.wait(settings.service_warmup_s + settings.service_seconds + 60)
                        except subprocess.TimeoutExpired:
                            raise RunFailed(f"dyper attach {w} did not finish", proc.args) from None  # type: ignore[arg-type]
                        if not prof.exists():
                            raise RunFailed(f"dyper attach {w} wrote no profile", proc.args)  # type: ignore[arg-type]
                        per[w] = agent_figures(json.loads(prof.read_text())["process"])
                for w in workers:
                    per[w]["sampler_thread"] = samplers[w]
                result["workers"] = {str(w): per[w] for w in workers}
                if master in per:
                    result["master"] = per[master]
                ws = [per[w] for w in workers]
                result["samples"] = sum(x["samples"] for x in ws)
                result["samples_per_s"] = sum(x["samples_per_s"] for x in ws)
                result["reported"] = statistics.fmean(x["reported"] for x in ws)
                result["budget_seen"] = ws[0].get("budget_seen")
                unprofiled = [w for w in workers if not samplers[w] or per[w]["samples"] == 0]
                if unprofiled:
                    result["warning"] = f"workers without samples or sampler thread: {unprofiled}"
            return result
        except RunFailed as exc:
            raise RunFailed(str(exc), exc.cmd or cmd, exc.stderr or stderr_tails()) from None
        except (OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
            raise RunFailed(f"{type(exc).__name__}: {exc}", cmd, stderr_tails()) from None
        finally:
            # gunicorn's master first (its workers follow; `dyper run --monitor` returns when it exits),
            # then any attach still running, then the standing monitor
            if master:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(master, signal.SIGTERM)
            if runner is not None:
                try:
                    runner.wait(30)
                except subprocess.TimeoutExpired:
                    stop_process(runner)
            for proc, _ in attachers.values():
                stop_process(proc, signal.SIGINT, 15)
            stop_process(monitor)
            if master:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(master, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------------------------
# figures


def median(xs: Iterable[float]) -> float:
    v = [x for x in xs if x == x]  # not NaN
    return statistics.median(v) if v else float("nan")


def spread(xs: list[float]) -> dict[str, float]:
    xs = [x for x in xs if x == x]
    if len(xs) < 2:
        return {"range_pct": float("nan"), "iqr_pct": float("nan")}
    m = statistics.median(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return {"range_pct": 100 * (max(xs) - min(xs)) / m, "iqr_pct": 100 * (q[2] - q[0]) / m}


def summarise(workload: str, runs: dict[str, list[dict[str, Any]]], budgets: list[str | None]) -> dict[str, Any]:
    service = workload == "service"
    ok = {str(b): [r for r in runs[str(b)] if r.get("ok")] for b in budgets}
    base = ok["None"]
    rows = []
    # "time" is what we compare: the workload's own seconds, or seconds per request for the service
    key = "rps" if service else "work_s"

    def time_of(r: dict[str, Any]) -> float:
        return 1.0 / r["rps"] if service else float(r["work_s"])

    base_t = median(time_of(r) for r in base) if base else float("nan")
    base_min = min((time_of(r) for r in base), default=float("nan"))
    cpu_key = "cpu_ms_per_req" if service else "cpu_s"
    base_cpu = median(r.get(cpu_key, float("nan")) for r in base) if base else float("nan")
    base_p99 = median(r["p99_ms"] for r in base) if service and base else float("nan")
    for b in budgets:
        xs = ok[str(b)]
        row: dict[str, Any] = {"budget": b or "none", "n": len(xs), "failed": len(runs[str(b)]) - len(xs)}
        if xs:
            t = median(time_of(r) for r in xs)
            row[key] = median(r[key] for r in xs)
            row[cpu_key] = median(r.get(cpu_key, float("nan")) for r in xs)
            row["actual_overhead_pct"] = 100 * (t / base_t - 1)
            row["min_overhead_pct"] = 100 * (min(time_of(r) for r in xs) / base_min - 1)
            row["cpu_overhead_pct"] = 100 * (row[cpu_key] / base_cpu - 1)
            if not service:
                row["startup_cpu_s"] = median(r.get("startup_cpu_s") or float("nan") for r in xs)
            if service:
                row["p99_ms"] = median(r["p99_ms"] for r in xs)
                row["p99_change_pct"] = 100 * (row["p99_ms"] / base_p99 - 1)
            if b is not None:
                row["samples"] = median(r.get("samples", 0) for r in xs)
                row["samples_per_s"] = median(r.get("samples_per_s", 0.0) for r in xs)
                row["reported_overhead_pct"] = 100 * median(r.get("reported", float("nan")) for r in xs)
                row["over_budget"] = row["actual_overhead_pct"] > 100 * pct(b)
        rows.append(row)
    noise = spread([time_of(r) for r in base])
    cpu_noise = spread([float(r.get(cpu_key, float("nan"))) for r in base])
    return {"rows": rows, "noise": noise, "cpu_noise": cpu_noise}


def machine_info(python: str) -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    target_py = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
    ).stdout.strip()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": target_py,
        "python_executable": python,
        "platform": platform.platform(),
        "load_avg_at_start": os.getloadavg(),
        "dyper_commit": commit.stdout.strip(),
        # the agents' proflets (inherited by every run): unset means the agent's default
        "dyper_proflets": os.environ.get("DYPER_PROFLETS", "(default)"),
    }


def fmt(x: Any, spec: str, width: int) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return f"{'-':>{width}}"
    return f"{x:>{width}{spec}}"


def print_report(result: dict[str, Any], budgets: list[str | None], workloads: list[str]) -> None:
    m = result["machine"]
    s = result["settings"]
    print()
    print(
        f"dyper overhead: medians of {s['repeats']} interleaved runs per cell. Machine: {m['cpu_model']}, "
        f"{m['cores']} cores, CPython {m['python']}, {m['platform']}, dyper {m['dyper_commit']}, "
        f"proflets {m.get('dyper_proflets', '(default)')}"
    )
    print()
    print("actual overhead (slowdown against no agent), %: median (min vs min); * = median above the budget target")
    width = max(17, *(len(w) + 2 for w in workloads))

    def grid(cell: Callable[[dict[str, Any] | None], str], noise: str) -> None:
        """A line per budget and a column per workload, then each workload's no-agent ``noise``."""
        print(f"{'target':>8}" + "".join(f"{w:>{width}}" for w in workloads))
        for b in budgets:
            if b is not None:
                rows = (next((r for r in result["workloads"][w]["rows"] if r["budget"] == b), None) for w in workloads)
                print(f"{b:>8}" + "".join(cell(row) for row in rows))
        spread = [result["workloads"][w][noise] for w in workloads]
        print(f"{'noise':>8}" + "".join(f"{'±' + format(n['range_pct'] / 2, '.1f'):>{width}}" for n in spread))

    def actual(row: dict[str, Any] | None) -> str:
        if row is None or "actual_overhead_pct" not in row:
            return f"{'failed':>{width}}"
        star = "*" if row.get("over_budget") else " "
        cell = f"{row['actual_overhead_pct']:.1f} ({row['min_overhead_pct']:.1f}){star}"
        return f"{cell:>{width}}"

    grid(actual, "noise")
    print("noise: half the (max-min)/median spread of the no-agent runs. service: time per request, from req/s")
    print()
    print("CPU time of the target against no agent, % (median); service: CPU per request of gunicorn's processes")
    grid(lambda row: fmt(None if row is None else row.get("cpu_overhead_pct"), ".1f", width), "cpu_noise")
    for w in workloads:
        info = result["workloads"][w]
        n = info["noise"]
        print()
        extra = ""
        if w == "service":
            extra = (
                f", {s['service_workers']} sync worker(s), {s['service_connections']} connections, "
                f"{s['service_seconds']:g} s of load by {s['loadgen']}, agent by '{s['service_agent']}'"
            )
        print(f"{w}: no-agent spread (max-min)/median {n['range_pct']:.1f}%, IQR/median {n['iqr_pct']:.1f}%{extra}")
        if w == "service":
            head = ["budget", "n", "req/s", "p99 ms", "p99 +%", "cpu ms/req", "cpu +%"]
        else:
            head = ["budget", "n", "work s", "start cpu", "cpu s", "cpu +%"]
        head += ["samples", "samples/s", "reported %", "actual %", "min-min %"]
        widths = [8, 3] + [11] * (len(head) - 2)
        print("".join(f"{h:>{wd}}" for h, wd in zip(head, widths, strict=True)))
        for row in info["rows"]:
            cells = [f"{row['budget']:>8}", f"{row['n']:>3}"]
            if w == "service":
                cells += [
                    fmt(row.get("rps"), ".0f", 11),
                    fmt(row.get("p99_ms"), ".1f", 11),
                    fmt(row.get("p99_change_pct"), ".1f", 11),
                    fmt(row.get("cpu_ms_per_req"), ".3f", 11),
                ]
            else:
                cells += [
                    fmt(row.get("work_s"), ".3f", 11),
                    fmt(row.get("startup_cpu_s"), ".3f", 11),
                    fmt(row.get("cpu_s"), ".3f", 11),
                ]
            cells += [
                fmt(row.get("cpu_overhead_pct"), ".1f", 11),
                fmt(row.get("samples"), ".0f", 11),
                fmt(row.get("samples_per_s"), ".0f", 11),
                fmt(row.get("reported_overhead_pct"), ".2f", 11),
                fmt(row.get("actual_overhead_pct"), ".1f", 11),
                fmt(row.get("min_overhead_pct"), ".1f", 11),
            ]
            print("".join(cells) + (f"  ({row['failed']} failed)" if row["failed"] else ""))
    warnings = result.get("warnings", [])
    if warnings:
        print()
        for warning in warnings:
            print(f"warning: {warning}")
    if result["failures"]:
        print()
        print(f"{len(result['failures'])} run(s) failed:")
        for f in result["failures"]:
            print(f"  {f['workload']} budget {f['budget']} repeat {f['repeat']}: {f['error']}")
            if f.get("cmd"):
                print(f"    command: {' '.join(f['cmd'])}")
            for line in (f.get("stderr_tail") or "").strip().splitlines()[-8:]:
                print(f"    | {line}")


# ---------------------------------------------------------------------------------------------------------------


def parse_workloads(text: str) -> list[str]:
    names: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if name == "all":
            names += ALL_WORKLOADS
        elif name == "pyperformance":
            names += list(PYPERF_LOOPS)
        else:
            names.append(name.removeprefix("pyperformance:"))
    return list(dict.fromkeys(names))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 repeats, short workloads, budgets none,1%%,25%%")
    ap.add_argument("--repeats", type=int, help="runs per cell (default 5, --quick 3)")
    ap.add_argument(
        "--budgets", help=f"comma-separated (default {DEFAULT_BUDGETS}; --quick {QUICK_BUDGETS})".replace("%", "%%")
    )
    ap.add_argument(
        "--workloads",
        default="all",
        help="comma-separated: " + ", ".join(ALL_WORKLOADS) + ", pyperformance (the five), any other"
        " pyperformance benchmark by name, or all (default)",
    )
    ap.add_argument("--units", type=int, help="size of cpu-1/cpu-4 (default 1500, about 3 s; --quick 400)")
    ap.add_argument("--alloc-units", type=int, help="size of alloc (default 2500, about 3 s; --quick 700)")
    ap.add_argument("--pyperf-values", type=int, help="pyperf values per run (default 6, --quick 2)")
    ap.add_argument("--pyperf-warmups", type=int, default=1)
    ap.add_argument("--service-workers", type=int, default=1, help="gunicorn sync workers (default 1)")
    ap.add_argument("--service-connections", type=int, default=4)
    ap.add_argument("--service-seconds", type=float, help="seconds of measured load (default 20, --quick 6)")
    ap.add_argument("--service-warmup", type=float, help="seconds of load before measuring (default 3, --quick 2)")
    ap.add_argument("--service-path", default="/get")
    ap.add_argument(
        "--service-agent",
        choices=("run", "attach"),
        default="run",
        help="run: dyper run --monitor around gunicorn (agent in master and workers); attach: dyper attach each worker",
    )
    ap.add_argument("--loadgen", choices=("auto", "wrk", "python"), default="auto")
    ap.add_argument("--python", default=sys.executable, help="the Python that runs the workloads (default: this one)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before a run is given up")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE", help="write every run and figure here")
    args = ap.parse_args(argv)

    quick = args.quick
    budget_list = [b.strip() for b in (args.budgets or (QUICK_BUDGETS if quick else DEFAULT_BUDGETS)).split(",")]
    budget_list = [b for b in budget_list if b and b.lower() not in ("none", "0", "0%")]
    for b in budget_list:
        try:
            pct(b)
        except ValueError:
            ap.error(f"bad budget {b!r}: give e.g. 0.1%,1%,5%")
    workloads = parse_workloads(args.workloads)
    loadgen = args.loadgen
    if loadgen == "auto":
        loadgen = "wrk" if shutil.which("wrk") else "python"
    units = args.units or (400 if quick else 1500)
    settings = Settings(
        python=args.python,
        repeats=args.repeats or (3 if quick else 5),
        budgets=budget_list,
        workloads=workloads,
        units={"cpu-1": units, "cpu-4": units, "alloc": args.alloc_units or (700 if quick else 2500)},
        pyperf_values=args.pyperf_values or (2 if quick else 6),
        pyperf_warmups=args.pyperf_warmups,
        service_workers=args.service_workers,
        service_connections=args.service_connections,
        service_seconds=args.service_seconds or (6.0 if quick else 20.0),
        service_warmup_s=args.service_warmup if args.service_warmup is not None else (2.0 if quick else 3.0),
        service_path=args.service_path,
        service_agent=args.service_agent,
        loadgen=loadgen,
        timeout_s=args.timeout,
    )
    bench_dir = (
        pyperf_dir(settings.python) if any(w not in SCRIPT_WORKLOADS and w != "service" for w in workloads) else None
    )
    if "service" in workloads:
        helptext = subprocess.run([settings.python, "-m", "gunicorn", "--help"], capture_output=True, text=True).stdout
        if "--no-control-socket" in helptext:  # gunicorn >= 24: no control socket shared between runs
            settings.gunicorn_extra.append("--no-control-socket")

    budgets: list[str | None] = [None, *budget_list]
    machine = machine_info(settings.python)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {w: {str(b): [] for b in budgets} for w in workloads}
    failures: list[dict[str, Any]] = []
    warnings: list[str] = []
    rng = random.Random(args.seed)
    total = settings.repeats * len(workloads) * len(budgets)
    done = 0
    started = time.monotonic()
    log(
        f"{total} runs: {settings.repeats} repeats x {len(workloads)} workloads x {len(budgets)} configurations "
        f"(none, {', '.join(budget_list)}); load generator: {loadgen}"
    )
    for rep in range(settings.repeats):
        for w in workloads:
            order = budgets[:]
            rng.shuffle(order)
            for b in order:
                done += 1
                label = f"[{done}/{total}] repeat {rep + 1}/{settings.repeats} {w} {b or 'none'}"
                t0 = time.monotonic()
                record: dict[str, Any] = {"repeat": rep + 1, "budget": b or "none", "load_avg": os.getloadavg()[0]}
                try:
                    if w == "service":
                        record.update(run_service(settings, b))
                    else:
                        record.update(run_script(settings, w, b, bench_dir))
                    record["ok"] = True
                except RunFailed as exc:
                    record.update(ok=False, error=str(exc), cmd=exc.cmd, stderr_tail=exc.stderr)
                    failures.append({"workload": w, **record})
                except Exception as exc:  # the benchmark goes on
                    record.update(ok=False, error=f"{type(exc).__name__}: {exc}", cmd=None, stderr_tail="")
                    failures.append({"workload": w, **record})
                record["elapsed_s"] = time.monotonic() - t0
                runs[w][str(b)].append(record)
                if record["ok"]:
                    if w == "service":
                        what = f"{record['rps']:.0f} req/s, p99 {record['p99_ms']:.1f} ms"
                    else:
                        what = f"{record['work_s']:.3f} s work, {record['cpu_s']:.2f} s cpu"
                    if b is not None:
                        what += f", {record.get('samples', 0)} samples, reported {100 * record.get('reported', 0):.2f}%"
                    if record.get("warning"):
                        what += f"  WARNING {record['warning']}"
                        warnings.append(f"{w} {b} repeat {rep + 1}: {record['warning']}")
                    seen = record.get("budget_seen")
                    if b is not None and seen is not None and abs(float(seen) - pct(b)) > 1e-9:
                        warnings.append(f"{w} {b} repeat {rep + 1}: the agent ran with budget {seen}")
                else:
                    what = f"FAILED: {record['error']}"
                    if record.get("cmd"):
                        what += f"\n    command: {' '.join(record['cmd'])}"
                    for line in (record.get("stderr_tail") or "").strip().splitlines()[-6:]:
                        what += f"\n    | {line}"
                elapsed = time.monotonic() - started
                eta = elapsed / done * (total - done)
                log(f"{label}: {what}  ({record['elapsed_s']:.1f} s; about {eta / 60:.0f} min left)")
    result: dict[str, Any] = {
        "machine": machine,
        "settings": {
            "repeats": settings.repeats,
            "budgets": budget_list,
            "workloads": workloads,
            "units": settings.units,
            "pyperf_values": settings.pyperf_values,
            "pyperf_warmups": settings.pyperf_warmups,
            "pyperf_loops": {w: PYPERF_LOOPS.get(w, 1) for w in workloads if w in PYPERF_LOOPS},
            "service_workers": settings.service_workers,
            "service_connections": settings.service_connections,
            "service_seconds": settings.service_seconds,
            "service_warmup_s": settings.service_warmup_s,
            "service_path": settings.service_path,
            "service_agent": settings.service_agent,
            "loadgen": loadgen,
            "quick": quick,
            "seed": args.seed,
        },
        "workloads": {w: {**summarise(w, runs[w], budgets), "runs": runs[w]} for w in workloads},
        "failures": failures,
        "warnings": warnings,
        "elapsed_s": time.monotonic() - started,
    }
    print_report(result, budgets, workloads)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
        print(f"\nwritten to {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
