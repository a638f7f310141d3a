"""Frames and stacks: the vocabulary every profile, session and view shares."""

from __future__ import annotations

import functools
from dataclasses import dataclass

#: index into a frame table (a session's FrameTable.frames, a Profile's frames)
FrameId = int
#: (thread ident, frame ids root first)
StackKey = tuple[int, tuple[FrameId, ...]]
#: a function: (file, qualified name, first line)
FunctionKey = tuple[str, str, int]


@dataclass(frozen=True)
class Frame:
    """One code location: a line inside a function."""

    file: str
    name: str  # qualified name
    firstline: int
    line: int

    @functools.cached_property
    def function(self) -> FunctionKey:
        # Cached (in the instance's dict, which frozen allows): priorities look it up per report.
        return (self.file, self.name, self.firstline)

    def label(self) -> str:
        return f"{self.name} ({self.file}:{self.line})"


def frame_label(frame: Frame) -> str:
    """``qualname (file:line)`` as collapsed files write it (';' is their separator, so it is replaced)."""
    return f"{frame.name} ({frame.file}:{frame.line})".replace(";", ":")
