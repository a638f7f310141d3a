"""Proflets: the analyses, one module each, found through an entry-point group.

A proflet module defines ``COLLECTOR`` (an :class:`agent.proflet.Collector`
subclass, run in the target; None if the proflet needs nothing there) and
``ANALYZER`` (a :class:`proflets.base.Analyzer` subclass, run in the
monitor), and is registered in its distribution's metadata::

    [project.entry-points."dyper.proflets"]
    slowsql = "myapp.slowsql"

The built-ins register the same way (see pyproject.toml). They are also
known here by name (:data:`BUILTINS`, the same table: a test holds it to
pyproject.toml's entry points), so an agent whose dyper is on ``sys.path``
without its metadata (``dyper attach`` into another interpreter) still
finds them, and an agent asking only for built-ins reads no metadata.

Both halves import this module, so it stays free of anything heavy.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType
from typing import Final

GROUP: Final = "dyper.proflets"
BUILTINS: Final = {
    "cpu": "dyper.proflets.cpu",
    "threads": "dyper.proflets.threads",
    "timing": "dyper.proflets.timing",
    "heap": "dyper.proflets.heap",
    "io": "dyper.proflets.io",
    "memory": "dyper.proflets.memory",
    "memory_stacks": "dyper.proflets.memory_stacks",
    "tasks": "dyper.proflets.tasks",
}


def available(wanted: Iterable[str] | None = None) -> dict[str, str]:
    """Proflet name -> module, the built-ins first, then what is installed.

    When every name in ``wanted`` is a built-in, installed metadata is not
    read: that takes a file read per distribution, and in an agent's thread
    behind a busy application each costs up to a GIL switch interval.
    """
    found = dict(BUILTINS)
    if wanted is not None and all(name in BUILTINS for name in wanted):
        return found
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group=GROUP):
            found.setdefault(ep.name, ep.value.split(":")[0].strip())
    except Exception:  # broken metadata somewhere on sys.path must not stop profiling
        pass
    return found


def load(name: str, module: str | None = None) -> ModuleType:
    """Import the proflet module ``name`` (raises ImportError/KeyError if it is not there)."""
    if module is None:
        module = available()[name]
    return importlib.import_module(module)
