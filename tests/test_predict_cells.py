"""The learner predicts before a lesson reveals: every lesson has cells tagged ``predict``.

A predict cell sets ``prediction_NN_k = ...`` (the learner's answer to come) and passes it to
a checker; the next code cell reveals what was predicted (it prints, claims or displays). The
lesson's solution notebook stores an answer the same checker accepts.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from test_notebooks import LESSONS, NOTEBOOKS

# Lessons built around more than one reveal ask for more predictions (issue 46).
AT_LEAST = {"03_sharding": 2, "06_collective_flags": 2, "08_capstone": 2}
PREDICTION = re.compile(r"prediction_\w+")


def _cells(path: Path) -> list[nbformat.NotebookNode]:
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def _is_predict(cell: nbformat.NotebookNode) -> bool:
    return "predict" in cell.metadata.get("tags", [])


def _unanswered_predictions(source: str) -> list[str]:
    """Names assigned ``...`` in a cell: ``prediction_03_1 = ...``."""
    return [
        t.id
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        if node.value.value is Ellipsis
        for t in node.targets
        if isinstance(t, ast.Name) and PREDICTION.fullmatch(t.id)
    ]


def _checked(source: str, name: str) -> list[str]:
    """The checkers (``check_*`` calls) in ``source`` that take ``name`` as an argument."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and any(
            isinstance(a, ast.Name) and a.id == name for a in node.args
        ):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called.startswith("check_"):
                out.append(called)
    return out


def _reveals(source: str) -> bool:
    """A cell shows something: it prints, claims, tabulates, or ends with an expression."""
    tree = ast.parse(source)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        return True
    shown = {"print", "claim", "show_table", "display"}
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in shown
        for n in ast.walk(tree)
    )


def _predictions(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(cell index, prediction name, its checkers)`` for each predict cell of a lesson."""
    out = []
    for i, cell in enumerate(_cells(path)):
        if _is_predict(cell):
            names = _unanswered_predictions(cell.source)
            assert len(names) == 1, f"{path.name} cell {i}: set one prediction_NN_k = ..."
            out.append((i, names[0], _checked(cell.source, names[0])))
    return out


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_lesson_asks_for_predictions(path: Path) -> None:
    found = _predictions(path)
    wanted = AT_LEAST.get(path.stem, 1)
    assert len(found) >= wanted, f"{path.name}: {len(found)} predict cells, wanted {wanted}"
    for i, name, checkers in found:
        assert checkers, f"{path.name} cell {i}: {name} is passed to no check_* function"


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_each_prediction_is_followed_by_its_reveal(path: Path) -> None:
    cells = _cells(path)
    for i, name, _ in _predictions(path):
        assert i + 1 < len(cells), f"{path.name}: {name} is the last cell"
        reveal = cells[i + 1]
        assert not _is_predict(reveal), f"{path.name}: {name} is followed by another prediction"
        assert "answer_" not in reveal.source, f"{path.name}: {name} is followed by an exercise"
        assert _reveals(reveal.source), f"{path.name}: the cell after {name} shows nothing"


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_each_prediction_has_an_accepted_answer_in_the_solution(path: Path) -> None:
    solution = "\n".join(c.source for c in _cells(NOTEBOOKS / "solutions" / path.name))
    tree = ast.parse(solution)
    stored = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and not (isinstance(node.value, ast.Constant) and node.value.value is Ellipsis)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    for _, name, checkers in _predictions(path):
        assert name in stored, f"solutions/{path.name} stores no answer for {name}"
        assert set(checkers) & set(_checked(solution, name)), (
            f"solutions/{path.name} does not pass {name} to {checkers}"
        )
        assert re.search(rf"{name} = [\s\S]*?\.passed", solution), (
            f"solutions/{path.name}: assert that {name} is accepted"
        )


def test_a_printed_answer_is_found(tmp_path: Path) -> None:
    from exercise_answers import printed_above, printed_forms

    assert printed_forms(7340032.0) == ["7340032", "7,340,032"]
    assert printed_forms(3) == [] and printed_forms(0.875) == ["0.875", "0.875"]
    lesson, solution = nbformat.v4.new_notebook(), nbformat.v4.new_notebook()
    shown = nbformat.v4.new_code_cell("print(2 * 7 / 8 * 4 * 2**20)")
    shown.outputs = [nbformat.v4.new_output("stream", text="sent 7,340,032 bytes\n")]
    lesson.cells = [shown, nbformat.v4.new_code_cell("answer_03_2 = ...")]
    solution.cells = [nbformat.v4.new_code_cell("answer_03_2 = 2 * 7 / 8 * 4 * 2**20")]
    nbformat.write(lesson, tmp_path / "lesson.ipynb")
    nbformat.write(solution, tmp_path / "solution.ipynb")
    found = printed_above(tmp_path / "lesson.ipynb", tmp_path / "solution.ipynb")
    assert found == ["lesson.ipynb: answer_03_2 = 7,340,032 is printed above it"]
    shown.outputs = [nbformat.v4.new_output("stream", text="sent 17340032 bytes\n")]
    nbformat.write(lesson, tmp_path / "lesson.ipynb")
    assert printed_above(tmp_path / "lesson.ipynb", tmp_path / "solution.ipynb") == []


def test_an_accepted_answer_is_logged_and_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exercise_answers import logged_answers, printed_above, variable_of

    from labkit.core.feedback import ANSWER_LOG, check_integer

    log = tmp_path / "accepted.jsonl"
    monkeypatch.setenv(ANSWER_LOG, str(log))
    check_integer("03.3", 5_505_024, 5_505_024, "right", "")  # accepted: logged
    check_integer("03.2", 7, 8, "right", "")  # not accepted: not logged
    check_integer("03.1", ..., 8, "right", "")  # unanswered: not logged
    assert logged_answers(log) == {"answer_03_3": 5_505_024}
    assert variable_of("08.p1") == "prediction_08_1" and variable_of("06b.2") == "answer_06b_2"
    lesson = nbformat.v4.new_notebook()
    shown = nbformat.v4.new_code_cell("print(total)")
    shown.outputs = [nbformat.v4.new_output("stream", text="5505024 bytes in all\n")]
    lesson.cells = [shown, nbformat.v4.new_code_cell("answer_03_3 = ...")]
    nbformat.write(lesson, tmp_path / "lesson.ipynb")
    found = printed_above(tmp_path / "lesson.ipynb", logged_answers(log))
    assert found == ["lesson.ipynb: answer_03_3 = 5505024 is printed above it"]
