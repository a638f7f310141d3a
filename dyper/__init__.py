"""dyper: a low-overhead profiling agent for long-running Python services.

From inside a program (or a container's entry point)::

    import dyper
    dyper.start(monitor="tcp://127.0.0.1:7341", budget="1%")
    dyper.mark("cache warm")          # a labelled point on the timeline

    @dyper.tag("checkout")            # samples taken inside carry the tag
    def checkout(request): ...

    dyper.stop()                      # leaves the process as it was

These are :mod:`dyper.agent`'s functions; each does nothing when no agent
runs. The subpackages: :mod:`dyper.agent` (runs in the target),
:mod:`dyper.proflets` (the analyses), :mod:`dyper.monitor` (DYMON and the
``dyper`` command). Importing this package is cheap: ZeroMQ, msgpack and the
sampler load on ``start``.
"""

from __future__ import annotations

import os

# In an installed wheel the subpackages sit in this folder. In a source tree
# (an editable install, or a target that ``dyper attach`` handed the checkout
# to) they are this folder's siblings: agent/, monitor/, proflets/.
_here = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_here, "agent")):
    __path__.append(os.path.dirname(_here))

from dyper.agent import (  # noqa: E402 -- after __path__ is complete
    DEFAULT_MONITOR,
    agent_id,
    boost,
    is_running,
    mark,
    pause,
    reset,
    resume,
    set_budget,
    start,
    stop,
    tag,
    trigger,
)

__all__ = [
    "DEFAULT_MONITOR",
    "agent_id",
    "boost",
    "is_running",
    "mark",
    "pause",
    "reset",
    "resume",
    "set_budget",
    "start",
    "stop",
    "tag",
    "trigger",
]
