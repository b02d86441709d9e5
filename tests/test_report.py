"""labkit.report and labkit.preflight: figures travel inside executed notebooks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from notebook_files import code_notebook

from labkit.core import report
from labkit.runner import preflight


def test_figure_is_plain_json() -> None:
    import numpy as np

    figure = report.figure("tflops", np.float32(1.5), unit="TFLOP/s")
    assert figure == {"name": "tflops", "value": 1.5, "unit": "TFLOP/s", "measured": True}
    assert report.figure("x", [np.int64(2), float("nan")])["value"] == [2, "nan"]
    assert json.dumps(figure)


def test_record_outside_ipython_prints_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert report.record("tflops", 1.5, unit="TFLOP/s") is None
    assert capsys.readouterr().out == "recorded tflops = 1.5 TFLOP/s\n"


def test_record_in_jupyter_shows_the_line_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython
    import IPython.display

    shown: list[dict[str, object]] = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda data, raw: shown.append(data))
    report.record("tflops", 1.5, unit="TFLOP/s")
    (bundle,) = shown
    assert bundle["text/plain"] == "recorded tflops = 1.5 TFLOP/s"
    # no frontend renders the labkit type: the HTML line is what JupyterLab and nbconvert show
    assert bundle["text/html"] == (
        '<div class="labkit-record"><code>recorded tflops = 1.5 TFLOP/s</code></div>'
    )
    assert bundle[report.MIME] == report.figure("tflops", 1.5, "TFLOP/s")


def test_record_rejects_bad_names() -> None:
    with pytest.raises(ValueError, match="figure name"):
        report.record("two words", 1)


def test_figures_are_read_from_outputs() -> None:
    nb = {"cells": [{"outputs": [{"data": {report.MIME: {"name": "a", "value": 1}}}]}]}
    assert report.figures(nb) == {"a": {"name": "a", "value": 1}}


def test_markdown_table_escapes_pipes() -> None:
    table = report.markdown_table([{"a": "x|y", "b": 2}], ["a", "b"])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| x\\|y | 2 |"]


@pytest.mark.notebook
def test_preflight_reports_ok_and_failed_notebooks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "01_good.ipynb"
    bad = tmp_path / "02_bad.ipynb"
    code_notebook(["from labkit.core.report import record", "record('x', 3)"], good)
    code_notebook(["raise ValueError('boom')"], bad)
    results = preflight.run_all([good, bad], tmp_path / "out", timeout_s=120)
    assert [r.status for r in results] == ["ok", "failed"]
    assert results[0].figures["x"]["value"] == 3
    assert "ValueError: boom" in results[1].error
    printed = capsys.readouterr().out  # the failing cell's error reaches the terminal too
    assert "failed" in printed and "ValueError: boom" in printed
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [n["status"] for n in saved["notebooks"]] == ["ok", "failed"]
    assert "1 of 2 notebooks ran" in (tmp_path / "out" / "report.md").read_text()


def test_run_command_rejects_missing_notebook(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "labkit", "run", str(tmp_path / "nope.ipynb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "no such notebook" in out.stderr


def test_a_table_renders_as_html_and_reads_as_pipe_text() -> None:
    from labkit.core.report import markdown_table, table

    rows = [{"kind": "all-reduce", "bytes": 1024, "note": "a < b | c"}, {"kind": "all-gather"}]
    shown = table(rows, ["kind", "bytes", "note"], caption="DP <H100>")
    assert str(shown) == "DP <H100>:\n" + markdown_table(rows, ["kind", "bytes", "note"])
    html = shown._repr_html_()
    assert html.startswith('<table class="labkit-table"><caption>DP &lt;H100&gt;</caption>')
    assert "<th>kind</th><th>bytes</th><th>note</th>" in html
    assert '<td style="text-align: right">1024</td>' in html  # numbers align right
    assert "<td>a &lt; b | c</td>" in html and "<td></td>" in html  # escaped; missing is empty
    assert html.count("<tr>") == 3


def test_show_table_prints_the_text_form_outside_ipython(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from labkit.core.report import show_table

    show_table([{"a": 1}], ["a"])
    assert capsys.readouterr().out == "| a |\n|---|\n| 1 |\n"
