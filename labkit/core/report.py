"""Tables a lesson shows, and key figures a notebook records for the preflight to read back.

``show_table(rows, columns)`` displays a table the way pandas does: rendered (HTML) in
JupyterLab, nbconvert's HTML, the slides and GitHub, with its plain pipe-text form beside it for
terminals and nbval. ``markdown_table`` is that text form, for text reports.

``record("bf16_tflops", 0.37)`` shows a plain line in the notebook and attaches the value
under a labkit MIME type to the cell's output, so the figure travels inside the executed
``.ipynb``: no side files, no hidden state. No frontend has a renderer for that type, so the
line travels as HTML too: JupyterLab, VS Code and nbconvert show the line, never the JSON or
a "no renderer" notice.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from labkit.core.types import JSON

MIME = "application/vnd.labkit.figure+json"


class Figure(TypedDict):
    """A key figure as it travels in a cell's output."""

    name: str
    value: JSON
    unit: str
    measured: bool


def _plain(value: object) -> JSON:
    """A JSON-friendly copy of ``value`` (numpy and JAX scalars become Python numbers)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, bool, int)) or value is None:
        return value
    if hasattr(value, "item"):  # numpy / JAX scalars
        return _plain(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def figure(name: str, value: object, unit: str = "", measured: bool = True) -> Figure:
    """A key figure as plain JSON-ready data (``measured=False``: a compiled-only fact)."""
    if not name or not name.replace("_", "").replace(".", "").isalnum():
        raise ValueError(f"figure name must be letters, digits, '_' or '.', got {name!r}")
    return {"name": name, "value": _plain(value), "unit": unit, "measured": measured}


def record(name: str, value: object, unit: str = "", measured: bool = True) -> None:
    """Record a key figure of this notebook: shown as one line, carried in the cell output."""
    fig = figure(name, value, unit, measured)
    text = f"recorded {name} = {fig['value']}{' ' + unit if unit else ''}"
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # no IPython: plain Python
        print(text)
        return
    if get_ipython() is None:  # plain Python: just say it
        print(text)
        return
    shown = f'<div class="labkit-record"><code>{html.escape(text)}</code></div>'
    display({"text/plain": text, "text/html": shown, MIME: fig}, raw=True)


def figures(notebook: Mapping[str, Any]) -> dict[str, Figure]:
    """All figures recorded in an executed notebook (nbformat dict), by name."""
    found: dict[str, Figure] = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if MIME in data:
                figure = data[MIME]
                if isinstance(figure, str):
                    figure = json.loads(figure)
                found[figure["name"]] = figure
    return found


def markdown_table(rows: Iterable[Mapping[str, object]], columns: Iterable[str]) -> str:
    """A GitHub-flavoured markdown table of ``rows`` restricted to ``columns``."""
    cols = list(columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        cells = [str(row.get(c, "")).replace("|", "\\|").replace("\n", " ") for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Table:
    """A table of ``rows`` restricted to ``columns``, with an optional caption.

    Jupyter shows its HTML (``_repr_html_``); its text form (``str``) is the caption line and
    the markdown pipe table, what a terminal, a text report and nbval read.
    """

    rows: tuple[Mapping[str, object], ...]
    columns: tuple[str, ...]
    caption: str = ""

    def __str__(self) -> str:
        text = markdown_table(self.rows, self.columns)
        return f"{self.caption}:\n{text}" if self.caption else text

    def _repr_html_(self) -> str:
        def cell(tag: str, value: object) -> str:
            number = isinstance(value, numbers.Number) and not isinstance(value, bool)
            style = ' style="text-align: right"' if number else ""
            return f"<{tag}{style}>{html.escape(str(value))}</{tag}>"

        head = "".join(cell("th", c) for c in self.columns)
        body = "".join(
            "<tr>" + "".join(cell("td", row.get(c, "")) for c in self.columns) + "</tr>"
            for row in self.rows
        )
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return (
            f'<table class="labkit-table">{caption}<thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>"
        )


def table(rows: Iterable[Mapping[str, object]], columns: Iterable[str], caption: str = "") -> Table:
    """A :class:`Table` of ``rows`` restricted to ``columns``."""
    return Table(tuple(rows), tuple(columns), caption)


def show_table(
    rows: Iterable[Mapping[str, object]], columns: Iterable[str], caption: str = ""
) -> None:
    """Display a table: rendered in Jupyter, as its text form in plain Python."""
    shown = table(rows, columns, caption)
    display_rich({"text/plain": str(shown), "text/html": shown._repr_html_()})


def display_rich(bundle: Mapping[str, str]) -> None:
    """Show a MIME bundle: rendered by IPython when it runs, else its ``text/plain`` printed."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # no IPython: plain Python
        print(bundle["text/plain"])
        return
    if get_ipython() is None:
        print(bundle["text/plain"])
        return
    display(dict(bundle), raw=True)
