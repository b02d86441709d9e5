"""Run the kit's SLURM recipes on a cluster and read back what happened.

:func:`run_batch` submits a batch script (its exact text) and waits for the job;
:func:`run_step` runs one ``srun`` line as typed in a shell, timestamping each line of
output, and can ``scancel`` the job when a line matches; :func:`run_steps` runs several at
once. Both return the tasks' result lines (:func:`labkit.parallel.cluster.task_results`) and
what ``srun`` said about each task's end (:func:`task_ends`). The cluster is a
:class:`labkit.parallel.local_slurm.LocalSlurm` (its ``client`` prefix reaches the controller).
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from labkit.parallel.cluster import TaskResult, task_results
from labkit.parallel.local_slurm import LocalSlurm, SlurmError

__all__ = [
    "BatchRun",
    "StepRun",
    "collect_batch",
    "run_batch",
    "run_step",
    "run_steps",
    "step_summary",
    "task_ends",
]

# srun's own report of a task's end: "srun: error: node1: task 1: Killed"
TASK_END = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): (.+)$", re.MULTILINE)


def task_ends(output: str) -> dict[int, str]:
    """Per task rank, how ``srun`` says it ended (``Killed``, ``Aborted``, ``Exited with exit
    code 1`` ...); tasks that ended normally are not listed."""
    found: dict[int, str] = {}
    for _node, ranks, how in TASK_END.findall(output):
        for part in ranks.split(","):
            low, _, high = part.partition("-")
            for rank in range(int(low), int(high or low) + 1):
                found.setdefault(rank, how.strip())
    return found


@dataclasses.dataclass
class BatchRun:
    """A batch job run to its end: the script sent, the script SLURM stored, its output."""

    script: str
    job_id: int
    stored: str  # `scontrol write batch_script`: what SLURM ran
    state: str  # COMPLETED, FAILED, CANCELLED ...
    exit_code: str  # "0:0" (exit status : signal)
    node_list: str
    seconds: float  # from the start of the wait to the job's end, as polled
    output: str  # the job's output file (every task's lines, labelled with its rank)

    @property
    def results(self) -> dict[int, TaskResult]:
        """Each task's result line, by rank."""
        return task_results(self.output)


def run_batch(cluster: LocalSlurm, script: str, workdir: Path, timeout_s: float = 300) -> BatchRun:
    """Submit ``script`` unchanged, wait for the job, read its output file and stored script."""
    return collect_batch(cluster, cluster.sbatch(script, workdir), script, workdir, timeout_s)


def collect_batch(
    cluster: LocalSlurm, job_id: int, script: str, workdir: Path, timeout_s: float = 300
) -> BatchRun:
    """Wait for submitted job ``job_id`` (of ``script``, run in ``workdir``) and read it."""
    t0 = time.perf_counter()
    fields = cluster.wait(job_id, timeout_s)
    out = Path(workdir) / f"slurm-{job_id}.out"
    return BatchRun(
        script,
        job_id,
        cluster.stored_script(job_id),
        fields.get("JobState", "?"),
        fields.get("ExitCode", "?"),
        fields.get("NodeList", "?"),
        time.perf_counter() - t0,
        out.read_text(errors="replace") if out.exists() else "",
    )


@dataclasses.dataclass
class StepRun:
    """An ``srun`` line run to its end, each line of its output with the time it came."""

    line: str
    returncode: int
    seconds: float
    lines: list[tuple[float, str]]  # (unix time, text), in order
    job_id: int | None  # read from the tasks' start lines
    cancelled_at: float | None  # unix time of the scancel, if one was sent

    @property
    def output(self) -> str:
        """The whole output, as a terminal would show it."""
        return "\n".join(text for _, text in self.lines)

    @property
    def results(self) -> dict[int, TaskResult]:
        """Each task's result line, by rank (tasks that did not finish have none)."""
        return task_results(self.output)

    @property
    def ended_at(self) -> float:
        """Unix time of the last line (the step's end, to within srun's last message)."""
        return self.lines[-1][0] if self.lines else 0.0

    def first(self, pattern: str) -> float | None:
        """Unix time of the first line matching ``pattern`` (a regex), or None."""
        match = re.compile(pattern)
        return next((t for t, text in self.lines if match.search(text)), None)


def run_step(
    cluster: LocalSlurm,
    line: str,
    workdir: Path,
    cancel_on: str | None = None,
    timeout_s: float = 300,
) -> StepRun:
    """Run ``line`` with bash where SLURM's commands run; ``scancel`` the job when a line
    of output matches ``cancel_on`` (a regex). Stops it after ``timeout_s`` if still running."""
    t0 = time.perf_counter()
    proc = cluster.shell(line, workdir)
    lines: list[tuple[float, str]] = []
    job_id: int | None = None
    cancelled_at: float | None = None
    timer = threading.Timer(timeout_s, proc.kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for text in proc.stdout:
            lines.append((time.time(), text.rstrip("\n")))
            if job_id is None and (found := re.search(r"labkit-task start job=(\d+)", text)):
                job_id = int(found.group(1))
            if cancel_on and cancelled_at is None and job_id and re.search(cancel_on, text):
                cancelled_at = time.time()
                cluster.run(["scancel", str(job_id)])
        proc.wait()
    finally:
        timer.cancel()
    if proc.returncode == -9 and not lines:
        raise SlurmError(f"srun did not end within {timeout_s:g} s: {line}")
    return StepRun(line, proc.returncode, time.perf_counter() - t0, lines, job_id, cancelled_at)


def run_steps(
    cluster: LocalSlurm, steps: Mapping[str, tuple[str, str | None]], workdir: Path
) -> dict[str, StepRun]:
    """Run several ``srun`` lines at once: ``{name: (line, cancel_on)}`` -> their runs."""
    with ThreadPoolExecutor(len(steps)) as pool:
        futures = {
            name: pool.submit(run_step, cluster, line, workdir, cancel)
            for name, (line, cancel) in steps.items()
        }
        return {name: f.result() for name, f in futures.items()}


def step_summary(run: StepRun, event: str = r"dying t=") -> dict[str, Any]:
    """What happened in a step after its event (a line matching ``event``, or the scancel):
    how srun reports each task's end (``ok``: it printed its result), and seconds from the
    event to srun cancelling the step and to the step's end."""
    at = run.cancelled_at or run.first(event)
    said = next((text for _, text in run.lines if re.search(event, text)), "")
    if run.cancelled_at is None and (stamp := re.search(r"\bt=([\d.]+)", said)):
        at = float(stamp.group(1))  # the task's own clock: the line may reach us later
    ends = task_ends(run.output)
    ranks = sorted({*ends, *run.results, 0, 1})
    cancelled = run.first(r"Terminating StepId|CANCELLED AT")

    def after(t: float | None) -> float | None:
        return None if t is None or at is None else round(t - at, 1)

    return {
        "srun_exit": run.returncode,
        **{f"task {r}": ends.get(r, "ok" if r in run.results else "?") for r in ranks},
        "cancelled_after_s": after(cancelled),
        "ended_after_s": after(run.ended_at),
    }
