"""Execute notebooks headless with the plain papermill CLI and write the preflight report.

Used by ``make run`` (``labkit run``) and by the notebook tests: both run papermill exactly as
a user's own CI would (``python -m papermill IN OUT -y PARAMS``), in a subprocess, and take
its exit code as the verdict. Nothing here second-guesses papermill.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit.core.report import Figure, figures, markdown_table
from labkit.core.types import JSON
from labkit.runner.stuck import diagnose, kill_tree

# Whole-notebook limit: a hang guard, well above the 60 s each notebook aims for in CPU mode
# (`make bench` prints the real times against that budget).
DEFAULT_TIMEOUT_S = 300


def notebooks_dir(start: Path | None = None) -> Path:
    """The lab's ``notebooks/`` folder: ``$LABKIT_NOTEBOOKS``, else found from ``start``
    (default: the working directory) upwards, else beside an editable install of labkit."""
    if env := os.environ.get("LABKIT_NOTEBOOKS"):
        return Path(env).resolve()
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "notebooks").is_dir() and any((folder / "notebooks").glob("*.ipynb")):
            return folder / "notebooks"
        if folder.name == "notebooks" and any(folder.glob("*.ipynb")):
            return folder
    beside = Path(__file__).resolve().parents[2] / "notebooks"
    if beside.is_dir():
        return beside
    raise FileNotFoundError(
        "no notebooks/ folder found from the working directory upwards; run from the lab "
        "kit's checkout or set LABKIT_NOTEBOOKS=/path/to/notebooks"
    )


def notebooks(root: Path | None = None, solutions: bool = True) -> list[Path]:
    """Every lesson notebook (and solution notebook) under ``root``, found by glob, sorted."""
    root = notebooks_dir() if root is None else root
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
    figures: dict[str, Figure] = dataclasses.field(default_factory=dict)

    def row(self) -> dict[str, JSON]:
        """A flat dict for the report table."""
        env: dict[str, JSON] = {
            k: self.figures[k]["value"] if k in self.figures else ""
            for k in ("backend", "num_devices")
        }
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


def papermill_command(
    notebook: Path,
    output: Path,
    parameters: Mapping[str, JSON] | None = None,
    papermill_args: Sequence[str] = (),
    cwd: Path | None = None,
) -> list[str]:
    """The plain papermill CLI call for one notebook.

    ``parameters`` go as one ``-y`` (YAML, which JSON is); ``papermill_args`` (``-p NAME
    VALUE``, ``-y YAML``, as a user typed them) follow unchanged, so papermill's rules apply.
    The kernel runs in ``cwd``, by default the notebook's folder.
    """
    cmd = [sys.executable, "-m", "papermill", str(notebook), str(output)]
    cmd += ["--cwd", str(cwd or notebook.parent), "--no-progress-bar", "--log-level", "ERROR"]
    if parameters:
        cmd += ["-y", json.dumps(dict(parameters))]
    return cmd + list(papermill_args)


def execute(
    notebook: Path,
    output: Path,
    parameters: Mapping[str, JSON] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    papermill_args: Sequence[str] = (),
    cwd: Path | None = None,
) -> Result:
    """Run ``notebook`` with the papermill CLI into ``output``; its exit code is the verdict.

    ``timeout_s`` bounds the whole notebook: past it the error names the cell that was
    running and shows the kernel's stack (:mod:`labkit.runner.stuck`), then papermill, its
    kernel and their children are killed, and the run counts as failed. ``papermill_args``
    are extra papermill CLI arguments (``-p NAME VALUE``, ``-y YAML``), passed unchanged;
    ``cwd`` is the kernel's working directory (default: the notebook's folder).
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    cmd = papermill_command(notebook, output, parameters, papermill_args, cwd)
    start = time.perf_counter()
    status, error, stderr = _run(cmd, output, timeout_s, timeout_s)
    # jupyter_client picks a kernel's ports before the kernel binds them: two kernels started
    # at the same moment can pick the same port, and one dies before it answers. No cell ran
    # then; start it once more, within the same time limit.
    if status == "failed" and KERNEL_START_RACE in stderr:
        left = timeout_s - (time.perf_counter() - start)
        status, error, _ = _run(cmd, output, left, timeout_s)
    seconds = time.perf_counter() - start
    found = figures(_read(output)) if output.exists() else {}
    return Result(_name(notebook), status, seconds, error, found)


