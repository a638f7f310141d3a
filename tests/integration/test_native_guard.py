"""The native sampler's guarded copies (agent/_native.c): a fault in them is ours, any other is the application's.

The sampler thread copies the interpreter's memory with memcpy under its own
SIGSEGV/SIGBUS handlers, which bring a fault in that copy back as a failed
read. Whatever else faults must end the process exactly as it would without
us: faulthandler's traceback, then death by SIGSEGV. Each case runs in a real
subprocess that crashes for real.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

native: Any
try:
    native = importlib.import_module("dyper.agent._native")
except ImportError:
    native = None

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(native is None, reason="no native sampler for this interpreter"),
]

PRELUDE = """
import ctypes, faulthandler, sys, threading, time
from dyper.agent import _native as native

def sampling(seconds=0.2):
    native.set(0.001, 0.25)
    time.sleep(seconds)
"""


def crash(body: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = PRELUDE + textwrap.dedent(body)
    full_env = {**os.environ, **(env or {})}
    full_env.pop("PYTHONFAULTHANDLER", None)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=full_env, check=False
    )


def test_a_fault_in_our_copy_is_a_failed_read() -> None:
    handlers_before = native.stats()["guarded"]
    assert native.guard_probe() is True
    assert native.stats()["guarded"] == handlers_before == 0  # removed again


def test_the_sampler_copies_under_its_guard_and_removes_it() -> None:
    native.start(threading.get_ident())
    try:
        native.set(0.001, 0.25)
        time.sleep(0.1)
        s = native.stats()
        assert s["guarded"] == 1 and s["ticks"] > 0
    finally:
        native.stop()
    assert native.stats()["guarded"] == 0
    native.drain({}, {}, lambda *a: 0)


def test_an_application_fault_reaches_faulthandler_as_without_us() -> None:
    out = crash("""
        faulthandler.enable()
        native.start(threading.get_ident())
        sampling()
        assert native.stats()["guarded"] == 1
        ctypes.string_at(0)
    """)
    assert out.returncode == -signal.SIGSEGV, out
    assert "Fatal Python error: Segmentation fault" in out.stderr, out.stderr


def test_an_application_fault_without_faulthandler_kills_by_sigsegv() -> None:
    out = crash("""
        native.start(threading.get_ident())
        sampling()
        def fault():
            ctypes.string_at(0)
        t = threading.Thread(target=fault)
        t.start()
        t.join()
        print("survived")
    """)
    assert out.returncode == -signal.SIGSEGV, out
    assert "survived" not in out.stdout


def test_a_handler_installed_over_ours_is_kept_and_the_sampler_reads_by_system_call() -> None:
    # faulthandler enabled after the sampler started stands over our handler
    # (and calls it after its traceback). The sampler goes on without its
    # guard; a second start leaves the chain as it is; a fault still ends
    # the process with the traceback, without looping between the two.
    out = crash("""
        native.start(threading.get_ident())
        sampling()
        faulthandler.enable()
        s0 = native.stats()
        sampling()
        s1 = native.stats()
        assert s1["guarded"] == 0 and s1["ticks"] > s0["ticks"], (s0, s1)
        assert s1["guard_off_ticks"] > s0["guard_off_ticks"], (s0, s1)
        native.stop()
        native.start(threading.get_ident())
        sampling()
        assert native.stats()["guarded"] == 0
        print("sampled", flush=True)
        ctypes.string_at(0)
    """)
    assert "sampled" in out.stdout, out
    assert out.returncode == -signal.SIGSEGV, out
    assert "Fatal Python error: Segmentation fault" in out.stderr, out.stderr


def test_system_call_reads_when_asked() -> None:
    out = crash(
        """
        assert native.guard_probe() is False
        native.start(threading.get_ident())
        sampling()
        s = native.stats()
        assert s["guarded"] == 0 and s["ticks"] > 0 and s["guard_off_ticks"] == s["ticks"], s
        native.stop()
        print("ok")
        """,
        env={"DYPER_NATIVE_READS": "syscall"},
    )
    assert out.returncode == 0 and "ok" in out.stdout, out
