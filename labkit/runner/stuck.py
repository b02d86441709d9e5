"""What a notebook was doing when its time ran out, and a clean stop of everything it started.

:func:`labkit.runner.preflight.execute` calls :func:`diagnose` before it kills a notebook that
passed its timeout, then :func:`kill_tree`. The diagnosis names the cell papermill marked
"running" in the output notebook (papermill saves it at each cell's start) and shows the
kernel's Python stack, with native frames, from ``py-spy dump --native`` (the ``test``
extra installs py-spy; without it, or where the system forbids attaching to a process, the
report says why and lists the kernel's threads from ``/proc`` instead).

The kernel is not in papermill's process group: jupyter_client starts it in a session of its
own, so killing papermill's group alone would leave a kernel (and its connection file, which
holds the kernel's key) behind.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

PYSPY_TIMEOUT_S = 60.0  # py-spy reads a big process in a few seconds; a busy machine is slower
MAX_STACK_LINES = 120  # per report: enough for the cell's thread, short enough for a CI log
SOURCE_LINES = 3  # first lines of the running cell's source shown
# Python modules of the kernel's own machinery: a thread whose frames all come from these is
# waiting for messages, not running the cell, and is left out of the report.
KERNEL_MACHINERY = (
    "ipykernel",
    "zmq",
    "tornado",
    "asyncio",
    "threading",
    "selectors",
    "jupyter_client",
    "traitlets",
    "concurrent/futures",
    "socket",
)


IDLE_KERNEL = (
    "the kernel's main thread is in its event loop, not in the cell's code: the cell awaits "
    "something (an async cell), or the kernel finished it and papermill missed the reply. A "
    "cell that prints into an ipywidgets.Output can cause the latter (use "
    "labkit.core.widgets.show_text)"
)


@dataclasses.dataclass(frozen=True)
class RunningCell:
    """The cell papermill marked "running" in the output notebook."""

    index: int  # position in the output notebook (papermill's injected cell counts)
    source: str
    running_s: float | None  # since papermill started it, if its start time was saved

    def describe(self) -> str:
        """One header line and the first lines of the source."""
        lines = self.source.splitlines() or [""]
        head = "\n".join(f"    {ln}".rstrip() for ln in lines[:SOURCE_LINES])
        more = len(lines) - SOURCE_LINES
        more_text = f"\n    ... ({more} more lines)" if more > 0 else ""
        since = "" if self.running_s is None else f", running for {self.running_s:.0f} s"
        return f"stuck in cell {self.index}{since}:\n{head}{more_text}"


def running_cell(output: Path) -> RunningCell | None:
    """The cell of ``output`` (a notebook papermill is writing) marked "running", if any."""
    try:
        cells = json.loads(output.read_text()).get("cells", [])
    except (OSError, ValueError):
        return None
    for index, cell in enumerate(cells):
        meta = cell.get("metadata", {}).get("papermill", {})
        if meta.get("status") == "running":
            return RunningCell(index, "".join(cell.get("source", "")), _age(meta.get("start_time")))
    return None


def _age(stamp: str | None) -> float | None:
    from datetime import UTC, datetime

    if not stamp:
        return None
    try:
        started = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if started.tzinfo is None:
        started = started.replace(tzinfo=UTC)
    return (datetime.now(UTC) - started).total_seconds()


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first), read from ``/proc``."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children[ppid].append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


# What a kernel's command line holds: ipykernel's launcher, or the lab's (labkit kernel install).
KERNEL_MARKS = ("ipykernel", "labkit.cli.kernel_start")


def kernels(pid: int) -> list[int]:
    """The Jupyter kernels below ``pid`` (processes running ``ipykernel_launcher`` or the lab's
    ``labkit.cli.kernel_start``)."""
    return [p for p in descendants(pid) if any(m in a for a in _cmdline(p) for m in KERNEL_MARKS)]


def _connection_file(pid: int) -> Path | None:
    args = _cmdline(pid)
    for flag in ("-f", "--f"):
        if flag in args[:-1]:
            return Path(args[args.index(flag) + 1])
    for arg in args:
        if arg.startswith(("-f=", "--f=")):
            return Path(arg.split("=", 1)[1])
    return None


def pyspy() -> str | None:
    """The py-spy executable beside this Python, else on PATH, else None."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def python_stack(pid: int) -> str:
    """The threads of process ``pid`` that run Python code of the notebook, with native frames.

    Threads whose frames all belong to the kernel's own machinery (``KERNEL_MACHINERY``) are
    counted, not shown.
    """
    exe = pyspy()
    if exe is None:
        return "(no py-spy here to read the kernel's stack: it comes with the `test` extra)"
    try:
        run = subprocess.run(
            [exe, "dump", "--native", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=PYSPY_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"(py-spy did not answer within {PYSPY_TIMEOUT_S:g} s)"
    if run.returncode != 0:
        why = (run.stderr.strip() or run.stdout.strip()).splitlines()[-1:] or ["no message"]
        return f"(py-spy could not read the kernel: {why[0]})"
    return _keep_cell_threads(run.stdout)


def _keep_cell_threads(dump: str) -> str:
    blocks = re.split(r"\n(?=Thread \d+ )", dump.strip())
    kept, skipped = [], 0
    for block in blocks:
        if not block.startswith("Thread "):
            continue  # py-spy's header (process, Python version)
        frames = [ln.strip() for ln in block.splitlines()[1:] if "(" in ln]
        python = [f for f in frames if re.search(r"\(.*\.py:\d+\)$", f)]
        main = '"MainThread"' in block.splitlines()[0]
        if main or any(not any(m in f for m in KERNEL_MACHINERY) for f in python):
            kept.append(_above_ipython(block))
        else:
            skipped += 1
    lines = "\n".join(kept).splitlines()
    if len(lines) > MAX_STACK_LINES:
        lines = [*lines[:MAX_STACK_LINES], f"    ... ({len(lines) - MAX_STACK_LINES} more lines)"]
    note = f"\n({skipped} threads of Jupyter's own machinery not shown)" if skipped else ""
    return "\n".join(lines) + note


def _above_ipython(block: str) -> str:
    """The thread's frames down to the cell's code: IPython's and the kernel's below it go."""
    lines = block.splitlines()
    for i, line in enumerate(lines):
        if "InteractiveShell.run_code (" in line:
            return "\n".join(
                [*lines[:i], f"    ... ({len(lines) - i} frames of IPython and ipykernel)"]
            )
    return block


def thread_states(pid: int) -> str:
    """The process's threads grouped by name and state, from ``/proc`` (no tool needed)."""
    counts: collections.Counter[str] = collections.Counter()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (task / "wchan").read_text().strip() if (task / "wchan").exists() else ""
        except OSError:
            continue
        counts[f"{name} [{state}{' ' + wchan if wchan and wchan != '0' else ''}]"] += 1
    return ", ".join(f"{n} x {k}" for k, n in sorted(counts.items())) or "(no threads readable)"


def diagnose(pid: int, output: Path) -> str:
    """What papermill (process ``pid``) was running into ``output``: the cell and the stacks.

    Call it before killing anything: the kernel must still be alive to be read.
    """
    cell = running_cell(output)
    parts = [cell.describe() if cell else "no cell marked running in the output notebook"]
    found = kernels(pid)
    if not found:
        parts.append("(no kernel process found below papermill)")
    for kernel in found:
        stack = python_stack(kernel)
        parts.append(f"kernel process {kernel}, Python stack (py-spy dump --native):")
        parts.append(stack)
        if cell and "IPKernelApp.start" in stack and "run_cell" not in stack:
            parts.append(IDLE_KERNEL)
        parts.append(f"kernel threads (name x count [state]): {thread_states(kernel)}")
    parts.append(f"papermill process {pid}, Python stack:")
    parts.append(python_stack(pid))
    return "\n".join(parts)


def kill_tree(pid: int) -> list[int]:
    """SIGKILL papermill (``pid``, a session leader) and everything below it, kernel included.

    Kills each process group led by one of them (the kernel leads its own), then any
    straggler, and removes what a killed kernel cannot: its connection file and the labkit
    scratch folder named after it (``labkit.core.env.scratch_dir``). Returns the killed pids.
    """
    below = descendants(pid)
    files = [f for p in kernels(pid) if (f := _connection_file(p)) is not None]
    folders = [_tmpdir(p) / f"labkit-scratch-{p}" for p in below]  # env.scratch_dir
    tree = [pid, *below]
    for leader in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(leader) == leader:
                os.killpg(leader, signal.SIGKILL)
    for p in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    wait_gone(tree)
    for f in files:
        f.unlink(missing_ok=True)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    return tree


def _tmpdir(pid: int) -> Path:
    """The temporary folder process ``pid`` uses (its ``TMPDIR``, else the default)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        environ = []
    for item in environ:
        if item.startswith(b"TMPDIR=") and len(item) > 7:
            return Path(item[7:].decode(errors="replace"))
    return Path(tempfile.gettempdir())


def wait_gone(pids: Sequence[int], timeout_s: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` is alive (zombies count as gone); return those still alive."""
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.05)
    return alive


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
