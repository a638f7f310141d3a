"""The memory_stacks proflet: allocation sites with their callers (DYPER section 5.3, the costly mode).

The memory proflet's second detailing mode, scheduled as a proflet of its
own as DYPER does, so that the scheduler runs it less often than the cheap
one: tracemalloc with NFRAME frames per allocation instead of one. Each
site comes with the callers that led to it, which tells which caller of a
shared helper allocates. It has no basic analysis of its own (the memory
proflet's GC and RSS figures are the basic analysis of both); its priority
is half of the memory proflet's, since it only adds callers to sites the
cheap mode finds.

A separate name rather than a setting of ``memory``: the scheduler's unit is
the proflet, with its own costs, priority and burst queue.
"""

from typing import Final

#: The proflet's name. Its entry point names this package: the agent imports
#: ``.collector`` (COLLECTOR), the monitor ``.analyzer`` (ANALYZER) and ``.render``.
NAME: Final = "memory_stacks"
