"""A pre-fork server as one service: `dyper run -- gunicorn`, `dyper attach --children`, the merged views.

Real gunicorn masters and workers under real HTTP load.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from dyper.monitor.model.profile import Profile
from tests.factories import TARGETS, dyper, free_port, load_json, wait_for

pytest.importorskip("gunicorn", reason="gunicorn is a test dependency: pip install -e '.[test]'")

WORKERS = 2


def gunicorn_command(port: int) -> list[str]:
    cmd = [sys.executable, "-m", "gunicorn", "-w", str(WORKERS), "-b", f"127.0.0.1:{port}", "--chdir", str(TARGETS)]
    help_text = subprocess.run([*cmd[:3], "--help"], capture_output=True, text=True, timeout=30).stdout
    if "--no-control-socket" in help_text:
        # gunicorn >= 24 opens a control socket in the working directory by default
        cmd.append("--no-control-socket")
    return [*cmd, "wsgi_app:app"]


@contextmanager
def load(port: int) -> Iterator[list[int]]:
    """Requests in a loop from two threads until the block ends; yields the count of answered ones."""
    done = threading.Event()
    answered = [0]

    def loop() -> None:
        while not done.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    r.read()
                answered[0] += 1
            except (OSError, http.client.HTTPException):
                # not listening yet, or the worker that held the request was killed (the test kills one)
                time.sleep(0.1)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        yield answered
    finally:
        done.set()
        for t in threads:
            t.join(10)


def workers_of(master: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(master).children()]
    except psutil.Error:
        return []


def test_run_gunicorn_profiles_the_master_and_every_worker_as_one_service(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "service.json"
    with load(port) as answered:
        proc = dyper("run", "-q", "--duration", "8", "-o", str(out), "--", *gunicorn_command(port), timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert answered[0] > 50, "the service did not serve"
    p = load_json(out)["process"]
    pids = p["pids"]
    assert len(pids) == 1 + WORKERS, p["processes"]
    assert "gunicorn" in p["service"]
    # the master leads; every worker sent samples
    assert all(row["samples"] > 0 for row in p["processes"]), p["processes"]
    assert p["samples"] == sum(row["samples"] for row in p["processes"])
    functions = {r["name"]: r for r in Profile.load(out).functions("cpu")}
    # the workers' handler dominates the service's cpu (the master only waits)
    assert functions["planted_handler"]["self_pct"] > 30, functions["planted_handler"]
    assert "processes" in proc.stdout and "summary" in proc.stdout


def test_attach_children_to_a_running_master_and_watch_the_merged_service(standing_monitor, tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(gunicorn_command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with load(port):
            workers = wait_for(lambda: len(w := workers_of(server.pid)) == WORKERS and w, what="gunicorn workers")
            attached = dyper("attach", str(server.pid), "--children", "--monitor", standing_monitor.endpoint)
            assert attached.returncode == 0, attached.stderr
            assert f"attached to {WORKERS} of {WORKERS} child processes" in attached.stdout

            def service_view() -> dict[str, object] | None:
                view = standing_monitor.call("top", pid=server.pid, service=True)
                assert isinstance(view, dict)
                svc = view["service"]
                members = {m["pid"]: m for m in svc["members"]}
                live = all(members.get(w, {}).get("samples", 0) > 0 for w in workers)
                return view if live and svc["connected"] == 1 + WORKERS else None

            view = wait_for(service_view, timeout=30, what="master and workers reporting")
            assert sorted(view["service"]["pids"]) == sorted([server.pid, *workers])
            assert any(f["name"] == "planted_handler" for f in view["functions"])

            # A worker the master forks after the attach gets its own agent from the fork handler.
            os.kill(workers[0], signal.SIGKILL)
            new = wait_for(
                lambda: [w for w in workers_of(server.pid) if w not in workers] or None, what="a new worker"
            )[0]
            wait_for(
                lambda: (s := standing_monitor.session(new)) and s["connected"] and s["samples"] > 0,
                timeout=20,
                what="the new worker's session",
            )
            services = standing_monitor.call("services")
            assert isinstance(services, list)
            (svc,) = [s for s in services if server.pid in s["pids"]]
            assert new in svc["pids"] and svc["root_pid"] == server.pid

            top = dyper("top", "--service", str(server.pid), "--json", "--monitor", standing_monitor.endpoint)
            assert top.returncode == 0, top.stderr
            assert json.loads(top.stdout)["service"]["processes"] >= 1 + WORKERS
            collapsed = tmp_path / "service.collapsed"
            export = dyper(
                "export", str(server.pid), "--service", "-o", str(collapsed), "--monitor", standing_monitor.endpoint
            )
            assert export.returncode == 0, export.stderr
            assert "planted_handler" in collapsed.read_text()
    finally:
        server.terminate()
        server.wait(20)


def test_any_python_process_with_dyper_installed_starts_the_agent_from_its_environment(standing_monitor) -> None:
    # No PYTHONPATH, no import of dyper in the program: dyper_autostart.pth does it.
    program = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
    env = {**os.environ, "DYPER_MONITOR": standing_monitor.endpoint, "DYPER_BUDGET": "5%", "DYPER_SERVICE": "svc-t"}
    env.pop("PYTHONPATH", None)
    on = subprocess.Popen([sys.executable, "-c", program], env=env, stdout=subprocess.PIPE, text=True)
    off = subprocess.Popen(
        [sys.executable, "-c", program], env={**env, "DYPER_AUTOSTART": "0"}, stdout=subprocess.PIPE, text=True
    )
    try:
        for proc in (on, off):
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        session = wait_for(lambda: standing_monitor.session(on.pid), what="the autostarted agent")
        assert session["budget"] == pytest.approx(0.05)
        # the CLI itself, with DYPER_MONITOR in its environment, does not profile itself
        ps = dyper(
            "ps", "--json", "--monitor", standing_monitor.endpoint, env={"DYPER_MONITOR": standing_monitor.endpoint}
        )
        assert ps.returncode == 0, ps.stderr
        services = standing_monitor.call("services")
        assert isinstance(services, list)
        assert [s["pids"] for s in services if s["name"] == "svc-t"] == [[on.pid]]
        assert standing_monitor.session(off.pid) is None
        sessions = standing_monitor.call("sessions")
        assert isinstance(sessions, list) and len(sessions) == 1, sessions
    finally:
        for proc in (on, off):
            proc.kill()
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


def test_the_readme_demo_runs_end_to_end(tmp_path: Path) -> None:
    # `dyper demo`: the demo service, the agent attached at a budget, the monitor and its dashboard.
    out = tmp_path / "demo.json"
    proc = dyper("demo", "--duration", "6", "--no-browser", "--http", "127.0.0.1:0", "-o", str(out), timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "http://127.0.0.1:" in proc.stdout
    profile = Profile.load(out)
    assert profile.process["samples"] > 0
    assert any("demo" in f.file for f in profile.frames)
