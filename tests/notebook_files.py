"""Small notebooks written by tests: code cells for the kit's own kernel (``python3``)."""

from __future__ import annotations

from pathlib import Path

import nbformat


def code_notebook(
    cells: list[str], path: Path | None = None, parameters: str | None = None
) -> nbformat.NotebookNode:
    """A notebook of ``cells`` (code), with a papermill ``parameters`` cell first if given;
    written to ``path`` when one is given."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    if parameters is not None:
        cell = nbformat.v4.new_code_cell(parameters)
        cell.metadata["tags"] = ["parameters"]
        nb.cells.insert(0, cell)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    if path is not None:
        nbformat.write(nb, path)
    return nb
