"""The memory_stacks proflet's rendering: memory's, with each allocation site's callers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console

from dyper.proflets.memory.render import TABLES as MEMORY_TABLES
from dyper.proflets.memory.render import sites

#: The dashboard's tables: memory's (the callers of a site are not a column).
TABLES = MEMORY_TABLES


def terminal(console: Console, section: Mapping[str, Any], limit: int) -> None:
    """Allocation sites with the callers that led to them."""
    sites(console, "memory_stacks", section, limit)
