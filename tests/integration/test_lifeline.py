"""agent.lifeline on real processes (moved from tests/unit/test_lifeline.py: they start one)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dyper.agent.lifeline import Lifeline


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
