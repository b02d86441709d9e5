"""One offline reveal.js deck per lesson notebook: ``make slides`` -> ``slides/NN_topic.html``.

The decks are generated from the notebooks themselves, so the code on a slide is the code CI
runs. The slide structure is derived at build time, not stored in the notebooks:

- the first markdown cell's title and first paragraph (the goal) are the title slide;
- a markdown cell opening with a ``#`` or ``##`` heading starts a slide, ``###`` a sub-slide;
- an explanation and the code cell after it share a sub-slide (code, then its output);
  text after a code cell, or a second code cell, starts a new sub-slide;
- the ``Exercises`` section moves to the end, so every deck ends with the exercises;
- the parameters cell, import-only cells, stderr and live-widget outputs are left out.

Outputs (tables, plots) come from an executed copy: ``build/executed/NN_topic.ipynb`` from
``make run`` when it is newer than the notebook, else the notebook is executed once with
``labkit.runner.preflight.execute`` into ``build/slides/executed/`` (kept for the next build).
``--stored`` builds from the notebooks as stored (only checked outputs: fast, no figures).

Nothing is loaded from a CDN: reveal.js, require.js, jQuery and MathJax are pinned npm
packages, fetched once with ``npm pack`` into ``slides/vendor/`` (not committed), and the
template ``slides/deck.html.j2`` drops nbconvert's mermaid and widget-manager blocks.
This is build tooling for instructors, not part of the ``labkit`` package (which never
needs npm or nbconvert's exporters), hence ``tools/``.
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
from nbconvert.exporters import SlidesExporter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout: labkit is importable

from labkit.runner import preflight  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
SLIDES = ROOT / "slides"
VENDOR = SLIDES / "vendor"
TEMPLATE = SLIDES / "deck.html.j2"
EXECUTED = ROOT / "build" / "executed"  # written by `make run`
CACHE = ROOT / "build" / "slides" / "executed"

# Pinned front-end packages (npm registry). reveal.js 5+ breaks nbconvert 7's reveal template.
ASSETS = {"reveal.js": "4.6.0", "requirejs": "2.3.7", "jquery": "3.7.1", "mathjax": "2.7.9"}
# MathJax 2 ships PNG fonts and unpacked sources that a browser with web fonts never loads.
_SKIP = re.compile(
    r"^package/(unpacked|test|docs|fonts/HTML-CSS/(?!TeX/)|fonts/HTML-CSS/TeX/(png|eot|otf|svg))"
)
HIDDEN_TAGS = {"parameters", "injected-parameters", "remove-cell", "remove_cell"}
WIDGET_MIMES = ("application/vnd.jupyter.widget-view+json",)
_HEADING = re.compile(r"^\s*(#{1,6})\s+(.*)")
EXERCISES = r"(\d+\s*[.·]\s*)?exercises?\b"  # "## Exercises", "## 7. Exercises", "## 8 · Exercises"


class SlidesError(RuntimeError):
    """A deck could not be built (the message says what to do)."""


def fetch_assets(vendor: Path = VENDOR) -> Path:
    """Unpack the pinned npm packages into ``vendor`` (once; skipped when already there)."""
    for name, version in ASSETS.items():
        target = vendor / name
        stamp = target / ".labkit-version"
        if stamp.exists() and stamp.read_text().strip() == version:
            continue
        npm = shutil.which("npm")
        if npm is None:
            raise SlidesError(
                "npm not found: the decks' reveal.js, require.js, jQuery and MathJax come from "
                "pinned npm packages. Install Node.js with npm (Debian: apt-get install npm)."
            )
        with tempfile.TemporaryDirectory() as tmp:
            spec = f"{name}@{version}"
            proc = subprocess.run(
                [npm, "pack", spec, "--silent", "--pack-destination", tmp],
                capture_output=True,
                text=True,
                check=False,
            )
            tarballs = list(Path(tmp).glob("*.tgz"))
            if proc.returncode != 0 or not tarballs:
                raise SlidesError(f"`npm pack {spec}` failed: {proc.stderr.strip()[-500:]}")
            shutil.rmtree(target, ignore_errors=True)
            with tarfile.open(tarballs[0]) as tar:
                members = [
                    m
                    for m in tar.getmembers()
                    if m.name.startswith("package/") and not _SKIP.match(m.name)
                ]
                for m in members:
                    m.name = m.name[len("package/") :]
                tar.extractall(target, members=[m for m in members if m.name], filter="data")
        stamp.write_text(version + "\n")
    return vendor


def _heading(cell: nbformat.NotebookNode) -> tuple[int, str] | None:
    """(level, text) of a markdown cell that opens with a heading, else None."""
    if cell.cell_type != "markdown":
        return None
    match = _HEADING.match(cell.source)
    return (len(match.group(1)), match.group(2).strip()) if match else None


def _split_at_headings(cell: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """A markdown cell cut before every heading inside it (outside code fences)."""
    if cell.cell_type != "markdown":
        return [cell]
    chunks: list[list[str]] = [[]]
    fenced = False
    for line in cell.source.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        if not fenced and _HEADING.match(line) and any(s.strip() for s in chunks[-1]):
            chunks.append([])
        chunks[-1].append(line)
    if len(chunks) == 1:
        return [cell]
    parts = []
    for number, lines in enumerate(chunks):
        part = copy.deepcopy(cell)
        part.source = "\n".join(lines).strip("\n")
        if "id" in part:
            part.id = f"{cell.id}-{number}"
        parts.append(part)
    return parts


def _import_only(cell: nbformat.NotebookNode) -> bool:
    """True for a code cell made only of import statements (noise on a slide)."""
    try:
        body = ast.parse(cell.source).body
    except SyntaxError:  # IPython magics: keep the cell
        return False
    return bool(body) and all(isinstance(n, ast.Import | ast.ImportFrom) for n in body)


def _clean_outputs(cell: nbformat.NotebookNode) -> None:
    """Drop stderr streams and live-widget views (a deck has no kernel); keep the rest."""
    kept = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream" and out.name == "stderr":
            continue
        if "data" in out:
            for mime in WIDGET_MIMES:
                out.data.pop(mime, None)
            if not out.data:
                continue
        kept.append(out)
    cell.outputs = kept


def _sections(cells: list[nbformat.NotebookNode]) -> list[list[nbformat.NotebookNode]]:
    """Split cells at each ``#``/``##`` heading (the first chunk may have none)."""
    sections: list[list[nbformat.NotebookNode]] = [[]]
    for cell in cells:
        head = _heading(cell)
        if head and head[0] <= 2 and sections[-1]:
            sections.append([])
        sections[-1].append(cell)
    return [s for s in sections if s]


