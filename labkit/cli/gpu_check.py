"""``labkit gpu-check [--dry-run] [--out DIR] [--budget SECONDS]`` (``make gpu-check``).

The run to do once a machine with NVIDIA GPUs (1 to 8; H100, H200 or another) is lent, in
under 10 minutes (:data:`BUDGET_S`):

1. every lesson notebook in GPU mode with GPU-sized parameters (:data:`GPU_PARAMETERS`,
   the values each notebook's text suggests), into ``OUT/executed/``;
2. the GPT step of each strategy and flag set measured against the model's range and, where
   the kit can read it, XLA's own estimate, with MFU, and FP8 over bf16 on one GPU (skipped,
   with the reason, on GPUs without FP8 such as an A100's sm_80):
   :mod:`labkit.gpt.gpu_run`;
3. XLA's autotune results for the kit's presets, rewritten for the deviceless target and kept
   in the repository (:mod:`labkit.xla.autotune`), with the GPU, driver and jaxlib recorded;
4. one report, ``OUT/gpu-check.md`` (and ``.json``).

``--dry-run`` only says what it would do: on a CPU machine it prints the plan (for the GPUs it
finds, or for 8 H100s when it finds none) and exits 0. :func:`plan` and the report are plain
functions, tested on CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HELP = "on GPUs: notebooks, measured steps, autotune (--dry-run)"
BUDGET_S = 600  # the whole run, as the issue asks: under 10 minutes
NOTEBOOK_SHARE = 0.6  # of the budget, for the notebooks (the rest: steps, autotune, report)
NOTEBOOK_TIMEOUT_S = 300  # one notebook's limit; the report says whether the budget held
PRESETS = ("tiny", "small")  # the presets whose autotune results are kept
# GPU-sized parameters per notebook (besides MODE gpu), from each notebook's own text.
GPU_PARAMETERS: dict[str, dict[str, Any]] = {
    "00_welcome": {"ROOFLINE_SIZES": [1024, 4096, 8192], "REPEATS": 20},
    "01_pjrt": {"PRESET": "small", "GLOBAL_BATCH": 64},
    "04_bf16": {"MATMUL_SIZES": [1024, 4096, 8192], "TRAIN_STEPS": 200},
    "05_fp8": {"GPU_GEMM_SIZE": 8192, "TRAIN_STEPS": 200},
    "06_collective_flags": {"PRESET": "small", "GLOBAL_BATCH": 64, "GPU_REPEATS": 50},
    "06b_scheduler_levers": {"PGLE_PROFILING_RUNS": 3, "NCCL_BYTES": 268435456},
    "08_capstone": {"PRESET": "small", "TRAIN_STEPS": 200, "GLOBAL_BATCH": 64},
    "09_kernels": {"BATCH": 8},
}


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU as ``nvidia-smi`` lists it."""

    name: str
    capability: tuple[int, int]
    driver: str
    memory_mib: int


