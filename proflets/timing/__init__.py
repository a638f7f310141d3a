"""The timing proflet: how much parallelism the process has and gets (DYPER section 5.5).

Basic analysis: the number of active threads per sample (running or ready
to run: not waiting on a lock, a condition, I/O or sleep), its mean and
standard deviation, against the processors the process may use; and each
thread's CPU time, read from its CPU clock at every report, so
``cores_used`` (CPU seconds per wall second) is exact, not extrapolated.
When several threads are ready to run but the process gets about one core,
they are waiting for the GIL: the report says so in words.

The per-sample count of active threads is made by the agent's walker as it
records each sample (``WANTS_ACTIVITY``): a histogram, cumulative, so a lost
report loses nothing.

Detailing: for a burst, the kernel's run-queue figures per thread
(``/proc/self/task/*/schedstat``): how long threads were runnable but had
no processor. That tells a machine short of CPUs (run-queue waits) from a
process short of GIL (no run-queue wait, yet no CPU either).
"""

from typing import Final

#: The proflet's name. Its entry point names this package: the agent imports
#: ``.collector`` (COLLECTOR), the monitor ``.analyzer`` (ANALYZER) and ``.render``.
NAME: Final = "timing"
