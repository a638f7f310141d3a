"""Triggers catch planted transients in a real attached process: a hot function, a stuck thread, a memory spike."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.factories import REPO, dyper, start_target, stop, wait_for

#: bench/transients.py's service, one cycle, shorter: a core taken for 3 s from 6.5 s after the
#: agent starts, a thread stuck 3.5 s on a lock from 10.5 s, 200 MB in 1.5 s from 15.5 s.
TRANSIENT = (
    str(REPO / "bench" / "workloads" / "transient_service.py"), "--period", "0",
    "--hot-at", "6.5", "--hot", "3", "--stuck-at", "10.5", "--stuck", "3.5", "--spike-at", "15.5", "--spike", "1.5",
)  # fmt: skip


def _functions(path: Any) -> dict[str, int]:
    """Samples per function (leaf or not) in a collapsed export."""
    seen: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        for name in {frame.split(" ")[0] for frame in stack.split(";")}:
            seen[name] = seen.get(name, 0) + int(count)
    return seen


def test_planted_transients_fire_their_triggers_and_their_windows_show_the_culprits(standing_monitor, tmp_path):
    target = start_target(*TRANSIENT)
    ep, pid = standing_monitor.endpoint, str(target.pid)
    options = ", before 1s, after 2s"
    try:
        dyper(
            "attach", pid, "--budget", "1%", "--ceiling", "8%", "--monitor", ep,
            # Fires 1 to 2.5 s into the hot phase (a check a second, held half a second):
            # its "before" takes the onset in, the window before it ends ahead of the onset.
            "--trigger", "cpu > 40% for 0.5s, before 3s, after 2s",
            "--trigger", "blocked > 1.5s" + options,
            "--trigger", "rss + 40MB/s for 1s" + options,
            check=True,
        )  # fmt: skip

        def events() -> list[dict[str, Any]]:
            # Asked of the monitor directly while waiting (a CLI start costs a second of CPU);
            # the CLI's own listing is checked at the end.
            return list(standing_monitor.call("triggers", pid=target.pid))  # type: ignore[call-overload]

        # The spike's event fires about 17 s after the agent starts, its window ends 2 s later.
        fired = wait_for(lambda: len(e := events()) >= 3 and e, timeout=75, interval=2.0, what="three events")
        time.sleep(max(0.0, fired[-1]["window"][1] + 0.5 - time.time()))  # the last event's window is over
        by_kind = {e["kind"]: e for e in fired}
        assert [e["kind"] for e in fired] == ["cpu", "blocked", "rss_growth"], fired
        assert "process CPU" in by_kind["cpu"]["why"]
        assert "stuck" in by_kind["blocked"]["why"] and "stuck_waiter" in by_kind["blocked"]["why"]
        assert "RSS grew" in by_kind["rss_growth"]["why"]
        # Each event raised the budget to the ceiling, never past it, and spent within it:
        # the reports in its window, their costs over the time they cover.
        assert all(e["budget"] == 0.08 for e in fired), fired
        for e in fired:
            window = {"start": ["abs", e["window"][0]], "end": ["abs", e["window"][1]]}
            timeline = standing_monitor.call("timeline", pid=target.pid, window=window, bucket_s=60.0)
            _, _, reports, spent, covered, _ = timeline["buckets"][0]  # type: ignore[index]
            assert reports >= 2 and spent <= 0.08 * covered * 1.25, (e, timeline)

        # The hot function fills the cpu event's window and is absent from the window before it.
        cpu_id = str(by_kind["cpu"]["id"])
        during, normal = tmp_path / "during.collapsed", tmp_path / "normal.collapsed"
        dyper("export", pid, "--trigger", cpu_id, "-o", str(during), "--monitor", ep, check=True)
        dyper("export", pid, "--trigger", cpu_id, "--normal", "-o", str(normal), "--monitor", ep, check=True)
        hot, calm = _functions(during), _functions(normal)
        assert hot.get("hot_function", 0) >= 0.5 * max(hot.values()), hot
        # A check that came late under load could let the onset's first tenths into it, no more.
        assert calm.get("hot_function", 0) <= 0.1 * max(calm.values()) and calm.get("steady", 0) > 0, calm

        # The spike's window has the allocating function.
        spike = tmp_path / "spike.collapsed"
        dyper("export", pid, "--trigger", str(by_kind["rss_growth"]["id"]), "-o", str(spike), "--monitor", ep,
              check=True)  # fmt: skip
        assert "spike_alloc" in _functions(spike)

        # The search of the event minus the normal window suggests the hot function.
        out = dyper("bottlenecks", pid, "--trigger", cpu_id, "-c", "suggest 5", "--json", "--monitor", ep, check=True)
        (suggest,) = json.loads(out.stdout)
        assert suggest["ok"] and "hot_function" in json.dumps(suggest["summaries"]), suggest

        # The report and the human list name them.
        report = json.loads(dyper("report", pid, "--json", "--monitor", ep, check=True).stdout)
        assert [e["kind"] for e in report["process"]["triggers"]] == ["cpu", "blocked", "rss_growth"]
        assert any(m["kind"] == "trigger" for m in report["process"]["marks"])
        listed = json.loads(dyper("triggers", pid, "--json", "--monitor", ep, check=True).stdout)
        assert [e["id"] for e in listed] == [e["id"] for e in fired]
        listing = dyper("triggers", pid, "--monitor", ep, check=True).stdout
        assert "cpu > 40%" in listing and "blocked > 1.5s" in listing and "--trigger N" in listing
    finally:
        dyper("detach", pid, "--monitor", ep)
        stop(target)


def test_a_trigger_it_cannot_read_stops_the_attach_with_one_line(standing_monitor):
    target = start_target(*TRANSIENT)
    try:
        out = dyper("attach", str(target.pid), "--monitor", standing_monitor.endpoint, "--trigger", "cpu > lots")
        assert out.returncode == 1 and out.stderr.count("\n") == 1 and "write it like" in out.stderr
        assert standing_monitor.session(target.pid) is None  # nothing was attached
    finally:
        stop(target)
