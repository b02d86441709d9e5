"""labkit's layers: no module imports a layer above its own, and no import cycle exists.

Layers, lowest first: core, xla, topic modules (``labkit/<name>.py``), gpt, lessons, cli.
Imports inside functions and under ``TYPE_CHECKING`` count: a cycle through a deferred
import is still a cycle in the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "labkit"
RANK = {"core": 0, "xla": 1, "topic": 2, "gpt": 3, "lessons": 4, "cli": 5}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def layer(module: str) -> str:
    """The layer of a labkit module (``labkit`` and ``labkit.__main__`` count as cli)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "cli"
    return parts[1] if parts[1] in RANK else "topic"


def imports(module: str) -> set[str]:
    """The labkit modules that ``module`` imports, anywhere in its body."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in MODULES and m != module and m != "labkit"}


GRAPH = {m: imports(m) for m in MODULES}


def test_the_package_has_every_layer() -> None:
    assert {layer(m) for m in MODULES} == set(RANK)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_upward(module: str) -> None:
    upward = [m for m in GRAPH[module] if RANK[layer(m)] > RANK[layer(module)]]
    assert not upward, f"{module} ({layer(module)}) imports a higher layer: {upward}"


def test_lessons_are_imported_by_nothing_but_the_cli() -> None:
    for module, deps in GRAPH.items():
        if layer(module) not in ("lessons", "cli"):
            assert not [d for d in deps if layer(d) == "lessons"], module


def on_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Modules from which an import chain leads back to themselves."""

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += graph.get(m, ())
        return seen

    return sorted(m for m in graph if m in reach(m))


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(importer, imported)`` pairs where the imported module sits in a higher layer."""
    return [(m, d) for m, deps in graph.items() for d in deps if RANK[layer(d)] > RANK[layer(m)]]


def test_no_import_cycle() -> None:
    assert not on_cycles(GRAPH), f"modules on an import cycle: {on_cycles(GRAPH)}"


def test_no_upward_import_anywhere() -> None:
    assert not upward(GRAPH)


def test_the_checks_see_a_cycle_and_an_upward_import() -> None:
    graph = {"labkit.core.a": {"labkit.xla.b"}, "labkit.xla.b": {"labkit.core.a"}}
    assert on_cycles(graph) == ["labkit.core.a", "labkit.xla.b"]
    assert upward(graph) == [("labkit.core.a", "labkit.xla.b")]
    assert on_cycles({"labkit.core.a": set(), "labkit.xla.b": {"labkit.core.a"}}) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= 450, f"{module} has {lines} lines: split it by concept"
