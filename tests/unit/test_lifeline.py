"""agent.lifeline: an agent's watch on its run-scoped monitor's process."""

from __future__ import annotations

import os

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


@pytest.mark.parametrize(("raw", "pid"), [("", None), ("12", 12), ("x", None), ("-3", None), (" 7 ", 7)])
def test_the_environment_form(monkeypatch: pytest.MonkeyPatch, raw: str, pid: int | None) -> None:
    monkeypatch.setenv(lifeline.ENV, raw)
    assert lifeline.monitor_pid_from_env() == pid
