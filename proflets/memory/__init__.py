"""The memory proflet: memory size, garbage collections and allocation sites (DYPER section 5.3).

Basic analysis, at every report: the resident set size, collections per
generation (``gc.get_stats``), and every collection's pause, timed by a
``gc.callbacks`` callback and charged to the code that triggered it: the
line the collecting thread was running when the collection started (an
allocation past the threshold, or a ``gc.collect()`` call). This is "GC cost
by allocation site", the Python counterpart of Paradyn-J's object-creation
overhead per method. The callback runs in the application's threads at
every collection, so it does the least it can: two clock reads, the calling
frame's code and line as the key, a few increments in a bounded table.

Detailing, in two modes scheduled as two proflets as DYPER does: this one
traces allocations with one frame (the allocating line, cheap), and
``memory_stacks`` (:mod:`proflets.memory_stacks`) with several frames (the
line and its callers, costly, so the scheduler runs it less often). Both use
tracemalloc for a burst: count and bytes per site of the blocks allocated
during the burst and still alive at its end, extrapolated to rates.
tracemalloc only knows live blocks, so temporaries freed within the burst
are not seen; their churn shows in the basic analysis, as young collections
charged to the line that allocates them. tracemalloc is off again after
each burst; if the application traces already, its tracing is left alone
and the burst is skipped (with the reason in the report).

Priority, as DYPER's: from how much GC counts and memory change over the
last 50 reports.
"""

from typing import Final

#: The proflet's name. Its entry point names this package: the agent imports
#: ``.collector`` (COLLECTOR), the monitor ``.analyzer`` (ANALYZER) and ``.render``.
NAME: Final = "memory"
