from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dyper.monitor.server import Monitor

TARGETS = Path(__file__).parent / "targets"
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dyper(
    *args: str, timeout: float = 60, check: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would (``env``: added to the environment)."""
    proc = subprocess.run(
        [sys.executable, "-m", "dyper", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **env} if env else None,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dyper {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def start_target(*args: str, python: str = sys.executable) -> subprocess.Popen[str]:
    proc = subprocess.Popen([python, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"target did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    for stream in (proc.stdout, proc.stderr, proc.stdin):
        if stream is not None:
            stream.close()


class StandingMonitor:
    """``dyper monitor`` in a subprocess, keeping its history in ``history`` (never the user's own file)."""

    def __init__(self, port: int, history: Path | None = None, *args: str) -> None:
        import tempfile

        self.port = port
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.proc: subprocess.Popen[str] | None = None
        self._tmp = None if history is not None else tempfile.mkdtemp(prefix="dyper-history-")
        self.history = history if history is not None else Path(self._tmp or "") / "history.sqlite3"
        self.args = args

    def start(self) -> None:
        import tempfile

        # Its output is kept so that a failing test can show why the monitor went away.
        self.log = tempfile.NamedTemporaryFile(prefix="dyper-monitor-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dyper",
                "monitor",
                "--listen",
                self.endpoint,
                "--history",
                str(self.history),
                *self.args,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        self.log.close()  # the monitor has its own descriptor
        from dyper.monitor.client import wait_for_monitor

        wait_for_monitor(self.endpoint, 15)

    def call(self, op: str, **args: object) -> object:
        from dyper.monitor.client import MonitorClient

        with MonitorClient(self.endpoint, timeout=3) as client:
            return client.call(op, **args)

    def session(self, pid: int) -> dict[str, object] | None:
        sessions = self.call("sessions")
        assert isinstance(sessions, list)
        found = [s for s in sessions if s["pid"] == pid]
        return found[-1] if found else None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def cleanup(self) -> None:
        import shutil

        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace") if self.proc is not None else ""


@pytest.fixture
def standing_monitor() -> Iterator[StandingMonitor]:
    m = StandingMonitor(free_port())
    m.start()
    try:
        yield m
    finally:
        exited = m.proc is not None and m.proc.poll() is not None
        m.kill()
        if exited and m.proc is not None and m.proc.returncode not in (0, -9):
            print(f"monitor exited with {m.proc.returncode}:\n{m.output()}")
        Path(m.log.name).unlink(missing_ok=True)
        m.cleanup()


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.1, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def split_shares(profile_json: dict[str, object]) -> tuple[float, float]:
    """(heavy %, light %) of heavy+light total cpu samples."""
    from dyper.monitor.model.profile import Profile

    p = Profile.from_json(profile_json)
    rows = {r["name"]: r["total"] for r in p.functions("cpu")}
    heavy, light = rows.get("heavy", 0), rows.get("light", 0)
    assert heavy + light > 100, f"too few samples: {rows}"
    return 100.0 * heavy / (heavy + light), 100.0 * light / (heavy + light)


def split_tolerance(profile_json: dict[str, object], truth_pct: float) -> float:
    """How far the sampled heavy share may be from the truth: 5 points, or 3.5
    standard errors of a share estimated from this many samples if that is more
    (a few hundred samples put one standard error at 2 to 2.5 points)."""
    from dyper.monitor.model.profile import Profile

    p = Profile.from_json(profile_json)
    rows = {r["name"]: r["total"] for r in p.functions("cpu")}
    n = rows.get("heavy", 0) + rows.get("light", 0)
    q = truth_pct / 100.0
    return max(5.0, 3.5 * 100.0 * math.sqrt(q * (1.0 - q) / max(n, 1)))


def truth_share(heartbeat: Path) -> float:
    """The target's own measure of heavy's share of heavy+light, in percent."""
    _, heavy_s, light_s = heartbeat.read_text().split()
    return 100.0 * float(heavy_s) / (float(heavy_s) + float(light_s))


def threads_and_fds(pid: int) -> tuple[int, int]:
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


def threads_and_fds_named(pid: int) -> str:
    """The threads (by name) and open files of ``pid``: what a failed threads_and_fds check should show."""
    names = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task")):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            names.append(f"{tid} (gone)")
    fds = []
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            fds.append(f"{fd}->{os.readlink(f'/proc/{pid}/fd/{fd}')}")
        except OSError:
            fds.append(f"{fd} (gone)")
    return f"threads {names}, fds {fds}"


def load_json(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())


class MonitorThread:
    """A real monitor on its own event loop in a background thread."""

    def __init__(self) -> None:
        self.monitor = Monitor("tcp://127.0.0.1:0")
        self.endpoint = self.monitor.bind()
        self.loop = asyncio.new_event_loop()
        self.stop_event: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, name="test-monitor", daemon=True)
        self.thread.start()
        wait_for(lambda: self.stop_event is not None, what="monitor loop")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            self.stop_event = asyncio.Event()
            await self.monitor.serve(self.stop_event)

        self.loop.run_until_complete(main())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(5)
        self.monitor.close()
        self.loop.close()


@pytest.fixture
def monitor_thread():
    m = MonitorThread()
    try:
        yield m
    finally:
        m.close()
