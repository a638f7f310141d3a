"""The io proflet: time in I/O, by routine and by the application routine that called it (DYPER section 5.2).

What counts as I/O comes from a resource file, :file:`io_routines.toml`,
which an application extends with its own (``DYPER_IO_ROUTINES``, see
:func:`routines`). It lists C routines by the name a Python line calls them
with (``recv``, ``select``, ``read``...) and Python functions by module and
qualified name (``ssl.SSLSocket.read``, ``selectors.*.select``).

Basic analysis, from samples, mostly in the monitor: a thread is doing I/O
when a listed Python function is on its stack (the outermost names the
routine: what the application asked for), or else when its innermost Python
frame is calling a listed C routine (``socket.recv_into``). Only the agent
can tell what a frame's instruction calls, so the collector sends the
callee of each I/O leaf it sees. The caller is the first application frame
above the routine (standard library and installed packages skipped, as the
cpu proflet charges library time to the application line that called it).
Shares are of all the application threads' samples, and per thread.

Detailing, over a burst: how often the busiest routines are called, and how
long each call of a C routine takes, counted at their call sites only (the
line that enters the routine, as the samples show it): on 3.12+ through
``sys.monitoring`` CALL events local to the call sites' code objects, with
every other call instruction there switched off at its first event
(``DISABLE``), and C_RETURN to time C calls; on 3.11, which has no such
hook, through yappi, which slows every call, so only when the proflet is
named. Both slowdowns are calibrated and charged. Also the bytes each
thread read and wrote over the burst (``/proc/self/task/*/io``); the
process's own counters come with every report (``/proc/self/io``, the
agent's own threads left out).
"""

from typing import Final

#: The proflet's name. Its entry point names this package: the agent imports
#: ``.collector`` (COLLECTOR), the monitor ``.analyzer`` (ANALYZER) and ``.render``.
NAME: Final = "io"
