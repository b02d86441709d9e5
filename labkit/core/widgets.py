"""Text in a widget that headless runs (papermill, ``labkit run``, the notebook tests) survive.

A widget's ``Output`` can capture what a cell prints (``with out: print(...)``,
``out.clear_output()``). Run headless, papermill's executor (nbclient) then mimics the
widget: for every captured output it sends the widget's new state back to the kernel on the
shell channel, from the same event loop that is waiting on that channel for the cell's reply.
With the installed pyzmq (27.3) and jupyter_client (8.10) that send can swallow the socket's
wake-up: the reply arrives, the kernel is idle, and the run waits for ever (measured: 6 of 6
papermill runs of a notebook of 150 such widget cells hung). :func:`show_text` sets what the
widget shows instead: nothing is captured, so nothing is sent back; :func:`show_html` does the
same for a rendered picture or table (HTML, with its text form for terminals).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # ipywidgets is imported by the lessons that draw widgets, not by labkit
    from ipywidgets import Output


def show_text(out: Output, text: str) -> None:
    """Make the ``ipywidgets.Output`` ``out`` show ``text`` (replacing what it showed)."""
    line = text if text.endswith("\n") else text + "\n"
    out.outputs = ({"output_type": "stream", "name": "stdout", "text": line},)


def show_html(out: Output, html: str, text: str) -> None:
    """Make ``out`` show ``html`` rendered (``text``: its plain form, for terminals and tests)."""
    data = {"text/html": html, "text/plain": text}
    out.outputs = ({"output_type": "display_data", "data": data, "metadata": {}},)


def shown_text(out: Output) -> str:
    """The text an ``ipywidgets.Output`` shows: its stream outputs and the plain form of its
    rendered ones, joined."""
    parts = []
    for o in out.outputs:
        if o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        elif o.get("output_type") == "display_data":
            parts.append(o.get("data", {}).get("text/plain", ""))
    return "".join(parts)
