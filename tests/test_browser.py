"""The lab in a real browser: JupyterLab as ``make lab`` starts it, driven in headless Chromium.

The server runs on a temporary copy of notebooks/ (no output is written into the repo), on
127.0.0.1, a free port and a random token, with ``tools/jupyter_server_config.json`` (as
``make lab``), and settings from a temporary JUPYTERLAB_SETTINGS_DIR (windowingMode "none",
so every cell is in the page). A kernel check (tests/notebook_files.py: 8 devices, a sum
over them, an H100 compile, a plot, lesson 00's checkers) runs all its cells through the Run
menu; a scratch notebook, created through the contents API, shows an ipywidget. The kit's
pictures are checked the same way, from a small notebook (tests/notebook_files.py) that calls
the drawings of 03, 06 and 08 (and 00's roofline) on small inputs: running those lessons
whole in a browser would cost minutes of compiles, and what could break in the browser is
the drawing, not the inputs. Each picture must render (an image decoded to a non-zero size,
or an SVG grid with its blocks coloured), with its caption; a screenshot of each goes to
build/browser/. (The lessons themselves run under papermill and nbval in
tests/test_notebooks.py.) Server, kernels and
browser are stopped in ``finally`` blocks: no process is left behind.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from chromium import (
    PageLog,
    browser,
    cell_errors,
    fresh_lab,
    needs_chromium,
    start_run_all,
    wait_run_all_passed,
)
from notebook_files import PICTURES, kernel_check_notebook, pictures_notebook

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "browser"
RUN_ALL_TIMEOUT_MS = 180_000  # the kernel check takes 5-15 s here; generous for a loaded CI box
WIDGET_CELL = 'import ipywidgets\n\nipywidgets.IntSlider(value=3, max=8, description="devices")'

pytestmark = [needs_chromium, pytest.mark.notebook]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, data: bytes | None = None, method: str = "GET") -> tuple[int, bytes]:
    """(status, body) of one request; HTTP errors are answers too."""
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Lab:
    """A running JupyterLab server: its base URL, token and notebook folder."""

    def __init__(self, url: str, token: str, root: Path) -> None:
        self.url, self.token, self.root = url, token, root

    def api(self, path: str, data: Any = None, method: str = "GET") -> tuple[int, Any]:
        """Call the REST API with the token; (status, decoded JSON or None)."""
        body = None if data is None else json.dumps(data).encode()
        status, raw = _get(f"{self.url}{path}?token={self.token}", body, method)
        return status, json.loads(raw) if raw.strip().startswith((b"{", b"[")) else None


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """``make lab``'s server on a temporary copy of notebooks/ (outputs cleared)."""
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    fresh_lab(root.glob("*.ipynb"), tmp / "settings")  # no stored outputs to mistake for new
    port, token = _free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
    }
    # As `make lab`: jupyter lab on 127.0.0.1, tools/jupyter_server_config.json, --allow-root
    # as root; here also a chosen port and token, and no browser of its own.
    cmd = [sys.executable, "-m", "jupyter", "lab", "--ip=127.0.0.1", f"--port={port}"]
    cmd += [f"--notebook-dir={root}", f"--config={ROOT / 'tools' / 'jupyter_server_config.json'}"]
    cmd += ["--no-browser", f"--IdentityProvider.token={token}"]
    cmd += ["--allow-root"] if os.geteuid() == 0 else []
    log = (tmp / "server.log").open("w")
    server = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not (_up(port) and _get(f"{url}/api/status?token={token}")[0] == 200):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"jupyter lab did not start:\n{(tmp / 'server.log').read_text()}"
                )
            time.sleep(0.5)
        yield Lab(url, token, root)
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its kernels
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def _up(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def page(lab: Lab) -> Iterator[Any]:
    """One Chromium page, closed with its browser at the end."""
    with browser() as chromium:
        tab = chromium.new_page(viewport={"width": 1400, "height": 1000})
        tab.set_default_timeout(120_000)
        yield tab


def test_server_refuses_requests_without_the_token(lab: Lab) -> None:
    assert _get(f"{lab.url}/api/contents")[0] == 403
    assert _get(f"{lab.url}/api/contents?token=wrong")[0] == 403
    assert lab.api("/api/contents")[0] == 200
    request = urllib.request.Request(f"{lab.url}/lab")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert "/login" in response.url, "/lab without the token must go to the login page"


def _run_all(page: Any, lab: Lab, name: str) -> PageLog:
    """Open ``name`` fresh, wait for its kernel, Run All; every cell must run, none raise."""
    log = PageLog(page)
    try:
        start_run_all(page, f"{lab.url}/lab/tree/{name}?token={lab.token}&reset")
        wait_run_all_passed(page, RUN_ALL_TIMEOUT_MS)
    except Exception:
        OUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUT / f"lab-failed-{Path(name).stem}.png"))
        status = page.locator(".jp-StatusBar-TextItem").all_inner_texts()
        print(f"{name}: status bar {status}; console errors {log.errors[:5]}")
        raise
    return log


