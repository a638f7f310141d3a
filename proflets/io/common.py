"""What both halves of the io proflet use (see :mod:`dyper.proflets.io`)."""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# --- the resource file -------------------------------------------------------------------


#: the application's own routine files, separated by os.pathsep
ENV = "DYPER_IO_ROUTINES"
SHIPPED = Path(__file__).with_name("io_routines.toml")
#: kind of a call the agent's tables judge to be I/O that no file lists
OTHER_KIND = "io"


@dataclass(frozen=True)
class Routines:
    """The I/O routines of the resource files: what a name or a function is, if it is I/O."""

    #: C routine name -> its kind (the table listing it first)
    calls: Mapping[str, str]
    #: (pattern, kind, the pattern as a whole name, the pattern as the end of a dotted path)
    functions: tuple[tuple[str, str, re.Pattern[str], re.Pattern[str]], ...]
    #: the files read, shipped first
    files: tuple[str, ...]

    def call(self, callee: str) -> tuple[str, str] | None:
        """(routine, kind) of a call of ``callee`` from Python, if it is listed."""
        kind = self.calls.get(callee)
        return (f"{kind}.{callee}", kind) if kind is not None else None

    def function(self, dotted: str, library: bool) -> tuple[str, str] | None:
        """(routine, kind) of the Python function ``dotted`` (module.qualname), if it is listed.

        A library function's module is known from its path, so its name must
        match whole; an application file's module is not (it depends on how
        the application is run), so a listed name may match the end of its
        dotted path ("db.Client.query" for .../myapp/db.py, Client.query).
        """
        for _, kind, whole, tail in self.functions:
            if whole.match(dotted):
                return dotted, kind
            if not library:
                m = tail.match(dotted)
                if m is not None:
                    return m.group("name"), kind
        return None


def _strings(table: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where}: {key} must be a list of names")
    return value


def load_routines(extra: Iterable[str | os.PathLike[str]] = ()) -> Routines:
    """The shipped routines, then those of ``extra`` files added (raises ValueError or OSError on a bad file)."""
    calls: dict[str, str] = {}
    functions: list[tuple[str, str, re.Pattern[str], re.Pattern[str]]] = []
    files = [str(SHIPPED), *(os.fspath(p) for p in extra)]
    for path in files:
        with open(path, "rb") as f:
            try:
                doc = tomllib.load(f)
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{path}: {exc}") from None
        for kind, table in doc.items():
            if not isinstance(table, dict):
                raise ValueError(f"{path}: {kind} must be a table ([{kind}])")
            unknown = set(table) - {"calls", "functions"}
            if unknown:
                raise ValueError(f"{path}: [{kind}] has unknown keys {sorted(unknown)} (calls, functions)")
            for name in _strings(table, "calls", f"{path} [{kind}]"):
                calls.setdefault(name, kind)
            for pattern in _strings(table, "functions", f"{path} [{kind}]"):
                rx = fnmatch.translate(pattern)
                functions.append((pattern, kind, re.compile(rx), re.compile(rf"(?:.*\.)?(?P<name>{rx})")))
    return Routines(calls, tuple(functions), tuple(files))


_loaded: dict[str, Routines] = {}


def routines() -> Routines:
    """The routines of the shipped file and of the files ``$DYPER_IO_ROUTINES`` names (read once per value)."""
    extra = os.environ.get(ENV, "")
    got = _loaded.get(extra)
    if got is None:
        got = _loaded[extra] = load_routines(p for p in extra.split(os.pathsep) if p)
    return got


# --- naming frames -----------------------------------------------------------------------


def _dotted_path(relative: str) -> str:
    stem = relative[:-3] if relative.endswith(".py") else relative
    parts = [p for p in stem.split(os.sep) if p]
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def dotted_name(file: str, qualname: str, roots: Sequence[str]) -> tuple[str, bool]:
    """(module.qualname, whether the file is library code) of a function."""
    if file.startswith("<frozen ") and file.endswith(">"):
        return f"{file[8:-1]}.{qualname}", True
    for root in roots:
        if file.startswith(root):
            return f"{_dotted_path(file[len(root) :])}.{qualname}", True
    return f"{_dotted_path(file)}.{qualname}", False


@dataclass(frozen=True)
class Hit:
    """Where a stack is doing I/O. Indexes are into the stack, root first."""

    routine: str
    kind: str
    #: the routine's frame; for a C routine, the frame calling it (the leaf)
    at: int
    #: the application frame that called the routine (the nearest library frame if there is none)
    caller: int
    #: the frame whose call instruction enters the routine (None: the thread began in it)
    site: int | None
    #: the routine is a C routine called by the leaf
    c_call: bool


def classify(
    functions: Sequence[tuple[str, str] | None],
    leaf_call: tuple[str, str] | None,
    library: Sequence[bool] | None = None,
) -> Hit | None:
    """The I/O a stack is doing, if any.

    ``functions``: per frame, root first, the listed Python routine it is
    (routine, kind) or None; ``leaf_call``: the listed C routine the leaf
    frame is calling, or None; ``library``: per frame, whether it is library
    code (None: all are, so the caller is the routine's nearest caller).
    """
    n = len(functions)
    for i, found in enumerate(functions):
        if found is not None:
            (routine, kind), at, site, c_call = found, i, (i - 1 if i > 0 else None), False
            break
    else:
        if leaf_call is None or n == 0:
            return None
        (routine, kind), at, site, c_call = leaf_call, n - 1, n - 1, True
    # A C routine is called by its own frame; a Python routine by the frame above it.
    start = at if c_call else at - 1
    caller = max(start, 0)
    if library is not None:
        for j in range(start, -1, -1):
            if not library[j]:
                caller = j
                break
    return Hit(routine, kind, at, caller, site, c_call)


# --- /proc I/O counters ----------------------------------------------------------------

#: what /proc/<pid>/io counts: bytes through read/write-like calls (files, sockets, pipes),
#: those calls, and bytes that reached the storage layer
IO_FIELDS = ("rchar", "wchar", "syscr", "syscw", "read_bytes", "write_bytes")
