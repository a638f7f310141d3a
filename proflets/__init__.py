"""Proflets: the analyses, one package each, found through an entry-point group.

A proflet is a package registered in its distribution's metadata::

    [project.entry-points."dyper.proflets"]
    slowsql = "myapp.slowsql"

holding up to three parts, each loaded only where it runs:

- ``collector`` defines ``COLLECTOR`` (an :class:`dyper.agent.proflet.Collector`
  subclass): what runs in the target, which imports this module alone, never
  the other parts;
- ``analyzer`` defines ``ANALYZER`` (a :class:`dyper.proflets.base.Analyzer`
  subclass): what runs in the monitor;
- ``render`` (optional) shows the analyzer's results: ``terminal()`` for
  ``dyper report`` and ``TABLES``, the dashboard's description of its tables
  (:mod:`dyper.proflets.display`); without it the generic renderer shows them.

A part a package lacks is looked up on the package itself, so a single module
defining ``COLLECTOR`` and ``ANALYZER`` is a proflet too (the older form).

The built-ins register the same way (see pyproject.toml). They are also
known here by name (:data:`BUILTINS`, the same table: a test holds it to
pyproject.toml's entry points), so an agent whose dyper is on ``sys.path``
without its metadata (``dyper attach`` into another interpreter) still
finds them, and an agent asking only for built-ins reads no metadata.

Both halves import this module, so it stays free of anything heavy.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Final

GROUP: Final = "dyper.proflets"
#: The environment's form of ``--proflets`` (see :func:`parse_selection`).
ENV: Final = "DYPER_PROFLETS"
#: What ``--proflets`` and ``$DYPER_PROFLETS`` take, for every command's help.
SELECTION_HELP: Final = (
    "a comma-separated list: names (cpu,threads: those only), all (every registered proflet), "
    "-NAME to leave one out and +NAME to add one (-heap: the default set less heap; all,-heap), "
    "empty for sampling only"
)
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


#: The parts of a proflet package (see the module's docstring).
PARTS: Final = ("collector", "analyzer", "render")


def load(name: str, module: str | None = None, part: str | None = None) -> ModuleType:
    """Import the proflet ``name`` (raises ImportError/KeyError if it is not there), or only its ``part``.

    ``part`` is one of :data:`PARTS`: a package's module of that name, or the
    proflet's own module when it has none (a single-module proflet, or a
    package without that part, e.g. no collector for a monitor-only proflet).
    """
    if module is None:
        module = available()[name]
    top = importlib.import_module(module)
    if part is None or not hasattr(top, "__path__"):
        return top
    if part not in PARTS:
        raise ValueError(f"{part!r} is not a part of a proflet ({', '.join(PARTS)})")
    try:
        return importlib.import_module(f"{top.__name__}.{part}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{top.__name__}.{part}":
            raise  # the part is there but imports something that is not
        return top


_ENTRY = re.compile(r"[+-]?[A-Za-z_][A-Za-z0-9_.-]*")


def parse_selection(text: str) -> tuple[str, ...]:
    """``--proflets``/``$DYPER_PROFLETS`` text as entries: ``"all, -heap"`` -> ``("all", "-heap")``.

    Each entry is a proflet name, ``all``, ``-NAME`` (leave it out) or
    ``+NAME`` (add it); empty text is sampling only. Raises ValueError (one
    line) for an entry that is none of these. Names are checked against the
    registry by :func:`unknown`, not here: the agent reads this too.
    """
    entries = tuple(e for e in (part.strip() for part in text.split(",")) if e)
    for entry in entries:
        if not _ENTRY.fullmatch(entry) or (entry.lstrip("+-") == "all" and entry != "all"):
            raise ValueError(f"proflets {text!r}: {entry!r} is not a proflet name, all, -NAME or +NAME")
    return entries


def select(entries: Iterable[str], default: Iterable[str], registered: Callable[[], Iterable[str]]) -> tuple[str, ...]:
    """The proflets ``entries`` (from :func:`parse_selection`) choose, in order.

    The base is every registered proflet if ``all`` is among them, else the
    ``default`` set when every entry is ``-NAME``/``+NAME``, else nothing;
    names and ``+NAME`` add to it, ``-NAME`` leaves out (whatever the order).
    ``registered`` is called only for ``all``: it may read distribution metadata.
    """
    entries = tuple(entries)
    chosen: dict[str, None] = {}
    if "all" in entries:
        chosen.update(dict.fromkeys(registered()))
    elif entries and all(e[0] in "+-" for e in entries):
        chosen.update(dict.fromkeys(default))
    for entry in entries:
        if entry != "all" and entry[0] != "-":
            chosen[entry.lstrip("+")] = None
    for entry in entries:
        if entry[0] == "-":
            chosen.pop(entry[1:], None)
    return tuple(chosen)


def unknown(entries: Iterable[str]) -> list[str]:
    """The names among ``entries`` that no installed proflet has (reads metadata only for a non-built-in)."""
    names = [e.lstrip("+-") for e in entries if e != "all"]
    known = available(names)
    return [n for n in names if n not in known]
