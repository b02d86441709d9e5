"""Execute notebooks headless with papermill and write the instructor's preflight report.

Used by ``make run`` (``python -m labkit run``) and by the notebook tests, so both execute
notebooks the same way.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit.report import figures, markdown_table

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# Per-notebook limit in CPU mode. DESIGN.md: every notebook well under two minutes.
DEFAULT_TIMEOUT_S = 240


def notebooks(root: Path = NOTEBOOKS, solutions: bool = True) -> list[Path]:
    """Every lesson notebook (and solution notebook) under ``root``, found by glob, sorted."""
    found = sorted(p for p in root.glob("*.ipynb"))
    if solutions:
        found += sorted((root / "solutions").glob("*.ipynb"))
    return [p for p in found if ".ipynb_checkpoints" not in p.parts]


@dataclasses.dataclass
class Result:
    """The outcome of executing one notebook."""

    notebook: str
    status: str  # "ok" or "failed"
    seconds: float
    error: str = ""
    figures: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """A flat dict for the report table."""
        env = {k: self.figures.get(k, {}).get("value", "") for k in ("backend", "num_devices")}
        key = [
            f"{f['name']}={f['value']}{f['unit'] and ' ' + f['unit']}"
            + ("" if f["measured"] else " (compiled, not run)")
            for name, f in self.figures.items()
            if name not in env
        ]
        return {
            "notebook": self.notebook,
            "status": self.status,
            "seconds": f"{self.seconds:.1f}",
            **env,
            "key figures": "; ".join(key),
            "error": self.error,
        }


def execute(
    notebook: Path,
    output: Path,
    parameters: Mapping[str, Any] | None = None,
    timeout_s: int = DEFAULT_TIMEOUT_S,
) -> Result:
    """Run ``notebook`` with papermill into ``output``; never raises for a notebook error."""
    import nbformat
    import papermill

    output.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    status, error = "ok", ""
    try:
        papermill.execute_notebook(
            str(notebook),
            str(output),
            parameters=dict(parameters or {}),
            cwd=str(notebook.parent),
            kernel_name="python3",
            execution_timeout=timeout_s,
            progress_bar=False,
            log_output=False,
        )
    except papermill.PapermillExecutionError:
        pass  # papermill also flags cells that fail on purpose: errors are judged below
    except Exception as exc:  # a timeout or a dead kernel: reported, not raised
        status, error = "failed", f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    executed = nbformat.read(output, as_version=4) if output.exists() else None
    if executed is not None and status == "ok":
        error = cell_errors(executed)
        status = "failed" if error else "ok"
    found = figures(executed) if executed is not None else {}
    rel = notebook.relative_to(ROOT) if notebook.is_relative_to(ROOT) else notebook
    return Result(str(rel), status, seconds, error, found)


def cell_errors(notebook: Any) -> str:
    """The first unexpected error in an executed notebook, or ``""``.

    A cell tagged ``raises-exception`` must raise (it shows an error on purpose); any other
    cell must not.
    """
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        on_purpose = "raises-exception" in cell.metadata.get("tags", [])
        if errors and not on_purpose:
            return f"{errors[0].ename}: {errors[0].evalue}"
        if on_purpose and not errors:
            return f"cell tagged raises-exception did not raise: {cell.source[:80]!r}"
    return ""


def run_all(
    paths: Sequence[Path],
    out_dir: Path,
    parameters: Mapping[str, Any] | None = None,
    timeout_s: int = DEFAULT_TIMEOUT_S,
) -> list[Result]:
    """Execute each notebook into ``out_dir`` and write ``report.md`` and ``report.json``."""
    results = []
    for path in paths:
        sub = "solutions" if path.parent.name == "solutions" else ""
        target = out_dir / "executed" / sub / path.name
        result = execute(path, target, parameters, timeout_s)
        print(f"{result.status:>6}  {result.seconds:6.1f} s  {result.notebook}", flush=True)
        results.append(result)
    write_report(results, out_dir)
    return results


def write_report(results: Sequence[Result], out_dir: Path) -> None:
    """Write ``report.json`` (everything) and ``report.md`` (a table) into ``out_dir``."""
    from labkit import env

    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpu_present": env.nvidia_gpu_present(),
        "notebooks": [dataclasses.asdict(r) for r in results],
    }
    (out_dir / "report.json").write_text(json.dumps(payload, indent=2) + "\n")
    ok = sum(r.status == "ok" for r in results)
    columns = ("notebook", "status", "seconds", "backend", "num_devices", "key figures", "error")
    text = (
        f"# Preflight report\n\n{ok} of {len(results)} notebooks ran. "
        f"Generated {payload['generated']}; NVIDIA GPU present: {payload['gpu_present']}.\n"
        "Figures marked 'compiled, not run' come from deviceless H100 compiles: "
        "they describe the program, not a measurement.\n\n"
        + markdown_table([r.row() for r in results], columns)
        + "\n"
    )
    (out_dir / "report.md").write_text(text)


CHECK_MARK = "NBVAL_CHECK_OUTPUT"


def keep_checked_outputs(executed: Path, source: Path) -> int:
    """Copy outputs of ``# NBVAL_CHECK_OUTPUT`` cells from an executed run into ``source``.

    Every other output is stripped, so a notebook stores only what nbval checks. Returns the
    number of cells whose output was kept.
    """
    import nbformat

    ran = nbformat.read(executed, as_version=4)
    nb = nbformat.read(source, as_version=4)
    by_source = {c.source: c for c in ran.cells if c.cell_type == "code"}
    kept = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        if CHECK_MARK in cell.source:
            if cell.source not in by_source:
                raise ValueError(f"{source.name}: checked cell not found in {executed.name}")
            done = by_source[cell.source]
            cell.outputs, cell.execution_count = done.outputs, done.execution_count
            kept += 1
    nbformat.write(nb, source)
    return kept
