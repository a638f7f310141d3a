"""Triggers against periodic planted transients: do they fire, when, and does each event's window show its culprit?

    python bench/transients.py [--cycles 3] [--period 30] [--hot 5] [--budget 1%] [--ceiling 10%] [--json FILE]

Starts a standing monitor (``dyper monitor``, no history) and the service
``bench/workloads/transient_service.py`` (light steady work; each cycle a
function hot for ``--hot`` s, a thread stuck 6 s on a lock, a 200 MB memory
spike, with their onsets written down), attaches dyper with three triggers,
each with a 5 s "before" and "after":

    cpu > 50% for 2s      blocked > 3s      rss + 40MB/s for 1s

and lets ``--cycles`` cycles run. Then, per event, through the monitor as
``dyper triggers`` and ``dyper export --trigger N [--normal]`` see them:
which planted onset it belongs to and how long after it it fired; the share of
the event window's samples in the culprit (``hot_function`` cpu,
``stuck_waiter`` wall, ``spike_alloc`` cpu) against the same share in the
window as long just before it; the sampling rate in both; and the event's
spending (its reports' costs over the time they cover) against the budget it
was raised to. A planted onset no event matches is a miss; an event that
matches none is a false alarm. Also the whole run's overhead ledger, against
what the budgets in force allowed (the base budget, raised during events).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dyper.monitor.client import MonitorClient, wait_for_monitor  # noqa: E402
from dyper.monitor.model.profile import Profile  # noqa: E402

TRIGGERS = ("cpu > 50% for 2s, before 5s, after 5s", "blocked > 3s, before 5s, after 5s",
            "rss + 40MB/s for 1s, before 5s, after 5s")  # fmt: skip
#: kind -> (culprit function, metric its share is counted in)
CULPRITS = {"cpu": ("hot_function", "cpu"), "blocked": ("stuck_waiter", "wall"), "rss_growth": ("spike_alloc", "cpu")}
#: an event belongs to the latest onset of its kind at most this long before it fired
MATCH_S = 10.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _share(profile: Profile, function: str, metric: str) -> tuple[float, int]:
    """The share of ``metric`` samples with ``function`` on the stack, and the samples."""
    total = hit = 0
    names = [f.name for f in profile.frames]
    for stack in profile.stacks:
        n = stack.cpu if metric == "cpu" else stack.wall
        total += n
        if any(names[i] == function for i in stack.frames):
            hit += n
    return (hit / total if total else 0.0), total


def run(args: argparse.Namespace) -> dict[str, Any]:
    dyper = [sys.executable, "-m", "dyper"]
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    workdir = Path(tempfile.mkdtemp(prefix="dyper-transients-"))
    truth = workdir / "truth.jsonl"
    monitor = subprocess.Popen([*dyper, "monitor", "--listen", endpoint, "--no-history"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    service = subprocess.Popen(
        [sys.executable, str(HERE / "workloads" / "transient_service.py"), "--period", str(args.period),
         "--hot", str(args.hot), "--truth", str(truth)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert service.stdout is not None and service.stdout.readline().strip() == "ready"
        wait_for_monitor(endpoint, 15, alive=lambda: monitor.poll() is None)
        command = [*dyper, "attach", str(service.pid), "--budget", args.budget, "--ceiling", args.ceiling,
                   "--monitor", endpoint]  # fmt: skip
        for t in TRIGGERS:
            command += ["--trigger", t]
        subprocess.run(command, check=True, capture_output=True)
        seconds = args.cycles * args.period + 8
        print(f"attached at {args.budget} (ceiling {args.ceiling}); {args.cycles} cycles of {args.period:g} s ...",
              file=sys.stderr)  # fmt: skip
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            time.sleep(5)
            print(f"  {time.monotonic() - started:.0f} of {seconds:.0f} s", file=sys.stderr)
        with MonitorClient(endpoint, timeout=30.0) as client:
            events = client.call("triggers", pid=service.pid)
            process = client.call("report", pid=service.pid)["process"]
            rows = []
            for e in events:

                def window(edges: list[float]) -> dict[str, Any]:
                    return {"start": ["abs", edges[0]], "end": ["abs", edges[1]]}

                during = Profile.from_json(client.call("profile", pid=service.pid, window=window(e["window"])))
                normal = Profile.from_json(client.call("profile", pid=service.pid, window=window(e["normal"])))
                line = client.call("timeline", pid=service.pid, window=window(e["window"]), bucket_s=3600.0)
                _, _, reports, spent, covered, _ = line["buckets"][0] if line["buckets"] else [0] * 6
                function, metric = CULPRITS[e["kind"]]
                share, samples = _share(during, function, metric)
                normal_share, normal_samples = _share(normal, function, metric)
                span = e["window"][1] - e["window"][0]
                rows.append({
                    "id": e["id"], "kind": e["kind"], "t": e["t"], "why": e["why"], "budget": e["budget"],
                    "culprit": function, "metric": metric, "share": share, "normal_share": normal_share,
                    "passes_per_s": float(during.process.get("samples") or 0) / span,
                    "normal_passes_per_s": float(normal.process.get("samples") or 0) / span,
                    "samples": samples, "normal_samples": normal_samples,
                    "reports": reports, "spent_pct": 100 * spent / covered if covered else None,
                })  # fmt: skip
    finally:
        for proc in (service, monitor):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    onsets = [json.loads(line) for line in truth.read_text().splitlines()]
    for o in onsets:
        o["event"] = None
    for row in rows:
        row["onset"] = None
        candidates = [o for o in onsets if o["kind"] == row["kind"] and 0 <= row["t"] - o["t"] <= MATCH_S]
        if candidates:
            onset = max(candidates, key=lambda o: o["t"])
            row["onset"], row["delay_s"] = onset["t"], row["t"] - onset["t"]
            if onset["event"] is None:
                onset["event"] = row["id"]
    # Onsets the run saw through to an event's end: the last cycle's may be cut short.
    seen = [o for o in onsets if o["t"] < time.time() - 12]
    return {
        "machine": f"{os.cpu_count()} CPUs, {os.uname().machine}, Python {sys.version.split()[0]}",
        "args": vars(args),
        "triggers": TRIGGERS,
        "events": rows,
        "planted": len(seen),
        "missed": [o for o in seen if o["event"] is None],
        "false_alarms": [r for r in rows if r["onset"] is None],
        "overhead_pct": float(process.get("overhead") or 0),
        "allowed_pct": process.get("allowed"),
    }


def show(result: dict[str, Any]) -> None:
    print(f"{result['machine']}; triggers: {'; '.join(result['triggers'])}")
    print(f"{'#':>3} {'kind':<10} {'after onset':>11} {'culprit':<14} {'share':>6} {'before':>6} "
          f"{'passes/s':>9} {'before':>7} {'spent':>6} {'raised to':>9}")  # fmt: skip
    for r in result["events"]:
        delay = f"{r['delay_s']:.1f} s" if r.get("delay_s") is not None else "none"
        spent = f"{r['spent_pct']:.1f}%" if r["spent_pct"] is not None else "-"
        print(f"{r['id']:>3} {r['kind']:<10} {delay:>11} {r['culprit']:<14} {100 * r['share']:>5.0f}% "
              f"{100 * r['normal_share']:>5.0f}% {r['passes_per_s']:>9.0f} {r['normal_passes_per_s']:>7.0f} "
              f"{spent:>6} {100 * r['budget']:>8.0f}%")  # fmt: skip
    delays = [r["delay_s"] for r in result["events"] if r.get("delay_s") is not None]
    print(f"planted {result['planted']}, events {len(result['events'])}, missed {len(result['missed'])}, "
          f"false alarms {len(result['false_alarms'])}; median delay "
          f"{statistics.median(delays) if delays else float('nan'):.1f} s; whole-run overhead "
          f"{result['overhead_pct']:.2f}% of {result['allowed_pct'] or 0:.2f}% allowed (base budget "
          f"{result['args']['budget']})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--period", type=float, default=30.0)
    parser.add_argument("--hot", type=float, default=5.0)
    parser.add_argument("--budget", default="1%")
    parser.add_argument("--ceiling", default="10%")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    result = run(args)
    show(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
