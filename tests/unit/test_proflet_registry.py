"""The proflet registry: built-ins by name, installed ones from entry points, read only when needed."""

import importlib.metadata
import sys
import tomllib
from collections.abc import Iterator
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
    # and the agent's default set is every built-in (all on by default), so starting reads no metadata
    from dyper.agent.core import DEFAULT_PROFLETS

    assert tuple(proflets.BUILTINS) == DEFAULT_PROFLETS


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for test proflets, whose modules are forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("slowsql_"):
            del sys.modules[name]


def _plugin(root: Path, name: str, parts: dict[str, str]) -> None:
    """A proflet package ``name`` under ``root``: an ``__init__`` and the given parts' sources."""
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text('"""A test proflet."""\n')
    for part, source in parts.items():
        (package / f"{part}.py").write_text(source)


ANALYZER_SOURCE = """
from dyper.proflets.base import Analyzer


class SlowAnalyzer(Analyzer):
    name = "slowsql"


ANALYZER = SlowAnalyzer
"""


def test_a_package_s_parts_load_alone_and_a_missing_part_is_looked_up_on_the_package(plugins: Path) -> None:
    _plugin(plugins, "slowsql_pkg", {"analyzer": ANALYZER_SOURCE})
    collector = proflets.load("slowsql", "slowsql_pkg", "collector")
    assert collector.__name__ == "slowsql_pkg" and getattr(collector, "COLLECTOR", None) is None
    assert "slowsql_pkg.analyzer" not in sys.modules  # the target, which asks for the collector, gets no analyzer
    analyzer = proflets.load("slowsql", "slowsql_pkg", "analyzer")
    assert analyzer.__name__ == "slowsql_pkg.analyzer" and analyzer.ANALYZER.name == "slowsql"
    assert proflets.load("slowsql", "slowsql_pkg", "render").__name__ == "slowsql_pkg"
    # the built-ins: each part its own module
    assert proflets.load("cpu", None, "collector").__name__ == "dyper.proflets.cpu.collector"
    assert proflets.load("cpu", None, "render").__name__ == "dyper.proflets.cpu.render"
    with pytest.raises(ValueError, match="not a part"):
        proflets.load("cpu", None, "analyser")


def test_a_proflet_without_a_render_module_is_shown_by_the_generic_renderer(
    plugins: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from rich.console import Console

    from dyper.monitor.commands.report import render

    _plugin(plugins, "slowsql_report", {"analyzer": ANALYZER_SOURCE})
    ep = importlib.metadata.EntryPoint("slowsql", "slowsql_report", proflets.GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [ep])
    report = {
        "process": {"pid": 7, "argv": ["app.py"]},
        "status": {},
        "proflets": {
            "slowsql": {"queries": [{"statement": "SELECT 1", "ms_per_call": 12.5}], "slowest_ms": 40.0},
            "timing": {"active_threads_mean": 1.0, "active_threads_std": 0.0, "cpus": 2, "cores_used": 0.5},
        },
    }
    out = io.StringIO()
    render(report, Console(file=out, width=160), 20)
    text = out.getvalue()
    assert "slowsql: slowest_ms 40.0" in text  # its values, then each list of rows as a table
    assert "slowsql: queries" in text and "statement" in text and "SELECT 1" in text and "12.5" in text
    assert "timing: active threads 1.00" in text  # a built-in's own renderer, before the plug-in
    assert text.index("timing:") < text.index("slowsql:")


def test_the_dashboard_gets_each_built_in_s_table_descriptions() -> None:
    from dyper.monitor.web.data import table_descriptions
    from dyper.proflets.display import FORMATS

    tables = table_descriptions([*proflets.BUILTINS, "not_installed"])
    assert "not_installed" not in tables  # shown generically
    assert [c["key"] for c in tables["cpu"]["functions"]["columns"]][:3] == ["name", "self_s", "self_pct"]
    for name, specs in tables.items():
        for key, spec in specs.items():
            assert spec["title"] and spec["columns"], (name, key)
            for c in spec["columns"]:
                assert c["format"] in FORMATS and c["title"], (name, key, c)


def test_every_proflet_package_is_installed() -> None:
    # A package missing from [tool.setuptools] packages works from the checkout and is absent from the wheel.
    root = Path(__file__).resolve().parents[2]
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    listed = set(pyproject["tool"]["setuptools"]["packages"])
    found = {"dyper.proflets." + p.parent.name for p in (root / "proflets").glob("*/__init__.py")}
    assert found and found <= listed, sorted(found - listed)
    assert "io_routines.toml" in pyproject["tool"]["setuptools"]["package-data"]["dyper.proflets.io"]
