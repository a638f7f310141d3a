"""agent.lifeline: an agent's watch on its run-scoped monitor's process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dyper.agent import lifeline
from dyper.agent.lifeline import Lifeline


def test_a_live_process_is_not_gone() -> None:
    line = Lifeline(os.getpid())
    try:
        assert not line.gone()
    finally:
        line.close()
    assert line.fd is None


def test_an_ended_process_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    line = Lifeline(child.pid)
    try:
        assert not line.gone()
        child.kill()
        child.wait(10)
        assert line.gone()
    finally:
        line.close()


def test_without_pidfds_it_asks_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    line = Lifeline(child.pid)
    assert line.fd is None
    assert not line.gone()
    child.kill()
    child.wait(10)
    assert line.gone()


@pytest.mark.parametrize(("raw", "pid"), [("", None), ("12", 12), ("x", None), ("-3", None), (" 7 ", 7)])
def test_the_environment_form(monkeypatch: pytest.MonkeyPatch, raw: str, pid: int | None) -> None:
    monkeypatch.setenv(lifeline.ENV, raw)
    assert lifeline.monitor_pid_from_env() == pid
