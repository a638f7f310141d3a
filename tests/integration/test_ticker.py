"""The C ticker across a fork (moved from tests/unit/test_ticker.py: it forks a child)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dyper.agent import core
from tests.factories import running_ticker, spin_here, ticker_threads

fast: Any = core._fast
pytestmark = pytest.mark.skipif(fast is None or not getattr(fast, "TICKER", 0), reason="no C ticker on this platform")


BIG = 1000.0  # tokens and cap: money is no object


@pytest.fixture
def ticker() -> Iterator[tuple[int, int]]:
    with running_ticker() as started:
        yield started


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_the_ticker_works_in_a_forked_child(ticker: tuple[int, int]) -> None:
    fast.ticker_set(0.002, 0.25, 1.0, BIG, BIG)
    spin_here(0.1)
    pid = os.fork()
    if pid == 0:  # the child: no ticker thread came along; a new one starts
        code = 1
        try:
            _r, w = os.pipe()
            fast.ticker_stop()  # nothing to join
            fast.ticker_start(threading.get_ident() + 1, w)
            fast.ticker_set(0.002, 0.25, 1.0, BIG, BIG)
            # Spin until the new ticker has sampled a few times: 0.4 s is
            # plenty when idle, a loaded CI machine may need longer.
            counts: dict[tuple[int, tuple[int, ...]], int] = {}
            n = 0
            deadline = time.monotonic() + 10
            while n <= 10 and time.monotonic() < deadline:
                spin_here(0.2)
                n += fast.ticker_drain(counts, {}, lambda *a: 0)
            fast.ticker_stop()
            deadline = time.monotonic() + 5
            while ticker_threads() and time.monotonic() < deadline:
                time.sleep(0.01)
            # Distinct codes say which half failed.
            code = 2 if n <= 10 else 3 if ticker_threads() else 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code != 2, "the child's new ticker took at most 10 samples in 10 s"
    assert code != 3, "the child's ticker thread outlived ticker_stop by 5 s"
    assert code == 0