def parse_smi(text: str) -> list[Gpu]:
    """GPUs from ``nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total
    --format=csv,noheader,nounits`` output."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            raise ValueError(f"unexpected nvidia-smi line {line!r}: want name, cap, driver, MiB")
        major, _, minor = parts[1].partition(".")
        gpus.append(Gpu(parts[0], (int(major), int(minor or 0)), parts[2], int(float(parts[3]))))
    return gpus


def find_gpus() -> list[Gpu]:
    """This machine's NVIDIA GPUs (none without ``nvidia-smi`` or a working driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = "--query-gpu=name,compute_cap,driver_version,memory.total"
    run = subprocess.run(
        [smi, query, "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    return parse_smi(run.stdout) if run.returncode == 0 else []


ASSUMED = [Gpu("NVIDIA H100 80GB HBM3", (9, 0), "(none here)", 81559)] * 8


@dataclasses.dataclass(frozen=True)
class Step:
    """One part of the run: what it does, and the command or call that does it."""

    part: str
    what: str
    budget_s: float


def gpu_parameters(notebook: Path) -> dict[str, Any]:
    """The parameters a notebook gets in the GPU run: ``MODE: gpu`` where it has a MODE, and
    its GPU-sized values (:data:`GPU_PARAMETERS`)."""
    from labkit.cli.parameters import defaults

    mode = {"MODE": "gpu"} if "MODE" in defaults(notebook) else {}
    return {**mode, **GPU_PARAMETERS.get(notebook.stem, {})}


def plan(
    gpus: Sequence[Gpu], notebooks: Sequence[Path], budget_s: float = BUDGET_S
) -> tuple[list[Step], list[str]]:
    """The steps of a run on ``gpus`` and the notes a learner should read (what is skipped
    and why). Raises ValueError without a GPU or with more than 8."""
    from labkit.gpt.gpu_run import cases_for, fp8_supported

    if not gpus:
        raise ValueError("no NVIDIA GPU: gpu-check runs on a GPU machine (--dry-run anywhere)")
    if len(gpus) > 8:
        raise ValueError(f"{len(gpus)} GPUs: gpu-check is written for 1 to 8 (one HGX node)")
    each = budget_s * NOTEBOOK_SHARE / max(len(notebooks), 1)
    steps = []
    for notebook in notebooks:
        shown = " ".join(f"-y '{k}: {json.dumps(v)}'" for k, v in gpu_parameters(notebook).items())
        steps.append(Step("notebook", f"papermill {notebook.name} {shown}".rstrip(), each))
    cases, notes = cases_for(len(gpus))
    rest = budget_s * (1 - NOTEBOOK_SHARE)
    for case in cases:
        steps.append(
            Step("step", f"time the GPT step: {case.name} on {len(gpus)} GPU(s)", rest / 8)
        )
    first = gpus[0]
    if fp8_supported(first.capability):
        steps.append(Step("fp8", "FP8 over bf16: the GPT step on one GPU, both ways", rest / 8))
    else:
        cap = ".".join(map(str, first.capability))
        notes.append(
            f"FP8 over bf16 skipped: {first.name} (sm_{cap.replace('.', '')}) has no FP8 tensor "
            "cores; notebook 05 says so and skips its GPU cells"
        )
    for preset in PRESETS:
        steps.append(
            Step("autotune", f"dump XLA's autotune results for the {preset} preset", rest / 8)
        )
    steps.append(Step("report", "write OUT/gpu-check.md and OUT/gpu-check.json", 1))
    if len(gpus) < 8:
        notes.append(
            f"{len(gpus)} GPU(s), not 8: the measured steps use {len(gpus)}; the deviceless "
            "8-H100 programs are still compiled on the CPU; autotune results are dumped at the "
            "8-GPU programs' per-GPU batch, so their keys match"
        )
    if "H100" not in first.name and "H200" not in first.name:
        notes.append(
            f"{first.name} is not an H100 or H200: times are for it, while the kit's model "
            "and deviceless programs stay the H100's"
        )
    return steps, notes


def render(
    gpus: Sequence[Gpu],
    steps: Sequence[Step],
    notes: Sequence[str],
    results: Mapping[str, Any] | None = None,
) -> str:
    """The report (markdown): the machine, the plan or what ran, the measured rows."""
    from labkit.core.report import markdown_table

    lines = ["# labkit gpu-check", ""]
    name = gpus[0].name if gpus else "no GPU"
    lines.append(f"{len(gpus)} x {name}, driver {gpus[0].driver if gpus else '-'}")
    lines += ["", "## Plan" if results is None else "## What ran", ""]
    rows = [{"part": s.part, "what": s.what, "budget s": round(s.budget_s)} for s in steps]
    lines.append(markdown_table(rows, ["part", "what", "budget s"]))
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    for title, table in (results or {}).items():
        if isinstance(table, list) and table:
            lines += ["", f"## {title}", "", markdown_table(table, list(table[0]))]
        else:
            lines += ["", f"## {title}", "", str(table)]
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``labkit gpu-check``."""
    top = argparse.ArgumentParser(prog="labkit gpu-check", description=__doc__.split("\n")[0])
    top.add_argument("--dry-run", action="store_true", help="say what it would do, run nothing")
    top.add_argument("--out", default="build/gpu-check", help="report folder")
    top.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole run")
    return top


def _run(gpus: Sequence[Gpu], out: Path, budget_s: float) -> dict[str, Any]:
    """Do the run (GPU machine only): notebooks, steps, FP8, autotune; the results by part."""
    from labkit.core.env import setup
    from labkit.gpt import gpu_run
    from labkit.runner import preflight

    start = time.perf_counter()
    results: dict[str, Any] = {}
    notebooks = preflight.notebooks(solutions=False)
    ran = []
    with preflight.only_run(out):
        for path in notebooks:
            with preflight.scratch_space():
                target = out / "executed" / path.name
                r = preflight.execute(path, target, gpu_parameters(path), NOTEBOOK_TIMEOUT_S)
            ran.append({"notebook": r.notebook, "status": r.status, "s": round(r.seconds, 1)})
    results["Notebooks in GPU mode"] = ran
    setup(mode="gpu")
    measured, skipped = gpu_run.measure_steps()
    results["Steps against the model"] = [dataclasses.asdict(m) for m in measured]
    results["Skipped"] = skipped
    results["FP8 over bf16 (one GPU)"] = gpu_run.fp8_over_bf16()
    kept = [
        str(p) for preset in PRESETS for p in gpu_run.dump_autotune(preset, out, gpus[0].driver)
    ]
    results["Autotune results kept"] = kept
    total = time.perf_counter() - start
    results["Total seconds"] = (
        f"{total:.0f} s ({'within' if total <= budget_s else 'over'} the {budget_s:.0f} s budget)"
    )
    return results


def main(argv: Sequence[str]) -> int:
    """Plan (``--dry-run``) or run the GPU check; 0 when everything ran."""
    from labkit.runner import preflight

    args = parser().parse_args(argv)
    gpus = find_gpus()
    notebooks = preflight.notebooks(solutions=False)
    if args.dry_run:
        shown = gpus or ASSUMED
        steps, notes = plan(shown, notebooks, args.budget)
        if not gpus:
            notes.insert(0, "no NVIDIA GPU here: the plan is for 8 H100s; nothing was run")
        print(render(shown, steps, notes), end="")
        return 0
    if not gpus:
        from labkit.cli.usage import UsageError

        raise UsageError("no NVIDIA GPU found (nvidia-smi): run on a GPU machine, or --dry-run")
    out = Path(args.out)
    steps, notes = plan(gpus, notebooks, args.budget)
    results = _run(gpus, out, args.budget)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-check.md").write_text(render(gpus, steps, notes, results))
    (out / "gpu-check.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"report: {out / 'gpu-check.md'}")
    ok = all(r["status"] == "ok" for r in results["Notebooks in GPU mode"])
    return 0 if ok else 1
