"""Widget text that headless runs survive: show_text captures nothing, and papermill runs a
notebook of many such widget cells to the end (the capturing form hung papermill)."""

from __future__ import annotations

from pathlib import Path

import ipywidgets as w
import nbformat
from notebook_files import code_notebook

from labkit.core.widgets import show_text, shown_text
from labkit.runner import preflight

WIDGET_CELLS = 60  # the capturing form hung within the first 33 such cells in 6 of 6 runs


def test_show_text_replaces_and_captures_nothing() -> None:
    out = w.Output()
    show_text(out, "first")
    show_text(out, "second\n")
    assert shown_text(out) == "second\n"
    assert out.msg_id == ""  # no capture: nothing for a headless executor to mimic


def test_papermill_runs_many_widget_cells(tmp_path: Path) -> None:
    helper = (
        "import ipywidgets as w\n"
        "from labkit.core.widgets import show_text\n\n\n"
        "def explorer(i):\n"
        "    out = w.Output()\n"
        "    pick = w.Dropdown(options=['8', '4x2'], value='8', description='mesh')\n"
        "    pick.observe(lambda _: show_text(out, f'mesh {pick.value}'), names='value')\n"
        "    show_text(out, f'layout {i}\\n' * 5 + f'bytes sent per device: {i}')\n"
        "    return w.VBox([pick, out])"
    )
    cells = [helper]
    for i in range(WIDGET_CELLS):
        cells += [f"explorer({i})", f"print({i})"]
    path = tmp_path / "widgets.ipynb"
    code_notebook(cells, path)

    result = preflight.execute(path, tmp_path / "out.ipynb", timeout_s=240)
    assert result.status == "ok", result.error
    ran = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert ran.cells[-1].outputs[0]["text"] == f"{WIDGET_CELLS - 1}\n"


def test_show_html_shows_a_rendered_output_and_its_text() -> None:
    from labkit.core.widgets import show_html

    out = w.Output()
    show_text(out, "old")
    show_html(out, "<b>grid</b>", "grid as text")
    (shown,) = out.outputs
    assert shown["output_type"] == "display_data"
    assert shown["data"] == {"text/html": "<b>grid</b>", "text/plain": "grid as text"}
    assert shown_text(out) == "grid as text" and out.msg_id == ""
