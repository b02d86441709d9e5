"""Every notebook, found by glob: executed with papermill, paired with its .md, kept clean."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
import pytest

from labkit import preflight

ALL = preflight.notebooks()
LESSONS = preflight.notebooks(solutions=False)


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(preflight.NOTEBOOKS)) for p in paths]


def _code_cells(path: Path) -> list[nbformat.NotebookNode]:
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_notebooks_are_found() -> None:
    assert LESSONS, "no notebooks found under notebooks/"
    assert all(p.name[:2].isdigit() for p in ALL), "notebooks are named NN_topic.ipynb"


@pytest.mark.notebook
@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_notebook_executes(path: Path, tmp_path: Path) -> None:
    result = preflight.execute(path, tmp_path / path.name)
    assert result.status == "ok", result.error
    assert result.seconds < preflight.DEFAULT_TIMEOUT_S
    assert result.figures["backend"]["value"] == "cpu"
    assert result.figures["num_devices"]["value"] == 8


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_markdown_pair_in_sync(path: Path) -> None:
    import jupytext

    md = path.with_suffix(".md")
    assert md.exists(), f"{md.name} missing: run `make sync`"
    paired = jupytext.read(md)
    stored = nbformat.read(path, as_version=4)
    pairs = list(zip(paired.cells, stored.cells, strict=False))
    assert len(paired.cells) == len(stored.cells), f"{md.name} out of sync: run `make sync`"
    for a, b in pairs:
        assert (a.cell_type, a.source) == (b.cell_type, b.source), (
            f"{md.name} and {path.name} differ at {b.source[:60]!r}: run `make sync`"
        )


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_only_checked_outputs_are_stored(path: Path) -> None:
    for cell in _code_cells(path):
        if cell.outputs:
            assert "NBVAL_CHECK_OUTPUT" in cell.source, (
                f"{path.name}: output stored for an unchecked cell: {cell.source[:60]!r}"
            )


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_first_cell_sets_up_devices(path: Path) -> None:
    first = _code_cells(path)[0].source
    assert "setup(" in first and "show()" in first, f"{path.name}: first cell must call setup()"


@pytest.mark.parametrize("path", LESSONS, ids=_ids(LESSONS))
def test_parameters_cell(path: Path) -> None:
    cells = _code_cells(path)
    tagged = [i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: exactly one cell tagged 'parameters'"
    for line in cells[tagged[0]].source.splitlines():
        code, _, comment = line.partition("#")
        if not code.strip():
            continue
        target, _, value = code.partition("=")
        assert target.strip().isupper(), f"{path.name}: parameter {target!r} is not UPPER_CASE"
        ast.literal_eval(value.strip())  # plain literals only
        assert comment.strip(), f"{path.name}: parameter {target.strip()} needs a comment"


@pytest.mark.parametrize("path", LESSONS, ids=_ids(LESSONS))
def test_lesson_has_solutions(path: Path) -> None:
    solution = preflight.NOTEBOOKS / "solutions" / path.name
    text = path.read_text()
    if "labkit.exercises" in text:
        assert solution.exists(), f"{path.name} has exercises but no solutions/{path.name}"


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_no_pip_install_and_no_blobs(path: Path) -> None:
    text = json.dumps([c.source for c in nbformat.read(path, as_version=4).cells])
    assert "pip install" not in text
    assert "data:image/png;base64" not in text
