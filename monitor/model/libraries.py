"""Library code: files of the standard library or of installed packages, by the target's sysconfig paths.

Imported in the target too (the io proflet's collector names its routines
with it), so it stays free of anything but the standard library.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

#: The sysconfig paths (``sysconfig.get_paths()`` keys) under which code is library code.
LIBRARY_PATHS = ("stdlib", "platstdlib", "purelib", "platlib")


def library_roots(paths: Mapping[str, str]) -> tuple[str, ...]:
    """The standard library's and installed packages' directories (sysconfig paths), longest first."""
    roots = {os.path.normpath(p) + os.sep for k, p in paths.items() if k in LIBRARY_PATHS and p}
    return tuple(sorted(roots, key=len, reverse=True))


def library_predicate(paths: Mapping[str, str]) -> Callable[[str], bool]:
    """True for files of the standard library or installed packages (``paths``: the target's sysconfig paths)."""
    roots = library_roots(paths)

    def is_library(file: str) -> bool:
        return file.startswith("<frozen") or file.startswith(roots)

    return is_library
