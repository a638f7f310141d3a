"""The threads proflet: what each thread does, and who blocks whom (DYPER section 5.4).

Basic analysis, per thread, from samples: running, blocked on a lock,
waiting (condition, event, queue, join), in I/O, sleeping, and probably
waiting for the GIL. What a sample's leaf is doing comes from its location
flags (``agent.tables.wait_kind``: which call the instruction makes). A
sample cannot tell running from ready-to-run, because the sampler holds the
GIL while it samples: every thread that is not waiting looks the same. So
the collector reports each thread's CPU clock, and the analyzer splits the
not-waiting share: the part the CPU clock accounts for ran; the rest was
ready to run but did not, which for a Python thread is mostly the GIL.

Who blocks whom: when a thread is blocked entering a lock whose owner is
known (an RLock, or a Condition built on one), the collector reads the
owner from the lock, by following the names the blocked instruction loads
(``with self._lock:``) through plain attribute dictionaries, never running
the application's code.

Detailing: the kernel's own figures for every thread over a burst, from
``/proc/self/task/*/schedstat`` and ``status``: CPU time, time runnable but
waiting for a processor, and voluntary and involuntary context switches
(each voluntary switch is one wait, block, sleep or I/O).
"""

from typing import Final

#: The proflet's name. Its entry point names this package: the agent imports
#: ``.collector`` (COLLECTOR), the monitor ``.analyzer`` (ANALYZER) and ``.render``.
NAME: Final = "threads"
