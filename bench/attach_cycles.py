"""Attach/detach cycles on one running process: time per cycle and what grows.

A real ``dyper attach`` is the CLI starting up, preflight, then the injector
(ptrace, and a pending call that runs the bootstrap at a safe point) starting
the agent; ``dyper detach`` stops it the same way, or through the monitor.
This runs the injector part, :func:`monitor.attach.attach` and
:func:`monitor.attach.detach`, ``--cycles`` times (200) on one target
(``tests/integration/targets/cycles.py``, a process that keeps working and
answers probes), with a standing ``dyper monitor`` that must see each agent
before it is detached. ``--cli N`` adds N cycles through the real CLI
(``dyper attach PID --monitor``, ``dyper detach PID --monitor``) to time
them; their cost is mostly two interpreter start-ups.

Checked, as tests/integration/test_cycles.py checks them: threads and
descriptors from outside (equal to before), and from inside every hook dyper
could leave (sys.monitoring tool ids, gc callbacks, tracemalloc, profile and
trace functions of sys and threading, signal handlers, sys.path, the
agent's atexit registrations); sys.modules, live blocks and RSS as growth
after the first --warmup cycles. CPython's atexit slot count is shown too:
it never shrinks (each unregister leaves a slot), so it grows by one per start.

    python bench/attach_cycles.py [--cycles 200] [--warmup 20] [--budget 5%] [--proflets all] [--cli 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from dyper.agent.protocol import parse_budget
from dyper.monitor.attach import attach, detach
from dyper.monitor.client import MonitorClient, wait_for_monitor

REPO = Path(__file__).resolve().parents[1]
TARGET = REPO / "tests" / "integration" / "targets" / "cycles.py"
#: what must be as before (see cycles.py's probe)
SAME = (
    "threads",
    "monitoring",
    "gc_callbacks",
    "tracemalloc",
    "profile",
    "trace",
    "threading_profile",
    "threading_trace",
    "signals",
    "sys_path",
    "atexit",
    "agent_running",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Target:
    """cycles.py, answering one JSON line per command."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(TARGET)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit("the target did not start")
        self.pid = self.proc.pid

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def start_monitor(endpoint: str, history: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dyper", "monitor", "--listen", endpoint, "--history", str(history)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    wait_for_monitor(endpoint, 30)
    return proc


def connected(client: MonitorClient, pid: int) -> bool:
    return any(s["pid"] == pid and s["connected"] for s in client.call("sessions"))


def wait(predicate: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.005)


def outside(pid: int) -> dict[str, int]:
    p = psutil.Process(pid)
    return {"threads": p.num_threads(), "fds": p.num_fds(), "rss": p.memory_info().rss}


def cli_cycles(n: int, pid: int, endpoint: str, budget: str) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        attach_args = ("attach", str(pid), "--monitor", endpoint, "--budget", budget)
        for args in (attach_args, ("detach", str(pid), "--monitor", endpoint)):
            done = subprocess.run([sys.executable, "-m", "dyper", *args], capture_output=True, text=True, cwd=REPO)
            if done.returncode != 0:
                raise SystemExit(f"dyper {' '.join(args)} failed: {done.stderr.strip()}")
        times.append(time.monotonic() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=200, help="injector attach/detach cycles (default 200)")
    ap.add_argument("--warmup", type=int, default=20, help="cycles before growth is measured (default 20)")
    ap.add_argument("--budget", default="5%", help="the agent's budget (default 5%%)")
    ap.add_argument("--proflets", default="all", help="proflets to run (default all)")
    ap.add_argument("--cli", type=int, default=0, help="also time this many cycles through the real CLI")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    budget = parse_budget(args.budget)
    proflets = tuple(p for p in args.proflets.split(",") if p)
    workdir = Path(tempfile.mkdtemp(prefix="dyper-bench-cycles-"))
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    monitor = start_monitor(endpoint, workdir / "history.sqlite3")
    target = Target()
    started = time.monotonic()
    try:
        before, before_out = target.ask("probe"), outside(target.pid)
        warm: dict[str, Any] = {}
        warm_out: dict[str, int] = {}
        attach_s, detach_s = [], []
        with MonitorClient(endpoint, timeout=5) as client:
            for cycle in range(args.cycles):
                t0 = time.monotonic()
                attach(target.pid, endpoint, budget, proflets=proflets)
                t1 = time.monotonic()
                wait(lambda: connected(client, target.pid), "the monitor to see the agent")
                t2 = time.monotonic()
                if not detach(target.pid):
                    raise SystemExit(f"cycle {cycle}: no agent was running to detach")
                if not target.ask("stopped")["stopped"]:
                    raise SystemExit(f"cycle {cycle}: the agent did not stop")
                detach_s.append(time.monotonic() - t2)
                attach_s.append(t1 - t0)
                # The next attach only once the monitor has the bye (else it may see the old agent).
                wait(lambda: not connected(client, target.pid), "the bye")
                if cycle == args.warmup - 1:
                    warm, warm_out = target.ask("probe"), outside(target.pid)
        cycles_s = time.monotonic() - started
        after, after_out = target.ask("probe"), outside(target.pid)
        cli = cli_cycles(args.cli, target.pid, endpoint, args.budget) if args.cli else []
    finally:
        target.close()
        monitor.kill()
        monitor.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)

    changed = {k: [before[k], after[k]] for k in SAME if before[k] != after[k]}
    for k in ("threads", "fds"):
        if after_out[k] != before_out[k]:
            changed[f"{k} (outside)"] = [before_out[k], after_out[k]]
    if not warm:
        warm, warm_out = before, before_out
    result: dict[str, Any] = {
        "python": platform.python_version(),
        "cycles": args.cycles,
        "warmup": args.warmup,
        "proflets": list(proflets),
        "seconds": cycles_s,
        "attach_ms": {"median": 1000 * statistics.median(attach_s), "max": 1000 * max(attach_s)},
        "detach_ms": {"median": 1000 * statistics.median(detach_s), "max": 1000 * max(detach_s)},
        "cli_cycle_s": {"n": len(cli), "median": statistics.median(cli)} if cli else None,
        "unchanged": not changed,
        "changed": changed,
        "threads": [before_out["threads"], after_out["threads"]],
        "fds": [before_out["fds"], after_out["fds"]],
        "growth_after_warmup": {
            "rss_kib": (after_out["rss"] - warm_out["rss"]) / 1024,
            "blocks": after["blocks"] - warm["blocks"],
            "modules": sorted(set(after["modules"]) - set(warm["modules"])),
            "atexit_slots": after["atexit_slots"] - warm["atexit_slots"],
            "decoded_cache": after["decoded_cache"] - warm["decoded_cache"],
        },
        "decoded_cache": after["decoded_cache"],
        "modules_from_first_cycles": len(set(warm["modules"]) - set(before["modules"])),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0 if result["unchanged"] else 1
    growth = result["growth_after_warmup"]
    n = args.cycles - args.warmup
    print(f"Python {result['python']}, {args.cycles} injector attach/detach cycles in {cycles_s:.1f} s")
    print(f"  proflets             {args.proflets}")
    for what in ("attach", "detach"):
        ms = result[f"{what}_ms"]
        print(f"  {what} (injector)    median {ms['median']:7.1f} ms   max {ms['max']:7.1f} ms")
    if cli:
        print(f"  real CLI cycle       median {statistics.median(cli):7.2f} s    ({len(cli)} cycles)")
    print(f"  threads              {before_out['threads']} -> {after_out['threads']}")
    print(f"  descriptors          {before_out['fds']} -> {after_out['fds']}")
    print(f"  hooks, paths, atexit {'as before' if not changed else 'CHANGED: ' + ', '.join(changed)}")
    print(f"  growth over the last {n} cycles:")
    print(f"    RSS                {growth['rss_kib']:+9.0f} KiB")
    print(f"    live blocks        {growth['blocks']:+9d}")
    print(f"    sys.modules        {len(growth['modules']):+9d}  {' '.join(growth['modules'])}")
    print(f"    atexit slots       {growth['atexit_slots']:+9d}  (CPython keeps a slot per unregistered call)")
    cache = f"{growth['decoded_cache']:+9d}  (agent.tables, bounded; {result['decoded_cache']} code objects after)"
    print(f"    decoded code cache {cache}")
    print(f"  modules imported by the first {args.warmup} cycles: {result['modules_from_first_cycles']}")
    return 0 if result["unchanged"] else 1


if __name__ == "__main__":
    sys.exit(main())
