"""Time to the right answer: seconds of a run at 1% before `dyper diagnose` ranks the planted bottleneck first.

Each program of tests/integration/targets/planted_diagnose.py (one planted
bottleneck each) runs under `dyper run --budget 1% --monitor ENDPOINT` for
--duration seconds against a standing monitor; then the diagnosis of the first
T seconds of the run (`--window :+T`, T = 1, 2, ... seconds after the first
report) is made for every T. The time to the answer is the first T from which
the planted bottleneck is ranked first in every later window ("ranked first and
stays first"); "-" when it is not first at the end.

With py-spy installed (`pip install py-spy`), the same programs are recorded
by `py-spy record -f raw` (its default 100 Hz; without --idle, as a user runs
it) for each T of --pyspy-grid, and each collapsed file is diagnosed by
`dyper diagnose FILE` (what a collapsed file allows: where the samples are,
not running or waiting): the same search on what py-spy sees, which shows what
the live search adds (the threads' states, the event loop, the proflets).

    python bench/diagnose_time.py [--duration 20] [--modes spread,helper,...] [--pyspy-grid 1,2,4,8,16]
                                  [--json PATH]

Machine notes: on a shared, busy machine the runs get fewer samples than on
an idle one; the times are what they were on the machine of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TARGET = REPO / "tests" / "integration" / "targets" / "planted_diagnose.py"
MODES = ("spread", "helper", "lock", "loop", "gc", "socket")
#: The GC hypothesis reads the memory proflet's pauses (not a default proflet).
PROFLETS = {"gc": "cpu,tasks,memory"}


def _functions(path: list[str]) -> list[str]:
    return [p.split(" (", 1)[0] for p in path]


#: Per program: is the first bottleneck the planted one? (By place: a collapsed file cannot tell hypotheses.)
PLANTED: dict[str, Callable[[dict[str, Any]], bool]] = {
    "spread": lambda b: _functions(b["path"])[0] == "normalize",
    "helper": lambda b: _functions(b["path"])[-2:] == ["ingest", "crc"],
    "lock": lambda b: _functions(b["path"])[-1] == "update_shared",
    "loop": lambda b: _functions(b["path"])[-1] == "compress_blocking",
    "gc": lambda b: _functions(b["path"])[-1] in ("Node.__init__", "build_graph"),
    "socket": lambda b: _functions(b["path"])[-1] == "fetch",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _first(data: dict[str, Any]) -> dict[str, Any] | None:
    bottlenecks = data.get("bottlenecks") or []
    return bottlenecks[0] if bottlenecks else None


def _stays_first(verdicts: list[tuple[float, bool]]) -> float | None:
    """The first T from which every later verdict is right; None when the last one is wrong."""
    answer = None
    for t, right in verdicts:
        if right and answer is None:
            answer = t
        elif not right:
            answer = None
    return answer


def dyper_times(modes: list[str], duration: int, workdir: Path) -> dict[str, dict[str, Any]]:
    """Run every program against one standing monitor at once, then diagnose windows of 1, 2, ... seconds."""
    from dyper.monitor.commands import window_arg
    from dyper.monitor.commands.bottlenecks import read_source
    from dyper.monitor.search.diagnose import diagnose

    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    log = open(workdir / "monitor.log", "w")  # noqa: SIM115 - the monitor writes to it until it stops
    monitor = subprocess.Popen(
        [sys.executable, "-m", "dyper", "monitor", "--listen", endpoint, "--history", str(workdir / "h.sqlite3")],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    out: dict[str, dict[str, Any]] = {}
    try:
        from dyper.monitor.client import wait_for_monitor

        wait_for_monitor(endpoint, 15)
        runs = {}
        for mode in modes:
            env = dict(os.environ)
            if mode in PROFLETS:
                env["DYPER_PROFLETS"] = PROFLETS[mode]
            argv = [sys.executable, "-m", "dyper", "run", "-q", "--budget", "1%", "--monitor", endpoint]
            argv += ["--duration", str(duration), "--", sys.executable, str(TARGET), mode, str(duration * 4)]
            runs[mode] = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        pids = {}
        for mode, proc in runs.items():
            stdout, stderr = proc.communicate(timeout=duration + 120)
            if proc.returncode != 0:
                raise SystemExit(f"dyper run {mode} failed:\n{stdout.decode()}\n{stderr.decode()}")
            pids[mode] = _pid_of(endpoint, mode)
        for mode, pid in pids.items():
            verdicts: list[tuple[float, bool]] = []
            firsts = []
            for t in range(1, duration + 1):
                source = read_source(str(pid), monitor=endpoint, window=window_arg(f":+{t}"))
                assert source.profile is not None
                first = _first(diagnose(source.profile).to_json())
                right = first is not None and PLANTED[mode](first)
                verdicts.append((float(t), right))
                firsts.append(None if first is None else " > ".join(_functions(first["path"])[-2:]))
            out[mode] = {"seconds": _stays_first(verdicts), "verdicts": verdicts, "first": firsts[-1]}
    finally:
        monitor.terminate()
        monitor.wait(20)
        log.close()
    return out


def _pid_of(endpoint: str, mode: str) -> int:
    """The pid of the session that ran ``mode`` (its argv names it)."""
    from dyper.monitor.client import MonitorClient

    with MonitorClient(endpoint) as client:
        reply: Any = client.call("sessions")
    sessions = reply.get("sessions", []) if isinstance(reply, dict) else reply
    for s in sessions:
        argv = s.get("argv") or []
        if str(TARGET) in argv and mode in argv:
            return int(s["pid"])
    raise SystemExit(f"the monitor has no session of {mode}: {sessions}")


def pyspy_times(modes: list[str], grid: list[int], workdir: Path) -> dict[str, dict[str, Any]] | None:
    """``py-spy record`` for each T of the grid (the programs at once), each file diagnosed as a collapsed file."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(pyspy):
        return None
    verdicts: dict[str, list[tuple[float, bool]]] = {m: [] for m in modes}
    firsts: dict[str, str | None] = {}
    for t in grid:
        procs = {}
        for mode in modes:
            out = workdir / f"{mode}-{t}.txt"
            argv = [pyspy, "record", "-d", str(t), "-f", "raw", "-o", str(out), "--"]
            argv += [sys.executable, str(TARGET), mode, str(t + 5)]
            procs[mode] = (subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out)
        for mode, (proc, out) in procs.items():
            proc.wait(t + 60)
            first = None
            if out.exists() and out.stat().st_size:
                run = subprocess.run(
                    [sys.executable, "-m", "dyper", "diagnose", str(out), "--json"],
                    capture_output=True,
                    text=True,
                    cwd=REPO,
                )
                if run.returncode == 0:
                    first = _first(json.loads(run.stdout))
            verdicts[mode].append((float(t), first is not None and PLANTED[mode](first)))
            firsts[mode] = None if first is None else " > ".join(_functions(first["path"])[-2:])
    return {m: {"seconds": _stays_first(verdicts[m]), "verdicts": verdicts[m], "first": firsts[m]} for m in modes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=20, help="seconds each program runs under dyper")
    parser.add_argument("--modes", default=",".join(MODES), help="which planted programs")
    parser.add_argument("--pyspy-grid", default="1,2,4,8,16", help="py-spy record durations (seconds)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON too")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    grid = [int(x) for x in args.pyspy_grid.split(",") if x]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dyper-diagnose-time-") as tmp:
        dyper = dyper_times(modes, args.duration, Path(tmp))
        pyspy = pyspy_times(modes, grid, Path(tmp))
    print(f"time to the right answer (seconds of the run; python {sys.version.split()[0]}, {os.cpu_count()} cpus)")
    print(f"{'program':<8} {'dyper 1%':>9}  {'first at the end':<32} {'py-spy':>7}  {'first at the end (py-spy)':<32}")
    for mode in modes:
        d = dyper[mode]
        p = pyspy[mode] if pyspy else None

        def fmt(x: float | None) -> str:
            return "-" if x is None else f"{x:g}"

        print(
            f"{mode:<8} {fmt(d['seconds']):>9}  {d['first']!s:<32} "
            f"{fmt(p['seconds']) if p else 'n/a':>7}  {str(p['first']) if p else 'py-spy not installed':<32}"
        )
    print(f"({time.monotonic() - began:.0f} s in all; dyper: windows of 1..{args.duration} s, py-spy: {grid} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"dyper": dyper, "pyspy": pyspy, "duration": args.duration}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
