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
