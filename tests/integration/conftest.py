"""Fixtures of the integration tests; what they are built from is in tests/factories.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.factories import MonitorThread, StandingMonitor, free_port


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


@pytest.fixture
def monitor_thread():
    m = MonitorThread()
    try:
        yield m
    finally:
        m.close()
