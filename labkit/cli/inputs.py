"""What ``labkit run`` and ``labkit outputs`` are given, checked before anything runs: each
problem is one line that says what is wrong and what to do, instead of a papermill traceback
minutes later."""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

from labkit.cli.usage import UsageError
from labkit.runner import preflight


def named_notebooks(paths: Sequence[str]) -> list[Path]:
    """The notebooks named (default: all, found by glob; a folder: its notebooks).

    Raises :class:`UsageError` for a missing file (listing the notebooks that exist) or a file
    that is no runnable notebook.
    """
    named = [Path(p).resolve() for p in paths]
    missing = [str(p) for p in named if not p.exists()]
    if missing:
        try:
            known = ", ".join(str(p.relative_to(Path.cwd())) for p in preflight.notebooks())
        except (FileNotFoundError, ValueError):
            known = "none found from here"
        raise UsageError(f"no such notebook: {', '.join(missing)}\nnotebooks: {known}")
    chosen = expand(named) if named else preflight.notebooks()
    for path in chosen or named:  # an empty folder is reported as such
        if problem := notebook_problem(path):
            raise UsageError(problem)
    return chosen


def expand(paths: list[Path]) -> list[Path]:
    """The notebooks named: a folder stands for the ``.ipynb`` files in it, sorted."""
    found: list[Path] = []
    for path in paths:
        found += sorted(path.glob("*.ipynb")) if path.is_dir() else [path]
    return found


def _rebuild_hint(path: Path) -> str:
    text = path.with_suffix(".md")
    rebuild = f" or rebuild it from {text.name}: .venv/bin/jupytext --to ipynb {text}"
    return f"restore it (git checkout -- {path}){rebuild if text.exists() else ''}"


def notebook_problem(path: Path) -> str | None:
    """Why ``path`` is not a notebook ``labkit run`` can execute (and what to do), or None."""
    if path.is_dir():
        return f"{path} is a folder with no .ipynb in it: name notebooks, or none for all of them"
    if path.suffix != ".ipynb":
        twin = path.with_suffix(".ipynb")
        if path.suffix == ".md" and twin.exists():
            return f"{path} is the notebook's MyST text: run the notebook itself, {twin}"
        return f"{path} is not a notebook (.ipynb): give .ipynb files, e.g. notebooks/*.ipynb"
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    if not raw.strip():
        return f"{path} is empty ({len(raw)} bytes): {_rebuild_hint(path)}"
    try:
        nb = json.loads(raw)
    except ValueError as exc:
        return f"{path} is not valid notebook JSON ({exc}; cut short?): {_rebuild_hint(path)}"
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list) or not isinstance(nb.get("nbformat"), int):
        return f"{path} is JSON but not a Jupyter notebook (no cells, no nbformat)"
    if not any(isinstance(c, dict) and c.get("cell_type") == "code" for c in cells):
        return f"{path} has no code cells: nothing to run"
    return None


def out_problem(out_dir: Path) -> str | None:
    """Why the report folder ``--out`` cannot be written (and what to do), or None."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        return f"--out {out_dir}: cannot write there ({why}); give a folder you can write to"
    return None


def seconds(text: str) -> int:
    """``--timeout``: a positive whole number of seconds."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"give whole seconds, e.g. --timeout 600; got {text!r}"
        ) from None
    if count < 1:
        raise argparse.ArgumentTypeError(
            f"must be at least 1 second (each notebook's time limit), got {count}"
        )
    return count


def add_timeout(parser: argparse.ArgumentParser) -> None:
    """``--timeout SECONDS``, each whole notebook's time limit (``run`` and ``outputs``)."""
    about = (
        f"seconds for each whole notebook (default {preflight.DEFAULT_TIMEOUT_S}); past it "
        "papermill and its kernel are stopped and the notebook counts as failed"
    )
    parser.add_argument("--timeout", type=seconds, default=preflight.DEFAULT_TIMEOUT_S, help=about)
