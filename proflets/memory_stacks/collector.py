"""The memory_stacks proflet's agent half, loaded alone in the target (see :mod:`dyper.proflets.memory_stacks`)."""

from __future__ import annotations

from dyper.proflets.memory.collector import AllocationSites


class StacksCollector(AllocationSites):
    """Allocation sites with up to NFRAME frames of stack, for a burst."""

    name = "memory_stacks"
    # Measured: 38 to 59 ms a burst of planted_memory.py, the first one
    # calibrating (allocation traced with eight frames is slow), and names
    # looked up for every frame.
    OVHD_MS = 60.0
    # Measured: the cheapest allocating statement runs 25 to 80 times slower
    # traced with eight frames from a shallow stack, 70 to 300 times from the
    # agent's thread: a CPU-bound process loses nearly all of the burst.
    SLOW = 30.0
    ITVL_MS = 500.0
    PRTY = 0.15
    NFRAME = 8


COLLECTOR = StacksCollector
