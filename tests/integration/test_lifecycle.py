"""How dyper run, attach and top begin and end: killed, detached from outside, stopped, given no Python."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.factories import REPO, TARGETS, wait_for

SAMPLER = "dyper-sampler"


def thread_names(pid: int) -> list[str]:
    names = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return names


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def cli(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dyper", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        **kwargs,  # type: ignore[call-overload]
    )


def test_run_killed_leaves_no_agent_behind(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    run = cli("run", "-q", "--", sys.executable, str(TARGETS / "forever.py"), str(pidfile))
    target = 0
    try:
        target = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, what="the target"))
        wait_for(lambda: SAMPLER in thread_names(target), 30, what="the agent's thread in the target")
        run.kill()
        run.wait(10)
        # A regression leaves the thread for good (the agent reconnects forever); the
        # pidfd fires at once, so 15 s is a loaded machine's margin, not a guess.
        wait_for(lambda: SAMPLER not in thread_names(target), 15, what="the agent to detach")
        assert alive(target), "the program ends only when it wants to: dyper run's death is not its death"
    finally:
        if run.poll() is None:
            run.kill()
        if target and alive(target):
            os.kill(target, signal.SIGKILL)
        run.communicate(timeout=10)


def test_run_passes_sighup_on(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    # Under nohup SIGHUP is ignored, and an ignored signal stays so across exec: the
    # program would inherit it and (rightly) not end. The test wants the default.
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        run = cli("run", "-q", "--", sys.executable, str(TARGETS / "forever.py"), str(pidfile))
    finally:
        signal.signal(signal.SIGHUP, before)
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, what="the target")
        time.sleep(0.5)
        run.send_signal(signal.SIGHUP)
        # forever.py does not handle SIGHUP: it ends, and dyper run with it, as after any exit
        out, err = run.communicate(timeout=30)
    finally:
        if pidfile.exists() and (pid := pidfile.read_text().strip()) and alive(int(pid)):
            os.kill(int(pid), signal.SIGKILL)  # a regression: dyper run died of the signal, the program did not
        if run.poll() is None:
            run.kill()
            run.communicate(timeout=10)
    assert run.returncode == 0, (out, err)  # the program's own end (killed by a signal: 0, as documented)


def start_forever(tmp_path: Path) -> subprocess.Popen[bytes]:
    pidfile = tmp_path / "forever.pid"
    proc = subprocess.Popen([sys.executable, str(TARGETS / "forever.py"), str(pidfile)])
    wait_for(pidfile.exists, 30, what="the target to start")
    return proc


def test_attach_ends_when_detached_from_outside(tmp_path: Path) -> None:
    target = start_forever(tmp_path)
    attach = cli("attach", str(target.pid), "-q")
    try:
        wait_for(lambda: SAMPLER in thread_names(target.pid), 60, what="the agent's thread in the target")
        time.sleep(1.5)  # its hello reached the CLI's monitor (the first report goes within a second)
        detach = subprocess.run(
            [sys.executable, "-m", "dyper", "detach", str(target.pid)], capture_output=True, text=True, cwd=REPO
        )
        assert detach.returncode == 0, detach.stderr
        # A regression waits for the process to end (here: never) or Ctrl-C.
        out, err = attach.communicate(timeout=30)
    finally:
        if attach.poll() is None:
            attach.kill()
            attach.communicate(timeout=10)
        target.kill()
        target.wait(10)
    assert attach.returncode == 0, (out, err)
    assert f"the agent in process {target.pid} was detached from outside" in out, (out, err)


def test_attach_killed_leaves_no_agent_behind(tmp_path: Path) -> None:
    target = start_forever(tmp_path)
    attach = cli("attach", str(target.pid), "-q")
    try:
        wait_for(lambda: SAMPLER in thread_names(target.pid), 60, what="the agent's thread in the target")
        attach.kill()
        attach.wait(10)
        wait_for(lambda: SAMPLER not in thread_names(target.pid), 15, what="the agent to detach")
        assert target.poll() is None
    finally:
        if attach.poll() is None:
            attach.kill()
        attach.communicate(timeout=10)
        target.kill()
        target.wait(10)


def test_top_writes_its_frame_when_terminated(standing_monitor, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "DYPER_MONITOR": standing_monitor.endpoint, "DYPER_BUDGET": "5%"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "monitor" / "autostart"), env.get("PYTHONPATH")) if p)
    pidfile = tmp_path / "pid"
    target = subprocess.Popen([sys.executable, str(TARGETS / "forever.py"), str(pidfile)], env=env)
    top = None
    try:
        wait_for(
            lambda: (s := standing_monitor.session(target.pid)) and s["samples"] > 20, 30, what="the target's samples"
        )
        top = cli("top", str(target.pid), "--monitor", standing_monitor.endpoint)  # stdout is a pipe: no terminal
        time.sleep(3)  # its first frame is made at once; a regression prints nothing at all
        top.send_signal(signal.SIGTERM)
        out, err = top.communicate(timeout=20)
    finally:
        if top is not None and top.poll() is None:
            top.kill()
            top.communicate(timeout=10)
        target.kill()
        target.wait(10)
    assert top.returncode == 0, (out, err)
    assert "spin" in out, (out, err)


def test_run_says_a_program_is_not_python() -> None:
    # The wait for a last report that cannot come is made a minute long here, so that
    # a regression (waiting for it) shows whatever the machine's load.
    script = (
        "import sys; import dyper.monitor.embedded as e; e.FINAL_REPORT_WAIT_S = 60.0; "
        "from dyper.monitor.cli import main; sys.exit(main(['run', '--', '/bin/echo', 'hi']))"
    )
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=100)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "/bin/echo is not a Python program" in lines[0], proc.stderr
    assert "hi" in proc.stdout  # the program ran, its output is its own
    assert "no samples" not in proc.stdout + proc.stderr
    assert time.monotonic() - began < 40.0


def test_run_says_a_command_is_missing() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dyper", "run", "--", "no-such-command-here"], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["dyper run: error: no-such-command-here: command not found"], (
        proc.stderr
    )


def test_run_notes_when_no_python_comes() -> None:
    run = cli("run", "--", "sleep", "30")
    try:
        time.sleep(7)  # NOT_PYTHON_NOTE_S and a margin; the note goes out once, at once
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate(timeout=10)
    assert "no Python process has started under the program" in out, (out, err)
    assert run.returncode == 2, (out, err)
    assert "sleep is not a Python program" in err


def agent_proflets(monitor, pid: int) -> dict[str, object] | None:  # type: ignore[no-untyped-def]
    session = monitor.session(pid)
    if not session or not session["samples"]:
        return None
    view = monitor.call("top", pid=pid)
    return view["session"]["spending"].get("proflets") or None  # type: ignore[no-any-return,index]


@pytest.mark.parametrize(
    ("option", "env", "expected"),
    [
        # (tasks details nothing: the agent lists only the proflets that detail, and those switched off)
        (
            ["--proflets", "-cpu,-heap"],
            None,
            {"threads", "timing", "io", "memory", "memory_stacks"},
        ),  # the default set less two
        (["--proflets", "cpu,heap"], None, {"cpu", "heap"}),  # those only
        (["--proflets", "all,-heap"], None, {"cpu", "threads", "timing", "io", "memory", "memory_stacks"}),
        ([], "-memory_stacks,-io", {"cpu", "threads", "timing", "heap", "memory"}),  # the environment form
    ],
)
def test_run_chooses_proflets(standing_monitor, tmp_path: Path, option, env, expected) -> None:  # type: ignore[no-untyped-def]
    pidfile = tmp_path / "pid"
    extra = {**os.environ, "DYPER_PROFLETS": env} if env is not None else None
    run = cli(
        "run",
        "--monitor",
        standing_monitor.endpoint,
        "--duration",
        "60",
        *option,
        "--",
        sys.executable,
        str(TARGETS / "forever.py"),
        str(pidfile),
        env=extra,
    )
    try:
        target = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, what="the target"))
        states = wait_for(lambda: agent_proflets(standing_monitor, target), 30, what="the agent's proflets")
    finally:
        if pidfile.exists() and (pid := pidfile.read_text().strip()) and alive(int(pid)):
            os.kill(int(pid), signal.SIGKILL)  # first: it holds dyper run's output pipes
        run.kill()
        run.communicate(timeout=10)
    running = {name for name, state in states.items() if not state.get("off")}
    assert running == expected, states
