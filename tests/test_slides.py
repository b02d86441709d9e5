"""Slides: one offline reveal.js deck per notebook (tools/slides.py, ``make slides``).

The slide structure is derived from each notebook's headings, for every notebook found by
glob. Decks are built once per test session into build/test-slides/: every notebook from
its stored copy (the structure, offline, in a browser), and 00_welcome from an executed
copy as well (its figures and tables appear on the slides). Executing every notebook again
for slides would add minutes to ``make test``; the structure does not depend on outputs.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from chromium import PageLog, browser, needs_chromium

from labkit.runner import preflight

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
OUT = ROOT / "build" / "test-slides"
EXECUTED = "00_welcome"  # the deck also built from an executed run (it has a plot)
MIN_SLIDES = 8


def _load_tool() -> Any:
    spec = importlib.util.spec_from_file_location("labkit_slides", ROOT / "tools" / "slides.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["labkit_slides"] = module
    spec.loader.exec_module(module)
    return module


slides = _load_tool()
needs_npm = pytest.mark.skipif(
    not (slides.VENDOR / "reveal.js").exists() and shutil.which("npm") is None,
    reason="npm not found: the decks' reveal.js comes from a pinned npm package",
)


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


@pytest.fixture(scope="module")
def vendor() -> Path:
    """The pinned reveal.js, require.js, jQuery and MathJax (npm, once, not committed)."""
    return slides.fetch_assets()


@pytest.fixture(scope="module")
def executed_deck(vendor: Path) -> Path:
    """00_welcome executed once with the papermill CLI, then built into a deck."""
    source = ROOT / "notebooks" / f"{EXECUTED}.ipynb"
    run = preflight.execute(source, OUT / "executed" / source.name)
    assert run.status == "ok", run.error
    return slides.build_deck(OUT / "executed" / source.name, OUT, vendor, f"{EXECUTED}-executed")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One headless Chromium for every deck."""
    with browser() as launched:
        yield launched


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_structure_is_derived_from_headings(path: Path) -> None:
    nb = slides.derive(nbformat.read(path, as_version=4))
    kinds = [c.metadata["slideshow"]["slide_type"] for c in nb.cells]
    first = nb.cells[0]
    assert kinds[0] == "slide" and first.cell_type == "markdown"
    assert first.source.startswith("# "), "the title slide opens with the notebook's title"
    starts = [c for c, k in zip(nb.cells, kinds, strict=True) if k == "slide"]
    assert re.match(r"##\s+(\d+\s*[.·]\s*)?Exercises", starts[-1].source), "ends with the exercises"
    assert any("answer_" in c.source for c in nb.cells[nb.cells.index(starts[-1]) :])
    for cell, kind in zip(nb.cells, kinds, strict=True):
        tags = set(cell.metadata.get("tags", []))
        assert not tags & slides.HIDDEN_TAGS, "the parameters cell is not shown"
        assert not any(o.get("name") == "stderr" for o in cell.get("outputs", []))
        if cell.cell_type == "markdown" and re.match(r"#{1,2}\s", cell.source):
            assert kind == "slide", f"a heading starts a slide: {cell.source[:40]!r}"
    assert len(nb.cells) >= MIN_SLIDES


