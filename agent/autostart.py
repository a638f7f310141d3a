"""Start the agent when a process starts, from its environment.

Two ways in, both ending here:

* ``dyper_autostart.pth``, which installing dyper puts in site-packages: any
  Python process of that environment whose environment has ``DYPER_MONITOR``
  calls :func:`run` at start-up (``DYPER_AUTOSTART=0`` turns it off). The line
  in the .pth file reads the environment only, so processes without
  ``DYPER_MONITOR`` pay an ``os.environ`` lookup and nothing else.
* ``dyper run``'s ``sitecustomize`` (monitor/autostart), for interpreters
  where dyper is importable but not installed (a bare interpreter with
  dyper on ``PYTHONPATH``).

Settings: ``DYPER_MONITOR`` (endpoint), ``DYPER_BUDGET`` (default 1%),
``DYPER_PROFLETS``, ``DYPER_SERVICE`` (see :func:`agent.start`), and
``DYPER_MONITOR_PID``, which ``dyper run`` sets (:mod:`agent.lifeline`).
"""

from __future__ import annotations

import itertools
import os
import sys


def run() -> None:
    """Start the agent as the environment says; never raise into the program starting up."""
    if not os.environ.get("DYPER_MONITOR") or os.environ.get("DYPER_AUTOSTART", "1") == "0" or _is_dyper_cli():
        return
    try:
        from dyper import agent
        from dyper.agent.lifeline import monitor_pid_from_env

        # Read here, not by start(): an agent attached later into this process (its environment
        # still saying so) streams to a standing monitor and must not leave with dyper run's.
        agent.start(monitor_pid=monitor_pid_from_env())
    except Exception as exc:  # the program must run even if profiling cannot
        message = f"dyper: agent not started in pid {os.getpid()} ({sys.executable}): {exc}\n"
        errfile = os.environ.get("DYPER_ERRFILE")
        try:
            if errfile:
                with open(errfile, "a") as f:
                    f.write(message)
            else:
                sys.stderr.write(message)
        except OSError:
            pass


def _is_dyper_cli() -> bool:
    """The ``dyper`` command itself (``dyper ...``, ``python -m dyper ...``): not what the user profiles."""
    argv = getattr(sys, "orig_argv", None) or getattr(sys, "argv", None) or []
    script = os.path.basename(sys.argv[0]) if getattr(sys, "argv", None) else ""
    if script in ("dyper", "dyper.exe"):
        return True
    return any(a == "-m" and b in ("dyper", "dyper.monitor") for a, b in itertools.pairwise(argv))
