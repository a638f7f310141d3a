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
from collections.abc import Callable

_read: Callable[[str, int], bytes] | None
try:
    _read = importlib.import_module("dyper.agent._fastsample").proc_read
except (ImportError, AttributeError):  # not built for this interpreter, or not Linux
    _read = None

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


def rss_bytes() -> int | None:
    """This process's resident set size from /proc/self/statm (one small read), or None where there is none."""
    try:
        return int(read("/proc/self/statm").split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def app_threads(skip: int) -> dict[int, int]:
    """Python ident -> kernel thread id (its /proc/self/task entry) of the application's threads.

    The threads ``threading`` knows, less ``skip`` (the caller's own) and
    dyper's (named ``dyper-...``).
    """
    active = threading._active  # type: ignore[attr-defined]  # read-only
    return {
        ident: t.native_id
        for ident, t in list(active.items())
        if ident != skip and t.native_id is not None and not t.name.startswith("dyper-")
    }
