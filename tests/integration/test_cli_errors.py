"""Bad input to the CLI: one line on stderr that names what is wrong and how to fix it.

Cases that involve other processes (a PID, a monitor or none) run the real
``dyper`` in subprocesses, all at once, as most wait only for a client's
timeout. Cases that are about the arguments alone run ``monitor.cli.main`` in
this process: the same code without an interpreter's start-up each, which
would make this file slow. Not here, because they have their own tests in
test_attach.py: a process we may not ptrace
(test_attach_without_permission_says_so), a target Python too old
(test_attach_refuses_old_python) or without dyper
(test_errors_inside_the_target_come_back_to_the_cli), a wrong PID or a
non-Python one for attach (test_attach_errors_are_one_line).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.factories import REPO, MonitorThread, free_port

NO_PID = "999999999"
#: placeholders the fixture fills in: a `sleep` process, a port nobody listens on, a monitor that knows nothing
SLEEP, CLOSED, KNOWN_NOTHING = "{sleep}", "{closed}", "{live}"

BAD_BUDGETS = ["150%", "-1", "abc", "0%", "", "1e9", "nan", "0.000001%"]
BUDGET_FIX = ("give a value from 0.01% to 50%", "write it like 1% or 0.01")

Case = tuple[list[str], str, tuple[str, ...]]

#: (argv, what the line must name, how it must say to fix it: any one of these), about the arguments alone
ARGUMENTS: list[Case] = [
    # budget out of range or malformed, for each command that takes one
    *[(["budget", "1", b], repr(b), BUDGET_FIX) for b in BAD_BUDGETS],
    *[(["attach", "1", "--budget", b], repr(b), BUDGET_FIX) for b in BAD_BUDGETS],
    *[(["run", "--budget", b, "--", sys.executable, "-c", "pass"], repr(b), BUDGET_FIX) for b in BAD_BUDGETS],
    (["attach", "1", "--ceiling", "80%"], "'80%'", BUDGET_FIX),
    (["top", "0"], "'0'", ("not a process id",)),
    (["detach", "-5"], "'-5'", ("not a process id",)),
    (["budget", "abc", "5%"], "'abc'", ("not a process id",)),
    (["pause", "0"], "'0'", ("not a process id",)),
    (["reset", "x"], "'x'", ("not a process id",)),
    # not an endpoint at all
    *[
        ([cmd, *pid, "--monitor", bad], repr(bad), ("use tcp://HOST:PORT or ipc://PATH",))
        for cmd, pid in (("top", ["1"]), ("ps", []), ("budget", ["1", "5%"]), ("detach", ["1"]), ("report", ["1"]))
        for bad in ("foo", "tcp://127.0.0.1:99999", "tcp://127.0.0.1", "ipc://")
    ],
    (["run", "--monitor", "foo", "--", sys.executable, "-c", "pass"], "'foo'", ("use tcp://HOST:PORT",)),
    (["attach", "1", "--monitor", "foo"], "'foo'", ("use tcp://HOST:PORT",)),
]

#: the same, with processes and monitors: run as a user would
PROCESSES: list[Case] = [
    # no such process, a process that is not Python (budget and detach fall back to the process itself)
    (["budget", NO_PID, "5%", "--monitor", CLOSED], NO_PID, ("check the PID",)),
    (["detach", NO_PID, "--monitor", CLOSED], NO_PID, ("check the PID",)),
    (["budget", SLEEP, "5%", "--monitor", CLOSED], SLEEP, ("pass the PID of the python process",)),
    (["detach", SLEEP, "--monitor", CLOSED], SLEEP, ("pass the PID of the python process",)),
    *[([op, NO_PID, "--monitor", CLOSED], NO_PID, ("check the PID",)) for op in ("pause", "resume", "reset")],
    (["pause", SLEEP, "--monitor", CLOSED], SLEEP, ("pass the PID of the python process",)),
    # a monitor that knows nothing of the process
    (["top", NO_PID, "--monitor", KNOWN_NOTHING, "--once"], NO_PID, ("attach to it first",)),
    (["report", NO_PID, "--monitor", KNOWN_NOTHING], NO_PID, ("attach to it first",)),
    # no monitor there
    (["top", NO_PID, "--monitor", CLOSED], CLOSED, ("start one with `dyper monitor`",)),
    (["ps", "--monitor", CLOSED], CLOSED, ("start one with `dyper monitor`",)),
    (["ps", "--monitor", CLOSED, "--json"], CLOSED, ("start one with `dyper monitor`",)),
    (["report", NO_PID, "--monitor", CLOSED], CLOSED, ("start one with `dyper monitor`",)),
    (["attach", NO_PID, "--monitor", CLOSED], CLOSED, ("start one with `dyper monitor`",)),
    (["run", "--monitor", CLOSED, "--", sys.executable, "-c", "pass"], CLOSED, ("start one with `dyper monitor`",)),
    # and one about the arguments, end to end
    (["top", "1", "--monitor", "foo"], "'foo'", ("use tcp://HOST:PORT",)),
]


def _id(case: Case) -> str:
    return " ".join(a if a != sys.executable else "python" for a in case[0])


def _check(case: Case, code: object, stderr: str, names: dict[str, str]) -> None:
    argv, what, fixes = case
    for placeholder, value in names.items():
        what = what.replace(placeholder, value)
    assert code not in (0, None), stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith(f"dyper {argv[0]}: error: "), line
    assert what in line, f"{what!r} not named in: {line}"
    assert any(fix in line for fix in fixes), f"no fix ({fixes}) in: {line}"


@pytest.mark.parametrize("case", ARGUMENTS, ids=_id)
def test_bad_arguments_get_one_line_naming_them_and_the_fix(case: Case, capsys: pytest.CaptureFixture[str]) -> None:
    from dyper.monitor.cli import main

    try:
        code: object = main(case[0])
    except SystemExit as exc:  # argparse's way out, as in a real run
        code = exc.code
    _check(case, code, capsys.readouterr().err, {})


@pytest.fixture(scope="module")
def results() -> Iterator[tuple[dict[str, subprocess.CompletedProcess[str]], dict[str, str]]]:
    sleeper = subprocess.Popen(["sleep", "60"])
    live = MonitorThread()
    names = {SLEEP: str(sleeper.pid), CLOSED: f"tcp://127.0.0.1:{free_port()}", KNOWN_NOTHING: live.endpoint}

    def run(case: Case) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dyper", *(names.get(a, a) for a in case[0])],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env=dict(os.environ, COLUMNS="200"),  # one line is one line, however wide the message
        )

    try:
        with ThreadPoolExecutor(max_workers=len(PROCESSES)) as pool:
            done = dict(zip(map(_id, PROCESSES), pool.map(run, PROCESSES), strict=True))
        yield done, names
    finally:
        live.close()
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("case", PROCESSES, ids=_id)
def test_bad_input_about_processes_gets_one_line_naming_it_and_the_fix(
    case: Case, results: tuple[dict[str, subprocess.CompletedProcess[str]], dict[str, str]]
) -> None:
    done, names = results
    proc = done[_id(case)]
    _check(case, proc.returncode, proc.stderr, names)
