"""asyncio task views of a real aiohttp service under load, attached to while it runs.

The service (bench/workloads/async_service.py) has a planted slow await
(``handle_order`` awaits ``fetch_order``, 50 ms of ``asyncio.sleep``) and a
planted blocking call (``compress_blocking``: 250 ms of ``time.sleep`` inside
the ``cache-rebuilder`` task, once a second). A load generator in another
process keeps eight requests in flight.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.factories import REPO, dyper, free_port, start_target, stop, wait_for

SERVICE = str(REPO / "bench" / "workloads" / "async_service.py")
BUDGET = 0.05


def test_task_view_charges_the_await_and_reports_the_blocked_loop(standing_monitor, tmp_path):
    port = free_port()
    target = start_target(SERVICE, "serve", "--port", str(port), "--block-every", "1")
    ep, pid = standing_monitor.endpoint, str(target.pid)
    load = None
    try:
        dyper("attach", pid, "--budget", "5%", "--monitor", ep, check=True)
        load = subprocess.Popen(
            [sys.executable, SERVICE, "load", "--port", str(port), "--seconds", "7", "--concurrency", "8"],
            stdout=subprocess.PIPE,
            text=True,
        )

        def tasks() -> dict[str, Any] | None:
            report: Any = standing_monitor.call("report", pid=target.pid)
            section = report["proflets"].get("tasks") or {}
            blocks = section.get("blocks") or []
            return report if len(blocks) >= 3 and section.get("handlers") else None

        wait_for(tasks, timeout=40, interval=1.0, what="three blocks and the handlers in the task view")
        out, _ = load.communicate(timeout=30)
        served = json.loads(out)
        assert served["requests"] > 200 and served["errors"] == 0, served
        report = tasks()
        assert report is not None
        section = report["proflets"]["tasks"]

        # The slow await is charged to its chain: handle_order waits in fetch_order's asyncio.sleep.
        by_handler = {h["handler"]: h for h in section["handlers"]}
        order = by_handler["handle_order"]
        assert order["awaiting"][0]["function"] == "fetch_order", order
        assert order["awaiting"][0]["via"] == "sleep", order
        assert order["awaiting"][0]["pct"] >= 80, order
        assert order["running_pct"] < 20, order

        # The blocking call is reported as blocking the loop, with its stack and task. On a loaded machine
        # a request callback preempted for 100 ms is a block too (the loop did stand still): the planted
        # ones are told by their stack: three at least, each in its task.
        blocks = section["blocks"]
        planted = [
            b for b in blocks if [w["function"] for w in b["stack"][-2:]] == ["rebuild_cache", "compress_blocking"]
        ]
        assert len(planted) >= 3, blocks
        for b in planted:
            assert b["task"] == "cache-rebuilder", b
            # 250 ms planted. The estimate is what the passes saw plus one mean gap between them, within
            # 150-450 ms at a pass every 10-30 ms (5%); the sparse passes of a loaded machine widen that
            # (106 ms seen), though never under the 100 ms threshold nor over twice the time the loop stood.
            assert 100 <= b["duration_ms"] <= 900, b
        assert any(150 <= b["duration_ms"] <= 450 for b in planted), planted
        (loop,) = section["loops"]
        assert loop["thread"] == "MainThread" and loop["blocks"] >= 3 and loop["blocked_s"] > 0.45, loop
        assert loop["tasks_max"] >= 2 and loop["lag_probes"] >= 1, loop
        # The finding names the longest block's call (the planted one, unless the machine preempted worse).
        longest = max(blocks, key=lambda b: b["duration_ms"])["stack"][-1]["function"]
        assert any("was blocked" in f and longest in f for f in report["findings"]), (longest, report["findings"])
        assert any(f.startswith("handle_order spent") for f in report["findings"]), report["findings"]

        # Inside the budget, task passes included (percent, as the report gives it). The guard
        # pays before it spends; what it cannot foresee is the operation in flight when the run
        # ends (a burst settled above its reservation): a few percent of a short run's spend.
        process = report["process"]
        assert 0 < process["overhead"] <= 1.1 * 100 * BUDGET, process["overhead"]

        # dyper top's view: the loop's line, and the task view ranked by all task time.
        top: Any = standing_monitor.call("top", pid=target.pid, view="tasks")
        assert top["view"] == "tasks" and top["asyncio"]["loops"][0]["blocks"] >= 3, top["asyncio"]
        assert {"fetch_order", "handle_order"} <= {r["name"] for r in top["by_total"]}, top["by_total"]

        # The task view as a profile: exported, and what the search reads.
        collapsed = tmp_path / "tasks.collapsed"
        dyper("export", pid, "--view", "tasks", "--metric", "wall", "-o", str(collapsed), "--monitor", ep, check=True)
        chains = {line.rpartition(" ")[0]: int(line.rpartition(" ")[2]) for line in collapsed.read_text().splitlines()}
        awaiting = sum(n for stack, n in chains.items() if "handle_order" in stack and "fetch_order" in stack)
        in_order = sum(n for stack, n in chains.items() if "handle_order" in stack)
        assert awaiting >= 0.8 * in_order > 0, chains
        search = dyper(
            "bottlenecks", pid, "--view", "tasks", "--metric", "wall", "-c", "suggest", "--json",
            "--monitor", ep, check=True,
        )  # fmt: skip
        assert "fetch_order" in search.stdout or "sleep" in search.stdout, search.stdout
    finally:
        if load is not None and load.poll() is None:
            load.kill()
            load.wait()
        stop(target)