def _is_exercises(section: list[nbformat.NotebookNode]) -> bool:
    head = _heading(section[0])
    return head is not None and re.match(EXERCISES, head[1], re.IGNORECASE) is not None


def derive(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``nb`` with slide types derived from its headings (see the module doc)."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)  # saved widget state would pull the CDN widget manager
    cells = []
    for cell in (part for c in nb.cells for part in _split_at_headings(c)):
        if cell.cell_type == "raw" or HIDDEN_TAGS & set(cell.metadata.get("tags", [])):
            continue
        if cell.cell_type == "code":
            if _import_only(cell) or not cell.source.strip():
                continue
            _clean_outputs(cell)
        cells.append(cell)
    if not cells or cells[0].cell_type != "markdown":
        raise SlidesError("the notebook must open with a markdown cell: its title and goal")
    title = cells[0]
    paragraphs = title.source.strip().split("\n\n")
    if _heading(title) and len(paragraphs) > 2:  # the title slide: title and goal only
        rest = copy.deepcopy(title)
        title.source, rest.source = "\n\n".join(paragraphs[:2]), "\n\n".join(paragraphs[2:])
        if "id" in rest:
            rest.id = f"{title.id}-more"
        cells.insert(1, rest)
    sections = _sections(cells)
    exercises = [s for s in sections if _is_exercises(s)]
    if not exercises:
        raise SlidesError("no `## Exercises` section: every deck ends with the exercises")
    ordered = [s for s in sections if not _is_exercises(s)] + exercises
    previous: nbformat.NotebookNode | None = None
    for index, cell in enumerate(c for s in ordered for c in s):
        head = _heading(cell)
        if index == 0 or (head and head[0] <= 2):
            kind = "slide"
        elif index == 1:
            kind = "subslide"  # what follows the goal starts the section's steps
        elif head:
            kind = "subslide"
        elif cell.cell_type == "code":
            kind = "-" if previous is not None and previous.cell_type == "markdown" else "subslide"
        else:
            kind = "subslide" if previous is not None and previous.cell_type == "code" else "-"
        cell.metadata["slideshow"] = {"slide_type": kind}
        previous = cell
    nb.cells = [c for s in ordered for c in s]
    return nb


def missing_kernel(notebook: Path) -> str | None:
    """The notebook's kernel name when this environment has no such kernel, else None."""
    from jupyter_client.kernelspec import KernelSpecManager

    name = nbformat.read(notebook, as_version=4).metadata.get("kernelspec", {}).get("name")
    return name if name and name not in KernelSpecManager().find_kernel_specs() else None


def executed_copy(notebook: Path, stored: bool = False, timeout_s: float = 300) -> Path:
    """The executed notebook to build from: ``make run``'s, a cached one, or a fresh run."""
    if stored:
        return notebook
    for candidate in (EXECUTED / notebook.name, CACHE / notebook.name):
        if candidate.exists() and candidate.stat().st_mtime >= notebook.stat().st_mtime:
            return candidate
    result = preflight.execute(notebook, CACHE / notebook.name, timeout_s=timeout_s)
    if result.status != "ok":
        (CACHE / notebook.name).unlink(missing_ok=True)  # never reuse a half-run notebook
        raise SlidesError(f"{notebook.name} failed to execute: {result.error}")
    return CACHE / notebook.name


def build_deck(source: Path, out_dir: Path, vendor: Path = VENDOR, name: str | None = None) -> Path:
    """Write ``out_dir/<name>.html``, a reveal.js deck of ``source`` that loads only local files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = Path(os.path.relpath(vendor, out_dir)).as_posix()
    exporter = SlidesExporter(
        template_file=str(TEMPLATE),
        reveal_url_prefix=f"{prefix}/reveal.js",
        reveal_theme="white",  # "simple" imports web fonts from Google
        reveal_scroll=True,  # a long output scrolls instead of running off the slide
        reveal_number="c/t",
        require_js_url=f"{prefix}/requirejs/require.js",
        jquery_url=f"{prefix}/jquery/dist/jquery.min.js",
        mathjax_url=f"{prefix}/mathjax/MathJax.js?config=TeX-AMS_HTML-full,Safe",
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    nb = derive(nbformat.read(source, as_version=4))
    stem = name or source.stem
    html, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": stem}})
    if re.search(r"""(src|href)=["']https?://""", html):
        raise SlidesError(f"{stem}: the deck still loads something from the network")
    target = out_dir / f"{stem}.html"
    target.write_text(html)
    return target


def build_all(
    notebooks: Sequence[Path],
    out_dir: Path = SLIDES,
    stored: bool = False,
    jobs: int = 2,
    timeout_s: float = preflight.DEFAULT_TIMEOUT_S,
) -> list[tuple[Path, float, str]]:
    """Build one deck per notebook (executing at most ``jobs`` at a time).

    Returns ``(deck, seconds, note)``; a notebook whose kernel this environment lacks (02b's
    PyTorch kernel before ``make setup-torch``) is built from its stored outputs, and the
    note says so.
    """
    vendor = fetch_assets()

    def one(notebook: Path) -> tuple[Path, float, str]:
        start = time.perf_counter()
        kernel = None if stored else missing_kernel(notebook)
        source = executed_copy(notebook, stored or kernel is not None, timeout_s)
        deck = build_deck(source, out_dir, vendor, notebook.stem)
        note = (
            f"not run: no kernel {kernel!r} here (02b's is `make setup-torch`); "
            "built from the stored notebook, without figures"
            if kernel
            else ""
        )
        return deck, time.perf_counter() - start, note

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, notebooks))