def test_the_kernel_check_runs_all_cells_in_chromium(lab: Lab, page: Any) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    kernel_check_notebook(lab.root / "kernel_check.ipynb")
    start = time.perf_counter()
    log = _run_all(page, lab, "kernel_check.ipynb")
    seconds = time.perf_counter() - start
    page.screenshot(path=str(OUT / "lab-kernel_check.png"), full_page=False)
    assert not cell_errors(page), f"cell errors: {cell_errors(page)}"
    outputs = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
    assert "num_devices" in outputs and "backend" in outputs, "the environment table rendered"
    assert "✓ the sum compiled for 8 H100s all-reduces" in outputs, "the H100 compile ran"
    assert "[00.1] to do" in outputs, "lesson 00's checker ran"
    assert page.locator(".jp-OutputArea-output img").count() >= 1, "the plot rendered"
    status, kernels = lab.api("/api/kernels")
    assert status == 200 and kernels, "the kernel is gone"
    assert all(k["execution_state"] == "idle" for k in kernels), kernels
    assert not log.outside(lab.url, "data:", "blob:"), (
        f"requests off the server: {log.outside(lab.url)}"
    )
    print(f"kernel check: all cells ran in the browser in {seconds:.1f} s")


def test_ipywidget_renders_in_chromium(lab: Lab, page: Any) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(WIDGET_CELL)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    model = {"type": "notebook", "format": "json", "content": json.loads(json.dumps(nb))}
    status, answer = lab.api("/api/contents/scratch_widget.ipynb", model, "PUT")
    assert status in (200, 201), answer
    _run_all(page, lab, "scratch_widget.ipynb")
    slider = page.locator(".jupyter-widgets.widget-slider, .jupyter-widgets .widget-slider")
    slider.first.wait_for(state="visible")
    assert "devices" in page.locator(".jupyter-widgets").first.inner_text()
    assert page.locator(".widget-readout").first.inner_text().strip() == "3"
    page.screenshot(path=str(OUT / "lab-widget.png"))
    assert not cell_errors(page), f"cell errors: {cell_errors(page)}"
    assert not (ROOT / "notebooks" / "scratch_widget.ipynb").exists(), "wrote into the repo"


# Per labkit figure in the page: title, image size (0 until decoded), SVG blocks and how many
# distinct fills they show, caption text.
FIGURES_JS = """() => [...document.querySelectorAll('figure.labkit-figure')].map(f => {
  const img = f.querySelector('img');
  const blocks = [...f.querySelectorAll('svg .labkit-block')];
  const fills = new Set(blocks.flatMap(b => [...b.querySelectorAll('rect[fill^="#"]')]
                                        .map(r => getComputedStyle(r).fill)));
  const box = (img || f.querySelector('svg') || f).getBoundingClientRect();
  return {title: (f.querySelector('figcaption b') || {}).textContent || '',
          caption: (f.querySelector('figcaption') || {}).textContent || '',
          image: img ? (img.complete ? img.naturalWidth : 0) : null,
          blocks: blocks.length, fills: fills.size, width: box.width, height: box.height};
})"""


def test_the_kits_pictures_render_in_chromium(lab: Lab, page: Any) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    pictures_notebook(lab.root / "pictures.ipynb")
    _run_all(page, lab, "pictures.ipynb")
    page.wait_for_function(f"() => {FIGURES_JS}().length >= {len(PICTURES)}")  # the widget's too
    page.wait_for_function(f"() => {FIGURES_JS}().every(f => f.image !== 0)")  # images decoded
    found = page.evaluate(FIGURES_JS)
    assert [f["title"] for f in found] == [f"{title}." for title, _ in PICTURES]
    for shown, (title, blocks) in zip(found, PICTURES, strict=True):
        assert shown["width"] > 100 and shown["height"] > 50, (title, shown)
        assert any(c.isdigit() for c in shown["caption"]), f"{title}: no numbers in its caption"
        if blocks is None:
            assert shown["image"] and shown["image"] > 300, f"{title}: no image ({shown})"
        else:  # an SVG grid: every block drawn, one colour per device
            assert (shown["blocks"], shown["fills"]) == (blocks, 8), (title, shown)
    figures = page.locator("figure.labkit-figure")
    for i, (title, _) in enumerate(PICTURES):
        slug = "".join(c if c.isalnum() else "-" for c in title.lower())[:40].strip("-")
        figures.nth(i).screenshot(path=str(OUT / f"picture-{i}-{slug}.png"))
    page.screenshot(path=str(OUT / "lab-pictures.png"), full_page=True)
    outputs = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
    assert page.locator("table.labkit-table").count() >= 1, "the table rendered as a table"
    assert "|---|" not in outputs and "+---" not in outputs, "raw pipe text or ASCII boxes"
    record = page.locator(".labkit-record", has_text="pictures_drawn")  # env's show() records too
    assert record.count() == 1 and record.inner_text() == "recorded pictures_drawn = 6"
    assert "No renderer" not in outputs and "vnd.labkit" not in outputs
    assert not cell_errors(page), f"cell errors: {cell_errors(page)}"
