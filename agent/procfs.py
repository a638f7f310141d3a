"""Small reads of this process's own /proc files, for collector hooks.

``open()`` and ``os.read()`` release the GIL around every system call; behind
busy threads each one costs a GIL hand-off (up to a switch interval, 5 ms,
times the threads queueing). A hook that reads a few files per thread then
takes seconds of wall time and costs the application a switch per call. The
C extension reads them with the GIL held (microseconds: /proc never waits on
a device); without it, the reads fall back to ``os`` and release it.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable

_read: Callable[[str, int], bytes] | None
_thread_ids: Callable[[], list[tuple[int, int]]] | None
try:
    _fast = importlib.import_module("dyper.agent._fastsample")
    _read, _thread_ids = _fast.proc_read, _fast.thread_ids
except (ImportError, AttributeError):  # not built for this interpreter, or not Linux
    _read = _thread_ids = None

#: True when reads keep the GIL.
HOLDS_GIL = _read is not None


def read(path: str, limit: int = 4096) -> bytes:
    """Up to ``limit`` bytes of a /proc file (raises OSError as open() would)."""
    if _read is not None:
        return _read(path, limit)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def thread_cpu_s(native_id: int) -> float | None:
    """CPU seconds of one of this process's threads, from its kernel thread id.

    The thread's CPU clock id is built from its id the way glibc's
    pthread_getcpuclockid does; unlike a pthread handle, a stale id gives an
    error, never a crash.
    """
    try:
        return time.clock_gettime((~native_id << 3) | 6)
    except (OSError, OverflowError):
        return None


def rss_bytes() -> int | None:
    """This process's resident set size from /proc/self/statm (one small read), or None where there is none."""
    try:
        return int(read("/proc/self/statm").split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


#: (pid, ident) of the main thread found last (see main_ident)
_main: tuple[int, int | None] = (0, None)


def main_ident() -> int | None:
    """threading's ident of this process's main thread (the one whose kernel id is the process's), None if unknown.

    threading takes the thread that first imports it for the main one. Under
    ``dyper attach`` in a program that never imported it, that is the injected
    thread, gone since: the real main thread is then unknown to threading,
    unnamed, and its CPU clock unread (a CPU-bound single-threaded service was
    reported waiting for the GIL all the time). The thread states say which it is.
    """
    global _main
    pid = os.getpid()
    if _main[0] != pid:  # first call, or a fork: the child's main thread is the one that forked
        main = threading.main_thread()
        found: int | None = main.ident if main.native_id == pid else None
        if found is None and _thread_ids is not None:
            found = next((ident for ident, native in _thread_ids() if native == pid), None)
        _main = (pid, found)
    return _main[1]


def app_threads(skip: int) -> dict[int, int]:
    """Python ident -> kernel thread id (its /proc/self/task entry) of the application's threads.

    The threads ``threading`` knows, less ``skip`` (the caller's own) and
    dyper's (named ``dyper-...``), and the main thread whether it knows it or
    not (see main_ident).
    """
    active = threading._active  # type: ignore[attr-defined]  # read-only
    pid = os.getpid()
    out = {
        ident: t.native_id
        for ident, t in list(active.items())
        if ident != skip
        and t.native_id is not None
        and not t.name.startswith("dyper-")
        # threading's "main thread" when it is not: the thread that imported it, long gone
        and not (t is threading.main_thread() and t.native_id != pid)
    }
    main = main_ident()
    if main is not None and main != skip:
        out[main] = pid
    return out
