"""CURVE-secured remote monitors and `dyper keys`, end to end.

A real `dyper monitor` listens off loopback with CURVE (on a real
non-loopback address of this machine when there is one, else on 0.0.0.0,
reached over 127.0.0.1 with CURVE all the same), real targets stream to it
with good and bad keys, and this host's commands use its control endpoint.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import zmq.auth

from dyper import agent
from dyper.monitor import cli
from dyper.monitor.client import MonitorClient, MonitorUnreachable
from dyper.monitor.commands.keys import make_pair
from dyper.monitor.commands.run import child_env
from tests.factories import REPO, TARGETS, dyper, free_port, start_target, stop, wait_for


def remote_address() -> str | None:
    """An IPv4 address of this machine that is not loopback, if it has one."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return None


@dataclass
class Pair:
    public: Path
    secret: Path


@dataclass
class CurveMonitor:
    """`dyper monitor` with CURVE in a subprocess, and the keys around it."""

    proc: subprocess.Popen[bytes]
    log: Path
    #: where agents connect (CURVE)
    endpoint: str
    #: this host's commands (no CURVE)
    control: str
    monitor: Pair
    #: an agent pair whose public key is in the authorized directory
    agent: Pair
    #: one whose is not
    stranger: Pair
    authorized: Path

    def call(self, op: str, **args: object) -> object:
        with MonitorClient(self.control, timeout=3) as client:
            return client.call(op, **args)

    def counters(self) -> dict[str, int]:
        ping = self.call("ping")
        assert isinstance(ping, dict)
        return dict(ping["counters"])

    def session(self, pid: int) -> dict[str, object] | None:
        sessions = self.call("sessions")
        assert isinstance(sessions, list)
        found = [s for s in sessions if s["pid"] == pid]
        return found[-1] if found else None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def curve_monitor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CurveMonitor]:
    tmp = tmp_path_factory.mktemp("curve")
    keys, authorized = tmp / "keys", tmp / "authorized"
    authorized.mkdir()
    pairs = {name: Pair(*make_pair(keys, name)) for name in ("monitor", "agent-web1", "stranger")}
    (authorized / "agent-web1.key").write_bytes(pairs["agent-web1"].public.read_bytes())
    host, port = remote_address(), free_port()
    listen = f"tcp://{host or '0.0.0.0'}:{port}"
    control = f"ipc://{tmp}/control.sock"
    log = tmp / "monitor.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "dyper", "monitor", "--listen", listen, "--no-history"),
                *("--curve-secret", str(pairs["monitor"].secret), "--authorized", str(authorized)),
                *("--control", control),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    m = CurveMonitor(
        proc,
        log,
        f"tcp://{host or '127.0.0.1'}:{port}",
        control,
        pairs["monitor"],
        pairs["agent-web1"],
        pairs["stranger"],
        authorized,
    )
    try:

        def up() -> bool:
            assert proc.poll() is None, f"the monitor exited:\n{m.output()}"
            try:
                m.call("ping")
                return True
            except MonitorUnreachable:
                return False

        wait_for(up, what="the CURVE monitor's control endpoint")
        yield m
    finally:
        # SIGTERM: the monitor closes its sockets, and libzmq removes the ipc file.
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def start_agent(m: CurveMonitor, monitor_key: Path, key: Path) -> subprocess.Popen[str]:
    """A real target whose agent streams to ``m`` with these keys (as `dyper run --monitor` starts it)."""
    env = child_env(m.endpoint, 0.05, monitor_key=str(monitor_key), key=str(key))
    proc = subprocess.Popen(
        [sys.executable, str(TARGETS / "split.py"), "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_an_authorized_agent_streams_reports_over_curve(curve_monitor, monkeypatch):
    m = curve_monitor
    target = start_agent(m, m.monitor.public, m.agent.secret)
    try:
        wait_for(lambda: (s := m.session(target.pid)) and s["connected"] and s["samples"] > 0, what="reports")
        # This host's commands work through the control endpoint (`dyper top` is this call).
        top = m.call("top", pid=target.pid)
        assert isinstance(top, dict) and top["session"]["pid"] == target.pid
        # From elsewhere, a client needs the keys too: with them it is answered,
        # without them the CURVE endpoint says nothing.
        curve = agent.load_keys(str(m.monitor.public), str(m.agent.secret))
        with MonitorClient(m.endpoint, timeout=5, curve=curve) as client:
            assert client.call("ping")["sessions"] >= 1
        if remote_address() is not None:  # (the environment's keys are for endpoints off loopback)
            monkeypatch.setenv("DYPER_MONITOR_KEY", str(m.monitor.public))
            monkeypatch.setenv("DYPER_KEY", str(m.agent.secret))
            with MonitorClient(m.endpoint, timeout=5) as client:
                assert client.call("ping")["sessions"] >= 1
            monkeypatch.delenv("DYPER_MONITOR_KEY")
            monkeypatch.delenv("DYPER_KEY")
        with MonitorClient(m.endpoint, timeout=0.5) as client, pytest.raises(MonitorUnreachable):
            client.call("ping")
        assert target.poll() is None
    finally:
        stop(target)


def test_an_agent_whose_key_is_not_authorized_gets_no_session_and_is_counted(curve_monitor):
    m = curve_monitor
    before = m.counters()["auth_rejected"]
    target = start_agent(m, m.monitor.public, m.stranger.secret)
    try:
        wait_for(lambda: m.counters()["auth_rejected"] > before, what="the rejection to be counted")
        time.sleep(1.0)  # an agent let in says hello at once (see the test above)
        assert m.session(target.pid) is None
        assert target.poll() is None, "the target must not suffer from a refused agent"
        stranger = zmq.auth.load_certificate(m.stranger.public)[0].decode()
        # Logged once for this peer and key, however often it might come back.
        assert m.output().count(f"refused agent key {stranger}") == 1, m.output()
    finally:
        stop(target)


def test_an_agent_with_the_wrong_monitor_key_gets_no_session(curve_monitor):
    m = curve_monitor
    before = m.counters()["handshake_failed"]
    # The stranger's public key stands in for a monitor we do not run: the
    # agent's handshake cannot be read by ours.
    target = start_agent(m, m.stranger.public, m.agent.secret)
    try:
        wait_for(lambda: m.counters()["handshake_failed"] > before, what="the failed handshake to be counted")
        time.sleep(1.0)
        assert m.session(target.pid) is None
        assert target.poll() is None
    finally:
        stop(target)


def test_dyper_run_streams_to_the_curve_monitor_with_keys(curve_monitor):
    m = curve_monitor
    marker = f"curve-run-{os.getpid()}"
    proc = dyper(
        "run",
        "--monitor",
        m.endpoint,
        "--monitor-key",
        str(m.monitor.public),
        "--key",
        str(m.agent.secret),
        "--budget",
        "20%",
        "--",
        sys.executable,
        str(TARGETS / "split.py"),
        "1",
        marker,
        check=True,
    )
    assert proc.returncode == 0
    sessions = m.call("sessions")
    assert isinstance(sessions, list)
    assert any(marker in " ".join(s["argv"]) and s["samples"] > 0 for s in sessions), sessions


def test_attach_passes_the_keys_into_the_target(curve_monitor):
    from dyper.monitor.attach import attach, detach

    m = curve_monitor
    target = start_target(str(TARGETS / "split.py"), "60")
    try:
        attach(target.pid, m.endpoint, 0.2, monitor_key=str(m.monitor.public), key=str(m.agent.secret))
        wait_for(lambda: (s := m.session(target.pid)) and s["samples"] > 0, what="the attached agent's reports")
        assert detach(target.pid)
    finally:
        stop(target)


def test_a_non_loopback_endpoint_without_keys_is_refused(capsys):
    remote = f"tcp://{remote_address() or '10.1.2.3'}:{free_port()}"
    with pytest.raises(ValueError, match="not on loopback") as err:
        agent.start(remote)
    assert "dyper keys" in str(err.value) and "\n" not in str(err.value)
    assert not agent.is_running()

    proc = dyper("run", "--monitor", remote, "--", sys.executable, "-c", "pass")
    assert proc.returncode == 2
    assert proc.stderr.startswith("dyper run: error: monitor endpoint"), proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "dyper keys" in proc.stderr, proc.stderr

    # (in this process: the refusal comes before anything is bound or started)
    assert cli.main(["monitor", "--listen", f"tcp://0.0.0.0:{free_port()}", "--no-history"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0, err
    assert "dyper keys" in err and "--curve-secret" in err and "--authorized" in err


def test_a_bad_key_file_is_an_error_from_start(tmp_path):
    pair = Pair(*make_pair(tmp_path, "agent"))
    remote = f"tcp://{remote_address() or '10.1.2.3'}:{free_port()}"
    missing = tmp_path / "no-such.key"
    with pytest.raises(ValueError, match=r"no-such\.key"):
        agent.start(remote, monitor_key=str(missing), key=str(pair.secret))
    # the secret where the monitor's public key belongs: it must not travel
    with pytest.raises(ValueError, match="secret certificate"):
        agent.start(remote, monitor_key=str(pair.secret), key=str(pair.secret))
    with pytest.raises(ValueError, match="no secret key"):
        agent.start(remote, monitor_key=str(pair.public), key=str(pair.public))
    with pytest.raises(ValueError, match="both keys"):
        agent.start(remote, monitor_key=str(pair.public))
    assert not agent.is_running()


def test_a_forked_child_reuses_the_parents_keys(curve_monitor, tmp_path):
    # The key files go away after start, as for a worker that dropped the
    # privileges to read them: the child must stream all the same.
    m = curve_monitor
    monitor_key, key = tmp_path / "monitor.key", tmp_path / "agent.key_secret"
    monitor_key.write_bytes(m.monitor.public.read_bytes())
    key.write_bytes(m.agent.secret.read_bytes())
    code = f"""
import os, sys, time
from dyper import agent
agent.start({m.endpoint!r}, "5%", monitor_key={str(monitor_key)!r}, key={str(key)!r})
os.unlink({str(monitor_key)!r}); os.unlink({str(key)!r})
print("started", flush=True)
sys.stdin.readline()
pid = os.fork()
if pid == 0:
    print(os.getpid(), flush=True)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        sum(i * i for i in range(1000))
    os._exit(0)
os.waitpid(pid, 0)
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "started"
        # Forked once the parent's agent is up: a fork while its thread holds
        # an import lock leaves the child's agent stuck (a separate problem).
        wait_for(lambda: m.session(proc.pid), what="the parent's session")
        proc.stdin.write("fork\n")
        proc.stdin.flush()
        child = int(proc.stdout.readline())
        wait_for(lambda: (s := m.session(child)) and s["samples"] > 0, what="the child's reports")
    finally:
        for p in psutil.Process(proc.pid).children():
            p.kill()
        stop(proc)


def test_dyper_keys_makes_a_private_pair_and_will_not_overwrite_it(tmp_path, capsys):
    keys = tmp_path / "keys"
    proc = dyper("keys", "--dir", str(keys), "--name", "agent-web1", check=True)
    public, secret = keys / "agent-web1.key", keys / "agent-web1.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    pub, none = zmq.auth.load_certificate(public)
    pub2, sec = zmq.auth.load_certificate(secret)
    assert none is None and sec is not None and pub == pub2
    # where the files are and how to use them, in a few lines
    assert str(public) in proc.stdout and str(secret) in proc.stdout
    assert "--authorized" in proc.stdout and "--monitor-key" in proc.stdout and "--curve-secret" in proc.stdout
    assert "DYPER_KEY" in proc.stdout and len(proc.stdout.splitlines()) <= 6

    # The rest in this process (the same parser and error path; a CLI start costs seconds here).
    assert cli.main(["keys", "--dir", str(keys), "--name", "agent-web1"]) == 1
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "--force" in err
    assert zmq.auth.load_certificate(secret) == (pub2, sec), "a refused run must leave the pair as it was"

    assert cli.main(["keys", "--dir", str(keys), "--name", "agent-web1", "--force"]) == 0
    new_pub, new_sec = zmq.auth.load_certificate(secret)
    assert new_pub != pub and new_sec != sec
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600

    assert cli.main(["keys", "--dir", str(keys), "--name", "../evil"]) == 2
    assert not (tmp_path / "evil.key").exists()


def test_the_default_control_endpoint_is_private(tmp_path, monkeypatch):
    from dyper.monitor.curve import default_control

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    endpoint = default_control(7341)
    assert endpoint == f"ipc://{tmp_path}/dyper/monitor-7341.sock"
    assert stat.S_IMODE((tmp_path / "dyper").stat().st_mode) == 0o700
    # Someone else's directory where ours should be is refused (as root, fake it with a symlink).
    other = Path(tempfile.mkdtemp(dir=tmp_path))
    (tmp_path / "dyper").rmdir()
    (tmp_path / "dyper").symlink_to(other)
    with pytest.raises(ValueError, match="--control"):
        default_control(7341)


def test_keys_added_to_or_removed_from_the_authorized_directory_count_without_a_restart(curve_monitor, tmp_path):
    m = curve_monitor
    late = Pair(*make_pair(tmp_path, "agent-late"))
    entry = m.authorized / "agent-late.key"
    entry.write_bytes(late.public.read_bytes())
    target = start_agent(m, m.monitor.public, late.secret)
    try:
        wait_for(lambda: (s := m.session(target.pid)) and s["connected"], what="the newly authorized agent")
    finally:
        stop(target)
    # Revoked: the next handshake with that key is refused.
    entry.unlink()
    before = m.counters()["auth_rejected"]
    target = start_agent(m, m.monitor.public, late.secret)
    try:
        wait_for(lambda: m.counters()["auth_rejected"] > before, what="the revoked key to be refused")
        assert m.session(target.pid) is None
    finally:
        stop(target)
