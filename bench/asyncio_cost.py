"""What the tasks proflet costs: per pass with many pending tasks, and on an aiohttp service under load.

    python bench/asyncio_cost.py [--tasks 0,1000,10000] [--rounds 3] [--seconds 8] [--json FILE]

Part 1, per pass (in this process): an event loop in its own thread with 20
request-like tasks (await a 50 ms sleep, then a little CPU) and K parked
tasks; the collector's pass is timed from another thread, as the agent runs
it, every 10 ms, 300 times: the median pass (the running task's stack, the
loop's callback, 8 suspended tasks' await chains) and the median census
(counting every task, at most once a second and within 5% of the budget).

Part 2, on a service: bench/workloads/async_service.py (aiohttp) under its
load generator (8 requests in flight), with no agent and attached at 1% and
5%, interleaved round by round: requests/s and p99 latency (medians), the
agent's own overhead and the task passes it made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dyper.proflets.tasks import collector as tasks_proflet  # noqa: E402

SERVICE = str(REPO / "bench" / "workloads" / "async_service.py")


def per_pass(parked: int) -> dict[str, float]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="loop", daemon=True)
    thread.start()

    async def handler() -> None:
        while True:
            await asyncio.sleep(0.05)
            sum(range(2000))

    async def park(event: asyncio.Event) -> None:
        await event.wait()

    kept: list[asyncio.Task[None]] = []

    async def plant() -> None:
        never = asyncio.Event()
        kept.extend(loop.create_task(handler()) for _ in range(20))
        kept.extend(loop.create_task(park(never)) for _ in range(parked))
        await asyncio.sleep(0.1)

    asyncio.run_coroutine_threadsafe(plant(), loop).result(30)
    c = tasks_proflet.TasksCollector()
    tm = sys.modules["asyncio.tasks"]
    c.poll(time.monotonic(), 0.05)
    passes, censuses = [], []
    for i in range(300):
        time.sleep(0.01)
        refs = tasks_proflet._task_refs(tm)
        t0 = time.perf_counter()
        c._pass(time.monotonic(), 0.01, refs, tm)
        passes.append(time.perf_counter() - t0)
        if i % 20 == 0:
            t0 = time.perf_counter()
            c._census(tasks_proflet._task_refs(tm), tm)
            censuses.append(time.perf_counter() - t0)

    async def cancel_all() -> None:
        for t in asyncio.all_tasks():
            if t is not asyncio.current_task():
                t.cancel()

    asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    return {"pass_us": 1e6 * statistics.median(passes), "census_us": 1e6 * statistics.median(censuses)}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def service_round(budget: str | None, seconds: float, monitor: str) -> dict[str, Any]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    serve = [sys.executable, SERVICE, "serve", "--port", str(port)]
    target = subprocess.Popen(serve, stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        if budget is not None:
            subprocess.run(
                [sys.executable, "-m", "dyper", "attach", str(target.pid), "--budget", budget, "--monitor", monitor],
                check=True, capture_output=True, env=env, cwd=REPO,
            )  # fmt: skip
            time.sleep(1.0)
        out = subprocess.run(
            [sys.executable, SERVICE, "load", "--port", str(port), "--seconds", str(seconds)],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        result: dict[str, Any] = json.loads(out)
        if budget is not None:
            from dyper.monitor.client import MonitorClient

            with MonitorClient(monitor, timeout=10) as client:
                report = client.call("report", pid=target.pid)
            section = report["proflets"].get("tasks") or {}
            result.update(
                overhead_pct=report["process"]["overhead"],
                passes=section.get("passes", 0),
                pass_us=section.get("pass_us", 0.0),
                blocks=sum(loop["blocks"] for loop in section.get("loops", [])),
            )
        return result
    finally:
        target.kill()
        target.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="0,1000,10000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"machine: {machine}")
    out: dict[str, Any] = {"machine": machine, "per_pass": {}, "service": {}}
    for k in (int(x) for x in args.tasks.split(",")):
        r = per_pass(k)
        out["per_pass"][k] = r
        print(f"{k:>6} parked tasks: pass {r['pass_us']:6.0f} us   census {r['census_us']:7.0f} us", flush=True)
    if args.rounds <= 0:  # the per-pass part only
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        return 0
    port = _free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    monitor = subprocess.Popen(
        [sys.executable, "-m", "dyper", "monitor", "--listen", endpoint, "--no-history"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    time.sleep(2.0)
    rows: dict[str, list[dict[str, Any]]] = {"none": [], "1%": [], "5%": []}
    try:
        for r in range(args.rounds):
            for name in rows:
                got = service_round(None if name == "none" else name, args.seconds, endpoint)
                rows[name].append(got)
                print(f"round {r + 1} {name:>4}: {json.dumps(got)}", flush=True)
    finally:
        monitor.kill()
        monitor.wait()
    base = statistics.median(x["requests_per_s"] for x in rows["none"])
    print("\n| agent | requests/s | vs none | p99 ms | overhead (agent's) | task passes/s | pass us | blocks/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, got in rows.items():
        rps = statistics.median(x["requests_per_s"] for x in got)
        p99 = statistics.median(x["p99_ms"] for x in got)
        line = f"| {name} | {rps:.0f} | {100 * (rps / base - 1):+.1f}% | {p99:.0f} |"
        if name != "none":
            line += (
                f" {statistics.median(x['overhead_pct'] for x in got):.2f}% |"
                f" {statistics.median(x['passes'] for x in got) / args.seconds:.0f} |"
                f" {statistics.median(x['pass_us'] for x in got):.0f} |"
                f" {statistics.median(x['blocks'] for x in got) / args.seconds:.2f} |"
            )
        else:
            line += " | | | |"
        print(line)
        out["service"][name] = got
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
