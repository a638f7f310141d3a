"""dyper autostart: start the agent at interpreter start-up.

``dyper run`` puts this directory first on PYTHONPATH, so every Python
process the command starts (a script, ``-m module``, a console script such as
gunicorn, and their Python children) starts dyper's agent pointed at the
monitor in ``DYPER_MONITOR`` with the budget in ``DYPER_BUDGET``. The
sitecustomize module it shadows, if any, still runs.
"""

import os
import sys


def _dyper_chain(here: str) -> None:
    # Run the sitecustomize that this one shadows, as the site module would have.
    import importlib.machinery
    import importlib.util

    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _dyper_autostart() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        _dyper_chain(here)
    finally:
        while here in sys.path:
            sys.path.remove(here)
    if not os.environ.get("DYPER_MONITOR"):
        return
    try:
        import dyper.agent.autostart
    except ImportError as exc:  # the program must run even if profiling cannot
        sys.stderr.write(f"dyper: agent not importable in pid {os.getpid()} ({sys.executable}): {exc}\n")
        return
    dyper.agent.autostart.run()


_dyper_autostart()