def main(argv: Sequence[str] | None = None) -> int:
    """``python tools/slides.py [NOTEBOOK...] [--out DIR] [--stored] [--jobs N]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/[0-9]*.ipynb")
    parser.add_argument("--out", type=Path, default=SLIDES, help="where the decks go")
    parser.add_argument("--stored", action="store_true", help="no execution: stored outputs only")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks executed at once")
    parser.add_argument(
        "--timeout", type=float, default=preflight.DEFAULT_TIMEOUT_S, help="seconds per notebook"
    )
    args = parser.parse_args(argv)
    chosen = [p.resolve() for p in args.notebooks] or sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    missing = [str(p) for p in chosen if not p.exists()]
    if missing or not chosen:
        print(
            f"error: no such notebook: {', '.join(missing) or 'notebooks/[0-9]*.ipynb'}",
            file=sys.stderr,
        )
        return 1
    try:
        built = build_all(chosen, args.out, args.stored, args.jobs, args.timeout)
    except SlidesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for deck, seconds, note in built:
        shown = deck.relative_to(Path.cwd()) if deck.is_relative_to(Path.cwd()) else deck
        print(f"{shown}  ({seconds:.1f} s)" + (f"  {note}" if note else ""))
    print(f"{len(built)} decks; open one in a browser (no network needed): arrow keys to move.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
