"""History and exports end to end: a real `dyper monitor` keeping its history in SQLite, real agents,
the monitor killed and restarted on the same file, and `dyper export` of live and old windows through it."""

import json
import time
from collections import Counter

from dyper.monitor.model.profile import Profile
from tests.factories import (
    TARGETS,
    StandingMonitor,
    dyper,
    free_port,
    html_data,
    read_pprof,
    start_with_agent,
    stop,
    wait_for,
)

SPLIT = str(TARGETS / "split.py")


def stacks(profile_json, metric="cpu"):
    """(thread, frames root first) -> samples: comparable across monitors, whatever the frame numbering."""
    p = Profile.from_json(profile_json)
    out = Counter()
    for s in p.stacks:
        n = s.cpu if metric == "cpu" else s.wall
        if n:
            out[(s.thread, tuple((p.frames[i].file, p.frames[i].name, p.frames[i].line) for i in s.frames))] += n
    return out


def test_a_killed_monitor_restarted_on_its_history_still_answers_for_old_sessions(tmp_path):
    history = tmp_path / "history.sqlite3"
    mon = StandingMonitor(free_port(), history)
    mon.start()
    gone = start_with_agent(mon.endpoint, SPLIT, "60", budget=0.2)  # will be stopped: an old session
    live = start_with_agent(mon.endpoint, SPLIT, "60", budget=0.05)  # keeps running across the restart
    try:
        enough = lambda: (s := mon.session(gone.pid)) and s["samples"] > 300 and s["reports"] >= 4  # noqa: E731
        wait_for(enough, timeout=30, what="four reports")
        live_before = mon.session(live.pid)["samples"]
        stop(gone)
        time.sleep(1.5)  # gone's last report is in, and all before it; the writer commits every 0.5 s
        before = mon.call("profile", pid=gone.pid)
        assert before["process"]["samples"] > 300
        mon.kill()  # SIGKILL: no chance to flush anything more

        mon.start()  # the same port, the same history file
        (old,) = [s for s in mon.call("sessions") if s["pid"] == gone.pid]
        assert not old["connected"] and old["samples"] == before["process"]["samples"]
        after = mon.call("profile", pid=gone.pid)
        assert stacks(after) == stacks(before) and stacks(after, "wall") == stacks(before, "wall")
        assert after["threads"] == before["threads"]

        # Two slices of the old run, read from disk, that add up to the whole.
        half = round((old["last_report"] - old["first_report"]) / 2, 3)
        first = mon.call("profile", pid=gone.pid, window={"start": None, "end": ["first", half]})
        rest = mon.call("profile", pid=gone.pid, window={"start": ["first", half], "end": None})
        assert 0 < first["process"]["samples"] < before["process"]["samples"]
        assert stacks(first) + stacks(rest) == stacks(before)
        assert first["process"]["window"]["reports"] >= 1

        # The running process carries on from what history kept, not from zero (the reports of
        # the last half-second before the kill may be lost, not those received 1.5 s before it).
        restored = mon.session(live.pid)["samples"]
        assert restored >= live_before > 0
        try:
            wait_for(
                lambda: (s := mon.session(live.pid))["connected"] and s["samples"] > restored,
                timeout=20,
                what="the live agent back, adding to its restored session",
            )
        except AssertionError as exc:
            state = {"sessions": mon.call("sessions"), "ping": mon.call("ping"), "restored": restored}
            raise AssertionError(f"{exc}: {state}\nmonitor said:\n{mon.output()[-3000:]}") from None

        # The user's view: export windows of the old and the live process through the restarted monitor.
        out = tmp_path / "old.pb.gz"
        proc = dyper("export", str(gone.pid), "--monitor", mon.endpoint, "--window", f":+{half}", "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        assert f"pid {gone.pid}, from the start to {half:g}s after the first report" in proc.stderr
        _, _, samples = read_pprof(out.read_bytes())
        assert sum(v["cpu_samples"] for _, _, v in samples) == sum(stacks(first).values())
        # The bottleneck search and the diagnosis over the same old slice, from disk.
        proc = dyper(
            "bottlenecks", str(gone.pid), "--monitor", mon.endpoint, "--window", f":+{half}",
            "-c", "suggest", "--json",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        (suggested,) = json.loads(proc.stdout)
        assert suggested["ok"] and suggested["total"] == sum(stacks(first).values()), suggested
        proc = dyper("diagnose", str(gone.pid), "--monitor", mon.endpoint, "--window", f":+{half}", "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["bottlenecks"], proc.stdout
        page = tmp_path / "live.html"
        proc = dyper("export", str(live.pid), "--monitor", mon.endpoint, "--last", "30s", "-o", str(page))
        assert proc.returncode == 0, proc.stderr
        assert html_data(page.read_text())["tree"][2] > 0
        stats = mon.call("history")
        assert stats["path"] == str(history) and stats["sessions"] == 2 and stats["reports"] > 3
    finally:
        stop(gone)
        stop(live)
        mon.kill()


def test_retention_drops_old_reports_then_the_quiet_session(tmp_path):
    mon = StandingMonitor(free_port(), tmp_path / "history.sqlite3", "--retain-age", "2s")
    mon.start()
    target = start_with_agent(mon.endpoint, SPLIT, "60", budget=0.2)
    try:
        wait_for(lambda: (s := mon.session(target.pid)) and s["samples"] > 0, timeout=20, what="first report")
        time.sleep(4.5)  # several reports, reporting at most once a second
        stats = mon.call("history")
        session = mon.session(target.pid)
        # Reports older than 2 s (plus a check interval and a commit) are gone, the newest stay...
        assert 0 < stats["reports"] < session["reports"]
        assert stats["oldest_report"] > time.time() - 4.0
        # ...and the whole run's totals stay while the session does.
        whole = mon.call("profile", pid=target.pid)
        assert whole["process"]["samples"] == session["samples"]
        stop(target)
        wait_for(lambda: mon.call("history")["sessions"] == 0, timeout=15, what="the quiet session dropped")
        mon.kill()
        mon.start()
        assert mon.session(target.pid) is None
    finally:
        stop(target)
        mon.kill()
        mon.cleanup()
