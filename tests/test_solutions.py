"""Every solution notebook exits 0 under the plain papermill CLI (its asserts are the checks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from exercise_answers import ANSWER, code_cells, logged_answers, printed_above
from test_notebooks import NOTEBOOKS, executed_lesson, run_papermill

from labkit.core.feedback import ANSWER_LOG
from labkit.runner import preflight

SOLUTIONS = [p for p in preflight.notebooks(NOTEBOOKS) if p.parent.name == "solutions"]


def test_every_lesson_has_a_solution_and_back() -> None:
    lessons = {p.name for p in preflight.notebooks(NOTEBOOKS, solutions=False)}
    assert {p.name for p in SOLUTIONS} == lessons


@pytest.mark.notebook
@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_solution_papermill_cli_exits_0(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The solution runs; each exercise and prediction of its lesson was answered and accepted
    (the checkers log what they accept), and no answer is printed above its exercise in the
    lesson's outputs (this session's first run of it, else the stored notebook)."""
    log = tmp_path / "accepted.jsonl"
    monkeypatch.setenv(ANSWER_LOG, str(log))
    run_papermill(path, tmp_path)
    accepted = logged_answers(log)
    lesson = executed_lesson(path.name)
    asked = {name for cell in code_cells(lesson) for name in ANSWER.findall(cell.source)}
    assert asked <= set(accepted), f"no accepted answer for {sorted(asked - set(accepted))}"
    assert printed_above(lesson, accepted) == []
