"""The native sampler inside a real agent, and across a fork (moved from tests/unit/test_native.py:
the agent opens a ZeroMQ socket, and a fork starts a process)."""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections import Counter
from typing import Any

import pytest

native: Any
try:
    native = importlib.import_module("dyper.agent._native")
except ImportError:
    native = None

pytestmark = pytest.mark.skipif(native is None, reason="no native sampler for this interpreter")


def _spin(stop: threading.Event, out: dict[str, float]) -> None:
    c0 = time.thread_time()
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i
    out[threading.current_thread().name] = time.thread_time() - c0


def test_agent_samples_natively_and_names_gil_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    from dyper import agent
    from dyper.agent.native import GIL_WAIT, STATE_FILE

    monkeypatch.setenv("DYPER_SAMPLER", "native")
    stop = threading.Event()
    out: dict[str, float] = {}
    spinners = [threading.Thread(target=_spin, args=(stop, out), name=f"spin{i}") for i in range(2)]
    for t in spinners:
        t.start()
    agent.start("tcp://127.0.0.1:1", 0.05, proflets=())  # nobody listens: the counts stay
    try:
        a = agent._agent
        assert a is not None
        assert (a.sampler, a.sampler_why) == ("native", "DYPER_SAMPLER=native")
        end = time.monotonic() + 20
        while a.samples_taken < 40 and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.3)
        counts = dict(a.counts)
        tables = a.tables
        assert a.samples_taken >= 40
        names = Counter()
        for (tid, stack), n in list(counts.items()):
            if tid in {t.ident for t in spinners} and stack:
                row = tables.loc_rows[stack[0]]
                names[(tables.string_rows[row[1]][1], tables.string_rows[row[2]][1])] += n
        # two threads sharing the GIL: one of them waits for it most of the time
        assert names[(STATE_FILE, GIL_WAIT)] > 0, names
        assert names[(__file__, "_spin")] > 0, names
    finally:
        agent.stop()
        stop.set()
        for t in spinners:
            t.join()
    assert not native.stats()["running"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_starts_its_own_sampler() -> None:
    import warnings

    native.start(threading.get_ident(), -1)
    native.set(0.001, 0.25)
    try:
        time.sleep(0.02)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, use of fork()"
            pid = os.fork()
        if pid == 0:  # the child: no sampler thread, an empty ring, and a fresh start works
            ok = not native.stats()["running"] and native.stats()["queued"] == 0
            ticks = native.stats()["ticks"]
            native.start(threading.get_ident(), -1)
            native.set(0.001, 0.25)
            time.sleep(0.05)
            native.stop()
            os._exit(0 if ok and native.stats()["ticks"] > ticks else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        native.stop()
        native.drain({}, {}, lambda *a: 0)
