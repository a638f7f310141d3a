"""Installing dyper adds one import name, ``dyper``, and its autostart .pth does nothing unless asked.

dyper is built from a copy of this checkout (so that a stale ``build/`` here cannot leak into it) and
installed with pip into a directory of its own; the interpreters that check it run from a directory
that is not the checkout, so what they import comes from that install or from nowhere.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.factories import REPO

#: Not part of the source tree a build needs: this checkout's own build products and environments.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".*cache")


def _can_build_here() -> bool:
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return False
    return major >= 68 and importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """dyper installed by pip (no dependencies) into a directory of its own, as into site-packages."""
    tmp = tmp_path_factory.mktemp("install")
    src, target = tmp / "src", tmp / "site"
    shutil.copytree(REPO, src, ignore=NOT_SOURCE)
    # Without build isolation when this environment has what pyproject.toml's build-system asks for.
    isolation = ["--no-build-isolation"] if _can_build_here() else []
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *isolation, "--target", str(target), str(src)],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp,
    )
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"
    yield target


def python(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """This interpreter on ``args`` with no DYPER_ variable in its environment (plus ``env``)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DYPER_") and k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, cwd=cwd, env={**clean, **(env or {})}
    )
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.timeout(300)
def test_an_install_adds_only_the_dyper_import_name(site: Path) -> None:
    entries = {p.name for p in site.iterdir()}
    (dist_info,) = (name for name in entries if name.startswith("dyper-") and name.endswith(".dist-info"))
    # pip --target puts the console script in bin/; a real install puts it beside the interpreter.
    assert entries - {"bin"} == {"dyper", dist_info, "dyper_autostart.pth"}
    assert {p.name for p in (site / "bin").iterdir()} <= {"dyper"}
    assert {p.name for p in (site / "dyper").iterdir()} >= {"__init__.py", "agent", "monitor", "proflets"}
    # What importlib.metadata says the distributions on that path provide.
    # (importlib.metadata's own lazy imports, email on 3.13, are made before sys.path is narrowed.)
    code = (
        "import importlib.metadata, importlib.metadata._adapters, json, sys; sys.path[:] = [sys.argv[1]]; "
        "print(json.dumps(importlib.metadata.packages_distributions()))"
    )
    provided = json.loads(python("-S", "-c", code, str(site), cwd=site.parent).stdout)
    assert provided == {"dyper": ["dyper"]}


@pytest.mark.timeout(300)
def test_the_installed_names_are_imported_from_the_install_not_the_checkout(site: Path, tmp_path: Path) -> None:
    code = (
        "import json, dyper, dyper.agent, dyper.monitor.cli, dyper.proflets.cpu; "
        "print(json.dumps([m.__file__ for m in (dyper, dyper.agent, dyper.monitor.cli, dyper.proflets.cpu)]))"
    )
    files = json.loads(python("-c", code, cwd=tmp_path, env={"PYTHONPATH": str(site)}).stdout)
    assert all(Path(f).is_relative_to(site) for f in files), files


@pytest.mark.timeout(300)
def test_the_autostart_line_imports_nothing_unless_dyper_monitor_is_set(site: Path, tmp_path: Path) -> None:
    # -S: no site-packages at start-up (this environment's own dyper .pth stays out of it); its
    # dependencies are put on the path without their .pth files, then the install is added as a site dir.
    code = (
        "import json, site, sys, sysconfig; sys.path.append(sysconfig.get_paths()['purelib']); "
        "site.addsitedir(sys.argv[1]); "
        "print(json.dumps(sorted(m for m in sys.modules if m == 'dyper' or m.startswith('dyper.'))))"
    )

    def dyper_modules(**env: str) -> list[str]:
        proc = python("-S", "-c", code, str(site), cwd=tmp_path, env=env)
        modules: list[str] = json.loads(proc.stdout)
        return modules

    assert dyper_modules() == []
    assert dyper_modules(DYPER_MONITOR="tcp://127.0.0.1:9", DYPER_AUTOSTART="0") == []
    # The control: with DYPER_MONITOR the same line does import dyper's autostart (the agent is
    # refused its budget here, so that none starts).
    started = dyper_modules(DYPER_MONITOR="tcp://127.0.0.1:9", DYPER_BUDGET="not a budget")
    assert "dyper.agent.autostart" in started


@pytest.mark.timeout(300)
def test_every_module_of_the_install_imports_from_it_and_the_command_runs(site: Path, tmp_path: Path) -> None:
    # A package missing from pyproject.toml's list (dyper.monitor.model was) is absent from a
    # real install while the checkout's editable one finds it: every command then failed.
    code = (
        "import importlib, json, pkgutil, dyper; "
        "names = [m.name for m in pkgutil.walk_packages(dyper.__path__, 'dyper.') if not m.name.endswith('__main__')]; "
        "files = [importlib.import_module(n).__file__ for n in names]; "
        "print(json.dumps([names, files]))"
    )
    names, files = json.loads(python("-c", code, cwd=tmp_path, env={"PYTHONPATH": str(site)}).stdout)
    assert {"dyper.monitor.model.profile", "dyper.monitor.cli", "dyper.proflets.memory.collector"} <= set(names)
    assert all(Path(f).is_relative_to(site) for f in files), [f for f in files if not Path(f).is_relative_to(site)]
    # The checkout's folders as packages: each is in the install.
    folders = {
        "dyper." + str(p.parent.relative_to(REPO)).replace("/", ".")
        for top in ("agent", "monitor", "proflets")
        for p in (REPO / top).rglob("__init__.py")
    }
    assert folders <= set(names) | {"dyper.agent", "dyper.monitor", "dyper.proflets"}, folders - set(names)
    usage = python("-m", "dyper", "--help", cwd=tmp_path, env={"PYTHONPATH": str(site)}).stdout
    assert "attach" in usage and "report" in usage
