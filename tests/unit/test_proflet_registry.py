"""The proflet registry: built-ins by name, installed ones from entry points, read only when needed."""

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

from dyper import proflets


def test_builtin_names_alone_never_read_distribution_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []

    def entry_points(group: str) -> list[object]:
        read.append(group)
        return []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert proflets.available(["cpu", "heap"]) == proflets.BUILTINS
    assert proflets.available([]) == proflets.BUILTINS
    assert read == []
    # a name that is not built in, or no names at all: the installed ones are looked up
    proflets.available(["cpu", "myapp_slowsql"])
    proflets.available()
    assert read == [proflets.GROUP, proflets.GROUP]


def test_an_installed_proflet_is_found_by_its_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = importlib.metadata.EntryPoint("slowsql", "myapp.slowsql", proflets.GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [ep])
    found = proflets.available(["slowsql"])
    assert found["slowsql"] == "myapp.slowsql" and found["cpu"] == proflets.BUILTINS["cpu"]


def test_the_builtins_are_the_entry_points_pyproject_registers() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"][proflets.GROUP] == proflets.BUILTINS
    # and every default proflet of the agent is a built-in: starting one reads no metadata
    from dyper.agent.core import DEFAULT_PROFLETS

    assert set(DEFAULT_PROFLETS) <= set(proflets.BUILTINS)
