"""The cpu proflet: where the program executes (DYPER section 5.1).

Basic analysis, from stack samples: the share of samples per function and
per line, self (the leaf) and total (anywhere on the stack, once per stack
however deep the recursion), only above a floor (0.5% by default, as DYPER
does: below that a sampling profile is noise), and optionally with time in
the standard library and installed packages charged to the application line
that called it.

The basic analysis's agent half is the sampler itself (``agent.core``).
Detailing is :class:`CpuCollector`: exact call and line counts of the
candidate functions (the hottest by self samples) for a short burst, which
the monitor extrapolates to rates. It is selective: only the candidates'
code objects are instrumented, through ``sys.monitoring`` local events on
3.12+. 3.11 has no ``sys.monitoring``; there a PEP 523 frame evaluation hook
in C (``agent._fastsample.frame_hook_start``) sees every Python frame start
and counts the candidates' calls, at a C call per Python call, and the bytecode
between calls runs as fast as ever. Without the C extension, 3.11 falls back
on yappi, whose profile function slows every instruction of every thread; its
(much larger) slowdown is measured and charged, and cpu detailing is then opt-in.
"""

from typing import Final

#: The proflet's name. Its entry point names this package: the agent imports
#: ``.collector`` (COLLECTOR), the monitor ``.analyzer`` (ANALYZER) and ``.render``.
NAME: Final = "cpu"
