"""Every notebook, found by glob: the plain papermill CLI exits 0, the lesson is complete.

nbval runs every lesson notebook too (``make test`` passes ``notebooks/*.ipynb`` to pytest
with ``--nbval-lax``), as a user's own CI would; solutions run in ``test_solutions.py`` (a
module of their own, so pytest-xdist's ``--dist loadscope`` runs them beside the lessons).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from conftest import SESSION_CACHE
from exercise_answers import printed_above

from labkit.cli import parameters
from labkit.runner import preflight

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
ALL = preflight.notebooks(NOTEBOOKS)
LESSONS = preflight.notebooks(NOTEBOOKS, solutions=False)


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(NOTEBOOKS)) for p in paths]


def _code_cells(path: Path) -> list[nbformat.NotebookNode]:
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def _front_matter(md: Path) -> str:
    text = md.read_text()
    assert text.startswith("---\n"), f"{md.name}: no jupytext header"
    return text[: text.index("\n---\n", 4) + 5]


# The kernels a notebook may ask for: the lab's own, and .venv-torch's (`make setup-torch`).
TORCH_KERNEL = (
    "  display_name: Python 3 (OpenXLA lab + PyTorch)\n  language: python\n  name: labkit-torch\n"
)
LAB_KERNEL = "  display_name: Python 3\n  language: python\n  name: python3\n"


def test_notebooks_are_found() -> None:
    assert LESSONS, "no notebooks found under notebooks/"
    assert all(re.fullmatch(r"\d\d[a-z]?_\w+\.ipynb", p.name) for p in ALL), "NN_topic.ipynb"


def run_papermill(
    path: Path, tmp_path: Path, args: tuple[str, ...] = (), cwd: Path | None = None
) -> None:
    """The plain papermill CLI must exit 0, in CPU mode with 8 devices (tests have no GPU),
    and leave nothing in its temporary folder (its TMPDIR and JUPYTER_RUNTIME_DIR)."""
    with preflight.scratch_space() as scratch:
        result = preflight.execute(path, tmp_path / path.name, papermill_args=args, cwd=cwd)
        left = sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*") if p.is_file())
    assert result.status == "ok", result.error
    assert left == [], f"{path.name} left files in its temporary folder: {left}"
    assert result.figures["backend"]["value"] == "cpu"
    assert result.figures["num_devices"]["value"] == 8


@pytest.mark.notebook
@pytest.mark.parametrize("path", LESSONS, ids=_ids(LESSONS))
def test_papermill_cli_exits_0(path: Path, tmp_path: Path) -> None:
    run_papermill(path, tmp_path)
    # and no exercise's answer is printed above it (the solution's literal answers; the
    # solution's run checks every accepted answer against this run's outputs)
    assert printed_above(tmp_path / path.name, NOTEBOOKS / "solutions" / path.name) == []
    keep_executed(tmp_path / path.name)


def keep_executed(executed: Path) -> None:
    """Keep a lesson's executed copy for the session (its solution's test reads it)."""
    if SESSION_CACHE in os.environ:
        folder = Path(os.environ[SESSION_CACHE]) / "executed"
        folder.mkdir(exist_ok=True)
        shutil.copyfile(executed, folder / executed.name)


def executed_lesson(name: str) -> Path:
    """This session's executed copy of a lesson (its outputs are the learner's), else the
    stored notebook, which keeps only the outputs nbval checks."""
    folder = os.environ.get(SESSION_CACHE)
    kept = Path(folder, "executed", name) if folder else None
    return kept if kept is not None and kept.exists() else NOTEBOOKS / name


# The slower tier (in every `make test`, after the first runs, whose compiles it reuses): each
# lesson with a GPT PRESET, at the next preset its parameters cell documents, `small`. Its
# claims count collectives, GEMMs and bytes from the preset's shapes; its H100 programs compile
# without a GPU, and what it trains or times here (01, 08) runs on the CPU at `small` too.
PRESET_SMALL = [p for p in LESSONS if parameters.defaults(p).get("PRESET") == "tiny"]
# More parameters a lesson documents for PRESET small: 08 compiles the capstone's batch, so
# its solution's checker reads four of its six candidates from the session's compile cache.
AT_SMALL = {"08_capstone": ("-p", "H100_BATCH", "64")}


def test_the_slower_tier_finds_its_lessons() -> None:
    found = [p.stem for p in PRESET_SMALL]
    assert found == ["00_welcome", "01_pjrt", "03_sharding", "06_collective_flags", "08_capstone"]


@pytest.mark.notebook
@pytest.mark.parametrize("path", PRESET_SMALL, ids=_ids(PRESET_SMALL))
def test_papermill_at_preset_small(path: Path, tmp_path: Path) -> None:
    run_papermill(path, tmp_path, ("-p", "PRESET", "small", *AT_SMALL.get(path.stem, ())))


@pytest.mark.notebook
def test_papermill_from_the_repository_root(tmp_path: Path) -> None:
    """`papermill notebooks/10_your_model.ipynb out.ipynb` from the kit's folder: 10 reads
    models/ beside itself, not in the working directory."""
    run_papermill(NOTEBOOKS / "10_your_model.ipynb", tmp_path, cwd=ROOT)


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_no_cell_raises_on_purpose(path: Path) -> None:
    for cell in nbformat.read(path, as_version=4).cells:
        tags = cell.metadata.get("tags", [])
        assert not [t for t in tags if "raises-exception" in t], (
            f"{path.name}: a cell tagged {tags}; catch the error with "
            "labkit.core.feedback.expect_error instead (papermill fails a raising notebook)"
        )


@pytest.mark.parametrize("path", LESSONS, ids=_ids(LESSONS))
def test_lesson_is_complete(path: Path) -> None:
    number = path.name.split("_")[0]
    solution = NOTEBOOKS / "solutions" / path.name
    assert solution.exists(), f"{path.name}: no solutions/{path.name}"
    modules = list((ROOT / "labkit" / "lessons").glob(f"n{number}_*.py"))
    assert len(modules) == 1, f"{path.name}: expected one labkit/lessons/n{number}_*.py"
    test = ROOT / "tests" / "lessons" / f"test_{modules[0].name}"
    assert test.exists(), f"{path.name}: no {test.relative_to(ROOT)}"
    assert f"labkit.lessons.{modules[0].stem}" in path.read_text(), "the lesson imports it"


def test_every_lesson_module_has_a_notebook() -> None:
    numbers = {p.name.split("_")[0] for p in LESSONS}
    for module in (ROOT / "labkit" / "lessons").glob("n*.py"):
        assert module.name[1:].split("_")[0] in numbers, f"{module.name} has no notebook"


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_markdown_pair_in_sync(path: Path) -> None:
    import jupytext

    md = path.with_suffix(".md")
    assert md.exists(), f"{md.name} missing: run `make sync`"
    header = _front_matter(md).replace(TORCH_KERNEL, LAB_KERNEL)
    assert header == _front_matter(NOTEBOOKS / "00_welcome.md"), "same header as 00_welcome.md"
    paired = jupytext.read(md)
    stored = nbformat.read(path, as_version=4)
    assert len(paired.cells) == len(stored.cells), f"{md.name} out of sync: run `make sync`"
    for a, b in zip(paired.cells, stored.cells, strict=True):
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
def test_setup_comes_first(path: Path) -> None:
    cells = _code_cells(path)
    tagged = "parameters" in cells[0].metadata.get("tags", [])
    first = cells[1 if tagged else 0].source
    assert "setup(" in first and "show()" in first, f"{path.name}: setup() must come first"


@pytest.mark.parametrize("path", LESSONS, ids=_ids(LESSONS))
def test_parameters_cell(path: Path) -> None:
    cells = _code_cells(path)
    tagged = [i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", [])]
    assert tagged == [0], f"{path.name}: the first code cell, and only it, is 'parameters'"
    names = []
    for line in cells[0].source.splitlines():
        code, _, comment = line.partition("#")
        if not code.strip():
            continue
        target, _, value = code.partition("=")
        assert target.strip().isupper(), f"{path.name}: parameter {target!r} is not UPPER_CASE"
        ast.literal_eval(value.strip())  # plain literals only
        assert comment.strip(), f"{path.name}: parameter {target.strip()} needs a comment"
        names.append(target.strip())
    assert "MODE" in names, f"{path.name}: a MODE parameter lets papermill pick cpu or gpu"
    assert "mode=MODE" in cells[1].source


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_no_pip_install_and_no_blobs(path: Path) -> None:
    text = json.dumps([c.source for c in nbformat.read(path, as_version=4).cells])
    assert "pip install" not in text
    assert "data:image/png;base64" not in text
