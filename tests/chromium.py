"""Headless Chromium for the browser tests: Debian's /usr/bin/chromium driven by Playwright.

Playwright's own browser download is never used (``playwright install`` cannot reach its
server here): the tests launch the system Chromium through ``executable_path``. Without it,
or without the ``playwright`` package, the browser tests are skipped with the reason and the
fix (``make browser-deps``, which ``make test`` runs first, installs Chromium as root).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nbformat
import pytest

CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
# As root Chromium needs --no-sandbox; the others keep it off this closed network (no
# background requests to Google's services, no QUIC) and off the GPU.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def skip_reason() -> str | None:
    """Why the browser tests cannot run here (with the fix), or None when they can."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed: run `make setup` (the test extra pins it)"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return (
            f"no Chromium at {CHROMIUM}: run `make browser-deps` as root (Debian's chromium "
            "package), or set LABKIT_CHROMIUM to a Chromium binary"
        )
    return None


needs_chromium = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


@contextmanager
def browser() -> Iterator[Any]:
    """A headless Chromium (Playwright ``Browser``), always closed, with its driver."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


class PageLog:
    """What a page did: console errors, uncaught exceptions, and every request's URL."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        page.on("request", lambda r: self.requests.append(r.url))

    def outside(self, *schemes: str) -> list[str]:
        """Requests whose URL starts with none of ``schemes`` (data: URLs are inline)."""
        return [u for u in self.requests if not u.startswith((*schemes, "data:"))]


# JupyterLab in the page. Kernel idle: the status bar's kernel item ends in "| Idle" (the
# execution indicator says idle too early). All ran: every code cell's prompt holds a number.
IDLE = (
    "[...document.querySelectorAll('.jp-StatusBar-TextItem')]"
    ".some(e => /\\| Idle$/.test(e.textContent.trim()))"
)
ALL_RAN = (
    "[...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')]"
    ".every(p => /\\[\\d+\\]/.test(p.textContent))"
    " && document.querySelectorAll('.jp-Notebook .jp-CodeCell').length > 0"
)
# Run All has ended: the kernel is idle with no cell queued ([*]), and either every cell ran
# or one raised (JupyterLab then stops and leaves the rest unrun).
ENDED = (
    f"{IDLE} && ![...document.querySelectorAll('.jp-InputArea-prompt')]"
    ".some(p => p.textContent.includes('*')) && "
    f"({ALL_RAN} || !!document.querySelector('.jp-OutputArea-output[data-mime-type="
    '"application/vnd.jupyter.stderr"]\'))'
)
# Lab settings for a browser test: every cell in the page (windowingMode "none"), and no
# news or update checks (the lab is offline). Values: file name -> JSON under the settings dir.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


def clear_outputs(path: Path) -> None:
    """Drop a notebook's stored outputs (a fresh start: none to mistake for new ones).

    jupytext pairs NN.ipynb with NN.md; the .md is touched so it stays the newer source.
    """
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, path)
    if path.with_suffix(".md").exists():
        os.utime(path.with_suffix(".md"))


def fresh_lab(notebooks: Iterable[Path], settings: Path) -> None:
    """A lab as a learner first meets it: ``notebooks`` without stored outputs, and
    :data:`LAB_SETTINGS` written into the JupyterLab settings folder ``settings``."""
    for path in notebooks:
        clear_outputs(path)
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))


def start_run_all(page: Any, url: str) -> None:
    """Open the notebook at ``url`` fresh, wait for its kernel, and click Run All."""
    page.goto(url)
    page.wait_for_function(f"() => {IDLE} || !!document.querySelector('.jp-Dialog')")
    if page.locator(".jp-Dialog", has_text="Select Kernel").count():
        page.locator(".jp-Dialog .jp-mod-accept").click()  # the lab's default kernel
        page.wait_for_function(f"() => {IDLE}")
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()


def wait_run_all_passed(page: Any, timeout_ms: int) -> None:
    """Wait until Run All has ended (a raising cell ends it at once); fail with the rendered
    errors if a cell raised, or if a cell shows no execution count (``[ ]:`` or ``[*]:``)."""
    page.wait_for_function(f"() => {ENDED}", timeout=timeout_ms)
    assert not cell_errors(page), f"cell errors: {cell_errors(page)}"
    assert page.evaluate(f"() => {ALL_RAN}"), "Run All ended before every cell ran"


def cell_errors(page: Any) -> list[str]:
    """Tracebacks and error outputs rendered in the notebook."""
    stderr = page.locator(
        '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
    ).all_inner_texts()
    return [t[:500] for t in stderr if "Traceback" in t or "Error" in t.split("\n")[0]]
