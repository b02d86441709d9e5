"""A notebook stopped for its timeout: the error names the stuck cell and shows the kernel's
stack, and nothing it started is left behind (kernel, its children, connection file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from notebook_files import code_notebook

from labkit.runner import preflight, stuck

TIMEOUT_S = 25  # kernel start and the first cell fit well inside, even on a busy machine


def _notebook(path: Path, cells: list[str]) -> Path:
    code_notebook(cells, path)
    return path


def _alive(pid: int) -> bool:
    return not stuck.wait_gone([pid], timeout_s=0)


def test_timeout_names_the_cell_and_shows_the_sleeping_frame(tmp_path: Path) -> None:
    if stuck.pyspy() is None:
        pytest.fail("py-spy is missing: `make setup` installs it (the `test` extra)")
    facts = tmp_path / "facts.json"
    setup = (
        "import json, os, subprocess, time\n"
        "from ipykernel.connect import get_connection_file\n"
        "child = subprocess.Popen(['sleep', '600'])  # in the kernel's process group\n"
        "loner = subprocess.Popen(['sleep', '600'], start_new_session=True)  # in its own\n"
        f"open({str(facts)!r}, 'w').write(json.dumps({{'kernel': os.getpid(), "
        "'children': [child.pid, loner.pid], 'connection_file': get_connection_file()}))"
    )
    sleeper = "def wait_for_ever():\n    time.sleep(600)\n\n\nwait_for_ever()"
    nb = _notebook(tmp_path / "sleepy.ipynb", [setup, sleeper])

    start = time.monotonic()
    result = preflight.execute(nb, tmp_path / "out.ipynb", timeout_s=TIMEOUT_S)
    took = time.monotonic() - start

    assert result.status == "failed"
    assert took < TIMEOUT_S + stuck.PYSPY_TIMEOUT_S + 30
    error = result.error
    assert error.startswith(f"timed out after {TIMEOUT_S} s (whole notebook); stuck in cell 1")
    assert "    def wait_for_ever():" in error  # the cell's first lines
    assert "wait_for_ever (" in error  # the sleeping frame, from py-spy
    assert "nanosleep" in error  # a native frame under it
    assert "kernel threads (name x count [state]):" in error
    assert stuck.IDLE_KERNEL not in error  # the kernel is busy in the cell
    assert "papermill_execute_cells (" in error  # papermill's own stack, waiting for the cell

    ran = json.loads(facts.read_text())
    for pid in [ran["kernel"], *ran["children"]]:
        assert not _alive(pid), f"process {pid} was left running"
    assert not Path(ran["connection_file"]).exists(), "the kernel's connection file was left"


def test_a_kernel_idle_in_its_event_loop_is_named(tmp_path: Path) -> None:
    nb = _notebook(tmp_path / "waits.ipynb", ["import asyncio", "await asyncio.sleep(600)"])
    result = preflight.execute(nb, tmp_path / "out.ipynb", timeout_s=TIMEOUT_S)
    assert "stuck in cell 1" in result.error
    assert stuck.IDLE_KERNEL in result.error


def test_running_cell_reads_papermill_metadata(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in ("x = 1", "a\nb\nc\nd\ne", "y = 2")]
    for cell, status in zip(nb.cells, ("completed", "running", "pending"), strict=True):
        cell.metadata["papermill"] = {"status": status, "start_time": None}
    nb.cells[1].metadata["papermill"]["start_time"] = "2026-01-01T00:00:00.000000"
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)

    cell = stuck.running_cell(path)
    assert cell is not None and cell.index == 1 and cell.running_s is not None
    text = cell.describe()
    assert text.startswith("stuck in cell 1, running for ")
    assert "    a\n    b\n    c\n    ... (2 more lines)" in text
    assert stuck.running_cell(tmp_path / "missing.ipynb") is None


def test_without_pyspy_the_report_says_so_and_lists_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stuck, "pyspy", lambda: None)
    assert "no py-spy" in stuck.python_stack(os.getpid())
    assert " x " in stuck.thread_states(os.getpid())


@pytest.mark.parametrize(
    ("first_stderr", "runs", "status"),
    [
        ("RuntimeError: Kernel died before replying to kernel_info", 2, "ok"),
        ("NameError: name 'x' is not defined", 1, "failed"),
    ],
)
def test_only_a_kernel_start_race_is_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_stderr: str, runs: int, status: str
) -> None:
    calls: list[float] = []

    def run(cmd: list[str], output: Path, wait_s: float, timeout_s: float) -> tuple[str, ...]:
        calls.append(wait_s)
        return ("failed", first_stderr, first_stderr) if len(calls) == 1 else ("ok", "", "")

    monkeypatch.setattr(preflight, "_run", run)
    result = preflight.execute(tmp_path / "a.ipynb", tmp_path / "out.ipynb", timeout_s=30)
    assert (len(calls), result.status) == (runs, status)
    assert all(0 < w <= 30 for w in calls)  # the second run within the same limit


def test_the_labs_kernel_is_found_as_a_kernel() -> None:
    # the lab's kernel spec runs `python -m labkit.cli.kernel_start`, not ipykernel_launcher
    sleeper = "import time; time.sleep(60)"
    lab = subprocess.Popen([sys.executable, "-c", sleeper, "-m", "labkit.cli.kernel_start"])
    other = subprocess.Popen([sys.executable, "-c", sleeper, "not-a-kernel"])
    try:
        found = stuck.kernels(os.getpid())
        assert lab.pid in found and other.pid not in found
    finally:
        for proc in (lab, other):
            proc.kill()
            proc.wait()