KERNEL_START_RACE = "Kernel died before replying to kernel_info"


def _run(cmd: list[str], output: Path, wait_s: float, timeout_s: float) -> tuple[str, str, str]:
    """One papermill run, stopped after ``wait_s``: ``(status, error, stderr)``."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = proc.communicate(timeout=max(wait_s, 1.0))
    except subprocess.TimeoutExpired:
        where = diagnose(proc.pid, output)  # the running cell and the kernel's stack
        kill_tree(proc.pid)  # papermill, its kernel (a session of its own) and theirs
        _, stderr = proc.communicate()
        return "failed", f"timed out after {timeout_s:g} s (whole notebook); {where}", stderr
    if proc.returncode == 0:
        return "ok", "", stderr
    return "failed", _error_of(output, stderr), stderr


def _name(notebook: Path) -> str:
    root = notebook.resolve().parent
    if root.name == "solutions":
        root = root.parent
    return str(notebook.resolve().relative_to(root.parent))


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _error_of(output: Path, stderr: str) -> str:
    """The failing cell's error from the executed notebook, else papermill's last words."""
    for cell in _read(output).get("cells", []):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                source = "".join(cell.get("source", ""))[:200]
                return f"{out.get('ename')}: {out.get('evalue')}\n  in cell: {source!r}"
    if "No such kernel named labkit-torch" in stderr:  # one line: the fix, no traceback
        return (
            "this notebook runs in PyTorch's kernel (labkit-torch), not installed here: "
            "build it with `make setup-torch`"
        )
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-5:]) or "papermill failed without a message"


class Busy(RuntimeError):
    """Another ``labkit run`` writes to the same report folder now."""


@contextlib.contextmanager
def only_run(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir`` for this run alone (a lock on the folder, released at exit, even on
    a crash): two runs into one folder would mix their reports and executed notebooks."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(
                f"another `labkit run` is writing to {out_dir}/ now: wait for it, or give "
                f"this run a folder of its own (--out {out_dir}-2)"
            ) from None
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def scratch_space() -> Iterator[Path]:
    """A temporary folder for one notebook run, removed afterwards, also after a failure or
    a timeout: papermill and its kernel get it as ``TMPDIR`` (their temporary files) and
    ``JUPYTER_RUNTIME_DIR`` (the kernel's connection file, which holds its key)."""
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "JUPYTER_RUNTIME_DIR")}
    with tempfile.TemporaryDirectory(prefix="labkit-run-", ignore_cleanup_errors=True) as tmp:
        os.environ.update(TMPDIR=tmp, JUPYTER_RUNTIME_DIR=str(Path(tmp) / "runtime"))
        try:
            yield Path(tmp)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def run_all(
    paths: Sequence[Path],
    out_dir: Path,
    parameters: Mapping[str, JSON] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    papermill_args: Sequence[str] = (),
) -> list[Result]:
    """Execute each notebook into ``out_dir`` and write ``report.md`` and ``report.json``.

    Prints one line per notebook and, for a failed one, the failing cell's error. Holds
    ``out_dir`` for this run alone (:func:`only_run`); each notebook runs with a temporary
    folder of its own that is gone afterwards (:func:`scratch_space`).
    """
    results = []
    with only_run(out_dir):
        for path in paths:
            sub = "solutions" if path.parent.name == "solutions" else ""
            target = out_dir / "executed" / sub / path.name
            with scratch_space():
                result = execute(path, target, parameters, timeout_s, papermill_args)
            went = f"  -> {target}" if target.exists() else ""
            print(
                f"{result.status:>6}  {result.seconds:6.1f} s  {result.notebook}{went}", flush=True
            )
            if result.error:
                print("        " + result.error.replace("\n", "\n        "), flush=True)
            results.append(result)
        write_report(results, out_dir)
    return results


def write_report(results: Sequence[Result], out_dir: Path) -> None:
    """Write ``report.json`` (everything) and ``report.md`` (a table) into ``out_dir``."""
    from labkit.core import env

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
