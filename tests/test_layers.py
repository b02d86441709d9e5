"""labkit's layers: no module imports a layer above its own, and no import cycle exists.

Layers, lowest first: core, xla, the topic subpackages (runtime, export, parallel, numerics,
kernels: each stands on core and xla alone, none imports another), gpt, lessons, runner (the
notebook runner: it stands on core alone), cli. Nothing but the package's face and
``__main__`` sits loose at labkit's top level.
Imports inside functions and under ``TYPE_CHECKING`` count: a cycle through a deferred
import is still a cycle in the design. A lesson module imports no other lesson (shared code
moves down into its topic module), no module imports another's private (``_name``) names,
and a test imports only the lesson it tests.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "labkit"
# The runner imports core alone, but ranks just below the command that drives it: nothing that
# teaches (a lesson, a model, a topic) runs notebooks, and what it may use is checked below.
RANK = {"core": 0, "xla": 1, "topic": 2, "gpt": 3, "lessons": 4, "runner": 5, "cli": 6}
# The topic layer: one subpackage per subject several lessons share, each knowing no model.
TOPICS = ("runtime", "export", "parallel", "numerics", "kernels")


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def layer(module: str) -> str:
    """The layer of a labkit module (``labkit`` and ``labkit.__main__`` count as cli)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "cli"
    if parts[1] in TOPICS:
        return "topic"
    if parts[1] not in RANK:
        raise ValueError(f"{module} is in no layer: put it in a subpackage named in RANK or TOPICS")
    return parts[1]


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


def test_no_module_sits_loose_at_the_top() -> None:
    loose = [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert not loose, f"{loose}: a topic module belongs in one of the subpackages {TOPICS}"


def test_every_topic_subpackage_exists_and_is_named_in_the_docstring() -> None:
    doc = (PACKAGE / "__init__.py").read_text()
    for topic in TOPICS:
        assert f"labkit.{topic}" in MODULES, f"labkit/{topic}/__init__.py is missing"
        assert f"``labkit.{topic}``" in doc, f"labkit/__init__.py does not name labkit.{topic}"


def topic_of(module: str) -> str | None:
    """The topic subpackage a module belongs to, or None outside the topic layer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in TOPICS else None


def cross_topic(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(importer, imported)`` pairs between two different topic subpackages."""
    return [
        (m, d)
        for m, deps in graph.items()
        for d in deps
        if topic_of(m) and topic_of(d) and topic_of(m) != topic_of(d)
    ]


def test_no_topic_subpackage_imports_another() -> None:
    assert not cross_topic(GRAPH), "shared code moves down into core or xla"


def test_the_topic_check_sees_a_cross_import() -> None:
    graph = {"labkit.kernels.flash": {"labkit.numerics.fp8"}, "labkit.numerics.fp8": set()}
    assert cross_topic(graph) == [("labkit.kernels.flash", "labkit.numerics.fp8")]
    assert cross_topic({"labkit.kernels.flash": {"labkit.kernels.pallas"}}) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_upward(module: str) -> None:
    upward = [m for m in GRAPH[module] if RANK[layer(m)] > RANK[layer(module)]]
    assert not upward, f"{module} ({layer(module)}) imports a higher layer: {upward}"


def test_the_runner_stands_on_core_alone() -> None:
    """It runs each notebook in a kernel of its own: it needs no XLA, no model, no lesson."""
    used = {layer(d) for m, deps in GRAPH.items() if layer(m) == "runner" for d in deps}
    assert used <= {"core", "runner"}, f"labkit.runner imports {sorted(used - {'core', 'runner'})}"


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


def private_imports(path: Path) -> list[str]:
    """``module._name`` imported by ``path`` from another labkit module (``from m import _x``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def private_attributes(path: Path) -> list[str]:
    """``alias._name`` uses where ``alias`` is a labkit module imported by ``path``."""
    tree = ast.parse(path.read_text())
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit"):
            aliases |= {
                a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in MODULES
            }
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.asname and a.name in MODULES}
    return [
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_names_across_modules(module: str) -> None:
    used = private_imports(MODULES[module]) + private_attributes(MODULES[module])
    assert not used, f"{module} uses private names of other modules: {used}; make them public"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) == "lessons"))
def test_no_lesson_imports_another_lesson(module: str) -> None:
    others = [d for d in GRAPH[module] if layer(d) == "lessons"]
    assert not others, f"{module} imports {others}: move the shared code into its topic module"


TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("path", sorted(TESTS.rglob("test_*.py")), ids=lambda p: p.name)
def test_a_test_imports_only_its_own_lesson(path: Path) -> None:
    text = path.read_text()
    lessons = set(re.findall(r"labkit\.lessons(?:\.| import )(n\w+)", text))
    own = {path.stem.removeprefix("test_")} if path.parent.name == "lessons" else set()
    assert lessons <= own, f"{path.name} imports lesson modules {sorted(lessons - own)}"


def test_the_private_check_sees_a_private_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from labkit.xla.hlo import _fusion_kind\nfrom labkit.xla import hlo\nhlo._x\n"
    )
    assert private_imports(probe) == ["labkit.xla.hlo._fusion_kind"]
    assert private_attributes(probe) == ["hlo._x"]
