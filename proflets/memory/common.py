"""What both halves of the memory proflet use (see :mod:`dyper.proflets.memory`)."""

from __future__ import annotations

#: Reports the priority looks back over (DYPER: "the last fifty reports").
PRIORITY_REPORTS = 50

# Keys of the GC table that are not a line of code.
DYPER = "(dyper)"
NO_FRAME = "(no Python frame)"
OTHER = "(other sites)"
UNWATCHED = "(not watched)"
