"""dyper attach / detach on real running processes, on every supported Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dyper.monitor import inject
from dyper.monitor.attach import attach, detach
from tests.factories import (
    TARGETS,
    MonitorThread,
    dyper,
    load_json,
    split_shares,
    split_tolerance,
    start_target,
    stop,
    threads_and_fds,
    threads_and_fds_named,
    truth_share,
    wait_for,
)

PROBE = r"""
import gc, json, os, sys, threading, tracemalloc
mod = sys.modules.get("dyper.agent")
state = {
    "threads": sorted(t.name for t in threading.enumerate()),
    "profile": repr(sys.getprofile()),
    "trace": repr(sys.gettrace()),
    "tracemalloc": tracemalloc.is_tracing(),
    "gc_callbacks": len(gc.callbacks),
    "monitoring": [i for i in range(6) if sys.monitoring.get_tool(i)] if hasattr(sys, "monitoring") else [],
    # 3.11: cpu detailing's frame evaluation hook (PEP 523) is out again
    "frame_hook": bool(getattr(sys.modules.get("dyper.agent._fastsample"), "frame_hook_installed", lambda: False)()),
    "agent_running": bool(mod is not None and mod.is_running()),
    "sys_path": list(sys.path),
}
with open(OUT + ".tmp", "w") as f:
    json.dump(state, f)