def test_headings_inside_a_cell_are_split() -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# T\n\n**Goal.** g"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("text\n\n## Exercises\n\n**1** q\n```\n# not a heading\n```"),
        nbformat.v4.new_code_cell("answer_1 = ..."),
        nbformat.v4.new_markdown_cell("## Summary"),
    ]
    derived = slides.derive(nb)
    sources = [c.source.splitlines()[0] for c in derived.cells]
    assert sources == ["# T", "x = 1", "text", "## Summary", "## Exercises", "answer_1 = ..."]
    assert "# not a heading" in derived.cells[4].source
    with pytest.raises(slides.SlidesError, match="Exercises"):
        slides.derive(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T")]))


@needs_npm
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_deck_loads_nothing_from_the_network(path: Path, vendor: Path) -> None:
    html = slides.build_deck(path, OUT, vendor, path.stem).read_text()
    assert not re.search(r"""(src|href)=["']https?://""", html)
    assert "mermaid" not in html.lower()
    assert "vendor/reveal.js/dist/reveal.js" in html


@needs_npm
@pytest.mark.notebook
def test_executed_deck_shows_figures(executed_deck: Path, vendor: Path) -> None:
    html = executed_deck.read_text()
    assert html.count('src="data:image/png;base64,') >= 1, "the notebook's plot is on a slide"
    assert html.count('<figure class="labkit-figure"') >= 2, "both rooflines, as kit pictures"
    assert "<figcaption" in html and "ridge at 295 FLOPs/byte" in html, "with their captions"
    assert re.search(r"num_devices\s+8", html), "the environment report is on a slide"
    stored = slides.build_deck(ROOT / "notebooks" / f"{EXECUTED}.ipynb", OUT, vendor).read_text()
    assert 'src="data:image/png;base64,' not in stored  # only the executed copy has plots


def _open_deck(chromium: Any, deck: Path) -> tuple[dict[str, Any], PageLog]:
    """Open ``deck``, wait for reveal.js, screenshot the title slide; (facts, page log)."""
    page = chromium.new_page(viewport={"width": 1280, "height": 800})
    page.set_default_timeout(60_000)
    log = PageLog(page)
    try:
        page.goto(deck.as_uri())
        # Reveal is no global: ask require.js for the very module the deck loaded.
        module = page.evaluate(
            "() => document.querySelector('link[href$=\"dist/reveal.css\"]')"
            ".getAttribute('href').replace(/css$/, 'js')"
        )
        facts = page.evaluate(
            """m => new Promise(ok => require([m], R => {
                const done = () => {
                    const h = R.getHorizontalSlides();
                    ok({total: R.getTotalSlides(), first: h[0].textContent,
                        last: h[h.length - 1].textContent});
                };
                R.isReady() ? done() : R.on('ready', done);
            }))""",
            module,
        )
        page.screenshot(path=str(deck.with_suffix(".png")))
    finally:
        page.close()
    return facts, log


def _check_render(deck: Path, facts: dict[str, Any], log: PageLog) -> None:
    assert facts["total"] >= MIN_SLIDES, f"{deck.name}: {facts['total']} slides"
    assert "Exercises" in facts["last"], "the last slide is not the exercises"
    assert facts["first"].strip(), "empty title slide"
    assert not log.errors, f"console errors: {log.errors}"
    assert not log.outside("file://"), f"network requests: {log.outside('file://')}"
    assert deck.with_suffix(".png").stat().st_size > 10_000, "blank screenshot"


@needs_npm
@needs_chromium
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_deck_renders_offline_in_chromium(path: Path, vendor: Path, chromium: Any) -> None:
    deck = slides.build_deck(path, OUT, vendor, path.stem)
    _check_render(deck, *_open_deck(chromium, deck))


@needs_npm
@needs_chromium
@pytest.mark.notebook
def test_executed_deck_renders_offline_in_chromium(executed_deck: Path, chromium: Any) -> None:
    _check_render(executed_deck, *_open_deck(chromium, executed_deck))


@needs_npm
def test_a_notebook_whose_kernel_is_missing_is_built_stored_and_says_so(tmp_path: Path) -> None:
    nb = nbformat.read(ROOT / "notebooks" / "00_welcome.ipynb", as_version=4)
    nb.metadata["kernelspec"] = {
        "name": "no-such-kernel",
        "display_name": "x",
        "language": "python",
    }
    path = tmp_path / "99_missing_kernel.ipynb"
    nbformat.write(nb, path)
    assert slides.missing_kernel(path) == "no-such-kernel"
    assert slides.missing_kernel(ROOT / "notebooks" / "00_welcome.ipynb") is None
    ((deck, _, note),) = slides.build_all([path], tmp_path / "decks")  # nothing executed
    assert deck.exists() and "not run: no kernel 'no-such-kernel'" in note
    assert not (slides.CACHE / path.name).exists()
