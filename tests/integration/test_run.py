"""dyper run, end to end: real CLI, real target process, real sockets."""

import re
import sys

from tests.factories import TARGETS, dyper, load_json, split_shares, truth_share


def test_run_gives_the_known_split(tmp_path):
    out, truth = tmp_path / "prof.json", tmp_path / "truth"
    proc = dyper(
        "run",
        "--budget",
        "5%",
        "--duration",
        "8",
        "-o",
        str(out),
        "--",
        sys.executable,
        str(TARGETS / "split.py"),
        "--heartbeat",
        str(truth),
        check=True,
    )
    heavy, light = split_shares(load_json(out))
    assert abs(heavy - truth_share(truth)) <= 5.0, (heavy, light, truth_share(truth))
    profile = load_json(out)
    assert profile["process"]["budget"] == 0.05
    assert 0 < profile["process"]["overhead"] <= 0.05
    assert "heavy" in proc.stdout  # the final summary table


def test_run_until_the_program_ends_writes_collapsed(tmp_path):
    out = tmp_path / "prof.collapsed"
    dyper("run", "--budget", "5%", "-o", str(out), "--", sys.executable, str(TARGETS / "split.py"), "2", check=True)
    lines = out.read_text().splitlines()
    assert lines, "empty profile"
    frame = re.compile(r"^[^;]+ \([^;]*:\d+\)$")
    for line in lines:
        stack, count = line.rsplit(" ", 1)
        assert int(count) > 0
        # every frame is "qualname (file:line)"; stacks are root first. The agent
        # starts with the interpreter, so start-up imports may be roots too.
        assert all(frame.match(f) for f in stack.split(";")), stack
    main = [line for line in lines if line.startswith("<module> (")]
    # Sampling starts with the program: at 5% a 2-s CPU-bound run gives hundreds
    # of samples (about 800 here). An agent thread that loaded its proflets
    # behind the busy main thread once took none, or a few, before it ended.
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) >= 100
    assert sum(int(line.rsplit(" ", 1)[1]) for line in main) > 0.9 * sum(int(x.rsplit(" ", 1)[1]) for x in lines)
    assert any("heavy (" in line and "work (" in line for line in main)


def test_run_speedscope_output(tmp_path):
    out = tmp_path / "prof.speedscope.json"
    dyper("run", "--budget", "5%", "-o", str(out), "--", sys.executable, str(TARGETS / "split.py"), "2", check=True)
    doc = load_json(out)
    assert doc["$schema"].startswith("https://www.speedscope.app/")
    assert any(f["name"] == "heavy" for f in doc["shared"]["frames"])


def test_run_returns_the_program_exit_code(tmp_path):
    proc = dyper("run", "-q", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert proc.returncode == 3


def test_run_errors_are_one_line():
    proc = dyper("run", "--", "no-such-program-xyz")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "command not found" in proc.stderr
    proc = dyper("run", "--budget", "150%", "--", sys.executable, "-c", "pass")
    assert proc.returncode == 2 and "out of range" in proc.stderr