os.replace(OUT + ".tmp", OUT)
"""


def probe(pid: int, tmp_path: Path) -> dict[str, object]:
    """What the target looks like from inside (run in it through the injector)."""
    out = tmp_path / f"probe-{time.monotonic_ns()}.json"
    src = f"exec({PROBE!r}, {{'OUT': {str(out)!r}}})"
    inject.run_in_target(pid, src)
    wait_for(out.exists, what="probe result")
    return json.loads(out.read_text())


def pythons() -> list[str]:
    """The interpreter under test plus the other supported pyenv ones that can load dyper."""
    return [sys.executable]


@pytest.fixture
def sleeping_main_target(tmp_path):
    heartbeat = tmp_path / "truth"
    proc = start_target(str(TARGETS / "split.py"), "600", "--main-sleeps", "--heartbeat", str(heartbeat))
    proc.heartbeat = heartbeat  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        stop(proc)


def test_attach_gives_the_known_split_while_main_thread_sleeps(sleeping_main_target, tmp_path):
    target = sleeping_main_target
    out = tmp_path / "prof.json"
    dyper("attach", str(target.pid), "--budget", "10%", "--duration", "8", "-o", str(out), check=True)
    profile = load_json(out)
    heavy, _ = split_shares(profile)
    truth = truth_share(target.heartbeat)
    assert abs(heavy - truth) <= split_tolerance(profile, truth), (heavy, truth, split_tolerance(profile, truth))
    assert target.poll() is None  # still running
    assert not probe(target.pid, tmp_path)["agent_running"]  # detached at the end


def test_attach_to_a_program_that_never_imported_threading_knows_its_main_thread(tmp_path):
    # The injected thread imports threading, which takes it for the main thread:
    # the real one was then unnamed, its CPU clock unread, and a single-threaded
    # CPU-bound program was "ready to run but not running 100% of the time (GIL)".
    target = start_target(str(TARGETS / "no_threading.py"))
    try:
        out = tmp_path / "prof.json"
        dyper("attach", str(target.pid), "--duration", "6", "-o", str(out), check=True)
        report = json.loads(dyper("report", str(out), "--json", check=True).stdout)
    finally:
        stop(target)
    # Unread, its clock said 0 s: all of its time was then filed under the GIL. A
    # loaded machine's run queue takes some of it (the GIL sampler cannot tell the
    # two apart, issue 29), not most.
    (main,) = report["proflets"]["threads"]["threads"]
    assert main["name"] == "MainThread", main
    assert main["run_pct"] > 40 and main["gil_pct"] is not None and main["gil_pct"] < 60, main
    (clock,) = report["proflets"]["timing"]["threads"]
    assert clock["name"] == "MainThread" and clock["cpu_s"] > 1.0, clock


def test_detach_leaves_the_process_as_it_was_and_reattach_works(sleeping_main_target, tmp_path):
    target = sleeping_main_target
    before = probe(target.pid, tmp_path)
    monitor = MonitorThread()
    try:
        counts = threads_and_fds(target.pid)
        for cycle in range(20):
            attach(target.pid, monitor.endpoint, 0.05)
            if cycle in (0, 19):
                session = wait_for(lambda: monitor.monitor.session_for(target.pid), what="session")
                seen = session.samples
                wait_for(lambda s=session, n=seen: s.samples > n, what=f"reports in cycle {cycle}")
            assert detach(target.pid), "no agent was running"
        # The bootstrap's thread and the sampler's OS thread finish exiting just
        # after detach() returns; what must not happen is growth that stays.
        try:
            wait_for(lambda: threads_and_fds(target.pid) == counts, timeout=10, what=f"back to {counts}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; left: {threads_and_fds_named(target.pid)}") from None
    finally:
        monitor.close()
    after = probe(target.pid, tmp_path)
    assert after == before
    assert "dyper-sampler" not in after["threads"]  # type: ignore[operator]
    assert target.poll() is None


def test_attach_to_a_standing_monitor_and_detach_through_it(sleeping_main_target, standing_monitor):
    pid = sleeping_main_target.pid
    proc = dyper("attach", str(pid), "--monitor", standing_monitor.endpoint, "--budget", "2%", check=True)
    assert f"attached to {pid}" in proc.stdout
    wait_for(lambda: (s := standing_monitor.session(pid)) and s["samples"] > 0, what="samples")
    assert standing_monitor.session(pid)["budget"] == pytest.approx(0.02)
    dyper("budget", str(pid), "4%", "--monitor", standing_monitor.endpoint, check=True)
    wait_for(lambda: standing_monitor.session(pid)["budget"] == pytest.approx(0.04), what="budget change")
    dyper("detach", str(pid), "--monitor", standing_monitor.endpoint, check=True)
    assert not standing_monitor.session(pid)["connected"]


def test_detach_without_a_monitor_stops_the_agent_from_inside(sleeping_main_target, tmp_path):
    pid = sleeping_main_target.pid
    attach(pid, "tcp://127.0.0.1:1", 0.01)  # nobody listens there
    assert probe(pid, tmp_path)["agent_running"]
    proc = dyper("detach", str(pid), "--monitor", "tcp://127.0.0.1:1")
    assert proc.returncode == 0, proc.stderr
    assert not probe(pid, tmp_path)["agent_running"]
    proc = dyper("detach", str(pid), "--monitor", "tcp://127.0.0.1:1")
    assert proc.returncode == 1 and "no dyper agent is running" in proc.stderr


def _one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_attach_errors_are_one_line():
    _one_line_error(dyper("attach", "999999999"), "no process with PID 999999999")
    _one_line_error(dyper("attach", "abc"), "not a process id")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        _one_line_error(dyper("attach", str(sleeper.pid)), "not a CPython process")
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.skipif(not os.path.exists("/root/.pyenv/versions/3.10.13/bin/python"), reason="no Python 3.10 here")
def test_attach_refuses_old_python():
    old = subprocess.Popen(["/root/.pyenv/versions/3.10.13/bin/python", "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        _one_line_error(dyper("attach", str(old.pid)), "3.10")
    finally:
        old.kill()
        old.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/setpriv"), reason="needs root to drop privileges")
def test_attach_without_permission_says_so(sleeping_main_target):
    # An unprivileged user may not ptrace root's process.
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if (
        subprocess.run(
            [*nobody, sys.executable, "-c", "import dyper.monitor"],
            capture_output=True,
            cwd=Path(__file__).resolve().parents[2],
        ).returncode
        != 0
    ):
        pytest.skip("this interpreter cannot run as an unprivileged user here (its files are private to root)")
    proc = subprocess.run(
        [*nobody, sys.executable, "-m", "dyper", "attach", str(sleeping_main_target.pid)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        env=dict(os.environ, HOME="/tmp"),
    )
    _one_line_error(proc, "cannot ptrace", "uid")


def _bare_python(minor: int) -> str | None:
    """A pyenv interpreter without dyper's dependencies, if this machine has one."""
    import glob

    found = sorted(glob.glob(f"/root/.pyenv/versions/3.{minor}.*/bin/python3.{minor}"))
    if not found:
        return None
    ok = subprocess.run([found[-1], "-c", "import msgpack"], capture_output=True).returncode != 0
    return found[-1] if ok else None


def test_attach_makes_the_agent_importable_in_a_bare_interpreter_of_the_same_version(tmp_path):
    bare = _bare_python(sys.version_info[1])
    if bare is None:
        pytest.skip("no bare interpreter of this version here")
    target = start_target(str(TARGETS / "split.py"), "600", "--main-sleeps", python=bare)
    try:
        before = probe(target.pid, tmp_path)
        out = tmp_path / "p.json"
        dyper("attach", str(target.pid), "--budget", "5%", "--duration", "3", "-o", str(out), check=True)
        assert load_json(out)["stacks"]
        assert probe(target.pid, tmp_path)["sys_path"] == before["sys_path"]  # what we added is gone
    finally:
        stop(target)


def test_errors_inside_the_target_come_back_to_the_cli():
    others = [m for m in (11, 12, 13) if m != sys.version_info[1] and _bare_python(m)]
    if not others:
        pytest.skip("no bare interpreter of another supported version here")
    target = start_target(str(TARGETS / "split.py"), "600", "--main-sleeps", python=_bare_python(others[0]))
    try:
        proc = dyper("attach", str(target.pid), "--duration", "2")
        _one_line_error(proc, f"inside process {target.pid}", "install dyper in the target's environment")
        assert target.poll() is None
    finally:
        stop(target)
