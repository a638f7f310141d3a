"""What both halves of the tasks proflet use (see :mod:`dyper.proflets.tasks`)."""

from __future__ import annotations

import os
from typing import Any

#: A callback running this long or longer blocks the loop (asyncio's own slow_callback_duration).
BLOCK_S = float(os.environ.get("DYPER_LOOP_BLOCK_MS", "100")) / 1000.0


def _accumulate(into: dict[Any, list[float]], key: Any, wall: float, cpu: float, limit: int) -> float:
    """Add [wall, cpu] under ``key``; a new key past ``limit`` keys is not kept: returns the wall time dropped."""
    row = into.get(key)
    if row is None:
        if len(into) >= limit:
            return wall
        row = into[key] = [0.0, 0.0]
    row[0] += wall
    row[1] += cpu
    return 0.0
