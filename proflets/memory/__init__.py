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

Detailing, in two modes scheduled as two proflets as DYPER does. This one
samples allocations: a hook over the object and memory allocators (C, in
``agent._fastsample``) counts every allocation and records the allocating
line at a Poisson process over the bytes (one sample per 256 kB on average),
so a site's rate is what it allocated during the burst, temporaries
included, estimated from the samples and scaled to the exact counts. It
slows allocation-heavy code by a few percent, so its bursts last seconds
and see the threads that hold the GIL part of the time. Where the C
extension is missing it falls back to tracemalloc with one frame: what was
allocated during the burst and is still alive at its end, ten times slower
and so in bursts of milliseconds. ``memory_stacks``
(:mod:`proflets.memory_stacks`) traces with several frames through
tracemalloc (the line and its callers, live at the burst's end, costly, so
the scheduler runs it less often). tracemalloc is off again after each
burst; if the application traces already, its tracing is left alone and the
burst is skipped (with the reason in the report).

Priority, as DYPER's: from how much GC counts and memory change over the
last 50 reports.
"""

from typing import Final

#: The proflet's name. Its entry point names this package: the agent imports
#: ``.collector`` (COLLECTOR), the monitor ``.analyzer`` (ANALYZER) and ``.render``.
NAME: Final = "memory"
