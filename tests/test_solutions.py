"""Every solution notebook exits 0 under the plain papermill CLI (its asserts are the checks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_notebooks import NOTEBOOKS, run_papermill

from labkit.runner import preflight

SOLUTIONS = [p for p in preflight.notebooks(NOTEBOOKS) if p.parent.name == "solutions"]


def test_every_lesson_has_a_solution_and_back() -> None:
    lessons = {p.name for p in preflight.notebooks(NOTEBOOKS, solutions=False)}
    assert {p.name for p in SOLUTIONS} == lessons


@pytest.mark.notebook
@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_solution_papermill_cli_exits_0(path: Path, tmp_path: Path) -> None:
    run_papermill(path, tmp_path)
