"""The layering of dyper's modules, read from their source with ``ast`` (imports inside functions included).

- the agent (what runs in the target) imports nothing of the monitor;
- the model (``dyper.monitor.model``) imports nothing of dyper above it: no
  other part of the monitor, no proflet; of the agent only the wire
  protocol's constants;
- no import cycle among the project's modules, lazy imports and imports
  under ``TYPE_CHECKING`` included (``from pkg import mod`` is an import of
  ``pkg.mod`` when that is a module);
- nothing imports the folders by their own names (``agent``, ``monitor``,
  ``proflets``): installed, only ``dyper`` exists;
- a proflet's module, which the target loads for its collector, loads no more
  of the monitor than the model's two leaves (lights, libraries);
- a built-in proflet's collector, and everything it imports in turn (lazily
  too: that runs in the target as well), reaches no proflet's analyzer or
  render module and nothing of the monitor but those two leaves, the way a
  fresh interpreter would load it (each module's packages included).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: folder -> the package it installs as (setuptools package-dir, pyproject.toml)
PACKAGES = {"dyper": "dyper", "agent": "dyper.agent", "monitor": "dyper.monitor", "proflets": "dyper.proflets"}
MODEL = "dyper.monitor.model"
#: what the model may import of the rest of dyper
MODEL_MAY_IMPORT = ("dyper.agent.protocol",)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # file:line


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module or package, names taken from it, line) for every import statement in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, list[str], int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, [], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.append((base, [alias.name for alias in node.names], node.lineno))
    return found


def _resolve(name: str) -> str | None:
    """The project module ``name`` is, or is inside (the longest known prefix), or None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _edges() -> list[Edge]:
    edges: list[Edge] = []
    for module, path in MODULES.items():
        for base, names, line in _imports(module, path):
            where = f"{path.relative_to(ROOT)}:{line}"
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` the module mod
            targets = [f"{base}.{n}" if f"{base}.{n}" in MODULES else base for n in names] if names else [base]
            for target in dict.fromkeys(targets):
                resolved = _resolve(target)
                if resolved is not None and resolved != module:
                    edges.append(Edge(module, resolved, where))
    return edges


EDGES = _edges()


def _raw_imports() -> list[tuple[str, str]]:
    """(where, imported name) of every import, for the check on top-level names."""
    out = []
    for module, path in MODULES.items():
        for base, _, line in _imports(module, path):
            out.append((f"{path.relative_to(ROOT)}:{line}", base))
    return out


def test_the_module_map_sees_the_project() -> None:
    # A guard on the test itself: a moved folder must not leave it checking nothing.
    for name in (
        "dyper",
        "dyper.agent.core",
        "dyper.monitor.session",
        "dyper.monitor.model.profile",
        "dyper.proflets.cpu",
    ):
        assert name in MODULES, name
    assert any(e.source == "dyper.monitor.server" and e.target == "dyper.monitor.session" for e in EDGES)


def test_the_agent_imports_nothing_of_the_monitor() -> None:
    bad = [e for e in EDGES if e.source.startswith("dyper.agent") and e.target.startswith("dyper.monitor")]
    assert not bad, "\n".join(f"{e.where}: {e.source} imports {e.target}" for e in bad)


def test_the_model_imports_nothing_above_it() -> None:
    bad = [
        e
        for e in EDGES
        if (e.source == MODEL or e.source.startswith(MODEL + "."))
        and not (e.target == MODEL or e.target.startswith(MODEL + "."))
        and e.target not in MODEL_MAY_IMPORT
    ]
    assert not bad, "\n".join(f"{e.where}: {e.source} imports {e.target}" for e in bad)


def _cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in edges:
        graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    cycles = _cycles(EDGES)
    lines = []
    for component in cycles:
        inside = set(component)
        lines.append("cycle: " + ", ".join(component))
        lines += [f"  {e.where}: {e.source} -> {e.target}" for e in EDGES if e.source in inside and e.target in inside]
    assert not cycles, "\n".join(lines)


def test_the_cycle_finder_finds_a_cycle() -> None:
    a, b = "dyper.monitor.session", "dyper.monitor.server"
    assert _cycles([Edge(a, b, "x"), Edge(b, a, "y")]) == [sorted([a, b])]


def test_no_top_level_agent_monitor_or_proflets_imports() -> None:
    bad = [
        f"{where}: imports {name}"
        for where, name in _raw_imports()
        if name.split(".")[0] in ("agent", "monitor", "proflets")
    ]
    assert not bad, "\n".join(bad)


def _module_level_imports(path: Path) -> list[tuple[str, int]]:
    """Imports that run when the module is loaded: not inside a function, not under ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[tuple[str, int]] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend((alias.name, node.lineno) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.extend((f"{node.module}.{alias.name}", node.lineno) for alias in node.names)
            elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(tree.body)
    return found


def test_a_proflet_module_loads_no_more_of_the_monitor_than_the_model_s_leaves() -> None:
    # The target loads a proflet's module for its collector: the monitor's analyses must not come with it.
    allowed = ("dyper.monitor.model.lights", "dyper.monitor.model.libraries")
    bad = []
    for module, path in MODULES.items():
        if not module.startswith("dyper.proflets"):
            continue
        for name, line in _module_level_imports(path):
            target = _resolve(name)
            if target is not None and target.startswith("dyper.monitor") and target not in allowed:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {module} loads {target}")
    assert not bad, "\n".join(bad)


BUILTIN_PROFLETS = sorted(
    m.rpartition(".")[0]
    for m in MODULES
    if m.startswith("dyper.proflets.") and m.endswith(".collector") and m.count(".") == 3
)
#: what the target may load of the monitor: the model's two leaves, with their packages
TARGET_MAY_LOAD = ("dyper.monitor", MODEL, "dyper.monitor.model.lights", "dyper.monitor.model.libraries")


def _run_imports(path: Path) -> list[tuple[str, int]]:
    """Every import that can run when the module is loaded or its code called: not under ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path}:{node.lineno}: a relative import"  # the project has none
            found.extend((f"{node.module}.{alias.name}", node.lineno) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _loaded_with(start: str) -> dict[str, str]:
    """The project's modules importing ``start`` can load (with every package above each), and by way of what."""
    seen: dict[str, str] = {}
    todo = [(start, "(start)")]
    while todo:
        module, via = todo.pop()
        if module in seen:
            continue
        seen[module] = via
        parts = module.split(".")
        todo.extend(
            (".".join(parts[:i]), f"package of {module}")
            for i in range(1, len(parts))
            if ".".join(parts[:i]) in MODULES
        )
        path = MODULES[module]
        for name, line in _run_imports(path):
            target = _resolve(name)
            if target is not None:
                todo.append((target, f"{path.relative_to(ROOT)}:{line}"))
    return seen


def test_the_builtin_proflets_are_packages_with_a_collector_and_an_analyzer() -> None:
    from dyper import proflets

    assert sorted(proflets.BUILTINS.values()) == BUILTIN_PROFLETS
    for package in BUILTIN_PROFLETS:
        assert f"{package}.analyzer" in MODULES and f"{package}.render" in MODULES, package


def test_a_collector_loads_no_analyzer_no_renderer_and_no_more_of_the_monitor_than_the_model_s_leaves() -> None:
    bad = []
    for package in BUILTIN_PROFLETS:
        loaded = _loaded_with(f"{package}.collector")
        assert f"{package}.collector" in loaded and "dyper.agent.proflet" in loaded  # the walk follows imports
        for module, via in sorted(loaded.items()):
            last = module.rpartition(".")[2]
            if (
                (module.startswith("dyper.proflets.") and last in ("analyzer", "render"))
                or module == "dyper.proflets.display"
                or (module.startswith("dyper.monitor") and module not in TARGET_MAY_LOAD)
            ):
                bad.append(f"{package}.collector loads {module} ({via})")
    assert not bad, "\n".join(bad)


def test_the_collector_walk_sees_a_lazy_import() -> None:
    # A guard on the test itself: cpu's collector imports threads' collector inside a function.
    assert "dyper.proflets.threads.collector" in _loaded_with("dyper.proflets.cpu.collector")
    assert "dyper.proflets.memory.collector" in _loaded_with("dyper.proflets.memory_stacks.collector")
    assert "dyper.proflets.memory.analyzer" in _loaded_with("dyper.proflets.memory_stacks.analyzer")
