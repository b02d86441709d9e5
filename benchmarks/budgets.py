"""Print the lab's speed budgets as measured on this machine (`make bench`).

Budgets: a deviceless compile of the GPT step for 8 H100s with a new flag set under 2 s;
every notebook under 60 s in CPU mode; the whole fresh-clone `make test` under 20 minutes.
Figures are printed, never asserted: timings on 2-core machines swing 2-3x between runs, so
each compile figure is a median over several compiles, and options are compared side by side
in one process.

    python benchmarks/budgets.py              # compiles, fresh-process imports, every phase
    python benchmarks/budgets.py --compiles   # compiles only (about a minute)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPILE_BUDGET_S, NOTEBOOK_BUDGET_S, CI_BUDGET_S = 2.0, 60.0, 20 * 60.0


def _row(what: str, seconds: float, budget: float | None, note: str = "") -> None:
    flag = "" if budget is None or seconds <= budget else "  over budget"
    limit = "" if budget is None else f"{budget:7g}"
    print(f"{what:<58} {seconds:8.2f} {limit:>7}{flag}{'  ' + note if note else ''}", flush=True)


def compiles(repeats: int) -> None:
    """New-flag-set compiles of the tiny GPT step after a warm-up compile, per option set."""
    start = time.perf_counter()
    from labkit.core.env import setup

    setup(cpu_devices=8, mode="cpu")
    from labkit.gpt import train
    from labkit.gpt.compile import CUBLAS, same_program_options
    from labkit.gpt.config import GPTConfig
    from labkit.xla.aot import h100_mesh

    mesh = h100_mesh((8,), ("data",))
    step, state, batch = train.train_setup(GPTConfig.preset("tiny"), mesh, "dp", 32)
    lowered = step.lower(state, batch)
    print(f"{'deviceless compile, GPT tiny dp step -> 8 x H100':<58} {'seconds':>8} {'budget':>7}")
    _row("  process start, jax import, tracing and lowering", time.perf_counter() - start, None)
    sets = {
        "default program, XLA's options only": {},
        "default program, the kit's same-program options": same_program_options(),
        "cuBLAS variant (a different program)": {**same_program_options(), **CUBLAS},
    }
    texts: dict[str, list[str]] = {}
    threshold = "xla_gpu_all_reduce_combine_threshold_bytes"
    for n, (label, options) in enumerate(sets.items()):
        lowered.compile(compiler_options={**options, threshold: 1 << (10 + n)})  # warm-up
        times = []
        for i in range(repeats):  # a new combine threshold each time: a new flag set
            opts = {**options, threshold: 1 << (20 + i)}
            t0 = time.perf_counter()
            compiled = lowered.compile(compiler_options=opts)
            times.append(time.perf_counter() - t0)
            texts.setdefault(label, []).append(compiled.as_text())
        note = f"median of {repeats} after a warm-up, min {min(times):.2f}, max {max(times):.2f}"
        _row(f"  new flag set, {label}", statistics.median(times), COMPILE_BUDGET_S, note)
    plain, ours, _ = texts.values()
    print(f"  the kit's options leave the default program byte for byte: {plain == ours}")


# What each fresh process pays before it does anything (CPU seconds, user + system): every
# papermill run, nbval worker and Jupyter Server imports nbformat, and a jsonschema newer than
# constraints.txt's pin adds ~1.3 s to it (rfc3987-syntax builds its parsers at import).
STARTUP = {
    "import nbformat": "import nbformat",
    "import papermill": "import papermill",
    "import jax": "import jax",
    "labkit setup() (8 CPU devices)": (
        "from labkit.core.env import setup; setup(cpu_devices=8, mode='cpu')"
    ),
}
NBFORMAT_BUDGET_S = 0.6


def _child_cpu(code: str) -> float:
    """CPU seconds (user + system) of a fresh ``python -c code``."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def startup(repeats: int) -> None:
    """Median CPU seconds of each import a fresh process of the test run pays."""
    print(
        f"\n{'a fresh process, CPU seconds (median of ' + str(repeats) + ')':<58} "
        f"{'seconds':>8} {'budget':>7}"
    )
    for what, code in STARTUP.items():
        seconds = statistics.median(_child_cpu(code) for _ in range(repeats))
        _row(f"  {what}", seconds, NBFORMAT_BUDGET_S if "nbformat" in what else None)


def phases() -> None:
    """Every phase of `make test` after the install, each timed as a user would run it.

    As in `make test`, the phases share one fresh cache folder (LABKIT_CACHE_DIR): the
    lessons' first runs compile, their nbval runs reuse those compiles.
    """
    import os

    from labkit.runner import preflight

    os.environ["LABKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="labkit-bench-cache-")

    py = sys.executable
    print(
        f"\n{'make test, phase by phase (install not included)':<58} {'seconds':>8} {'budget':>7}"
    )
    total = 0.0
    t0 = time.perf_counter()
    subprocess.run([py, "-m", "ruff", "check", "-q", "."], cwd=ROOT, check=False)
    lint = time.perf_counter() - t0
    _row("  lint (ruff)", lint, None)
    t0 = time.perf_counter()
    unit = subprocess.run(
        [py, "-m", "pytest", "tests", "-q", "-m", "not notebook", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - t0
    _row("  unit tests", seconds, None, unit.stdout.strip().splitlines()[-1] if unit.stdout else "")
    total += lint + seconds
    with tempfile.TemporaryDirectory() as tmp:
        for path in preflight.notebooks(ROOT / "notebooks"):
            result = preflight.execute(path, Path(tmp) / path.name)
            _row(
                f"  papermill CLI  {result.notebook} ({result.status})",
                result.seconds,
                NOTEBOOK_BUDGET_S,
            )
            total += result.seconds
    for path in preflight.notebooks(ROOT / "notebooks", solutions=False):
        t0 = time.perf_counter()
        run = subprocess.run(
            [
                py,
                "-m",
                "pytest",
                str(path),
                "--nbval-lax",
                "--nbval-current-env",
                "-q",
                "--nbval-sanitize-with",
                "tests/nbval_sanitize.cfg",
                "-p",
                "no:cacheprovider",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - t0
        status = "ok" if run.returncode == 0 else "failed"
        _row(f"  nbval-lax      {path.name} ({status})", seconds, NOTEBOOK_BUDGET_S)
        total += seconds
    _row("make test without the install (sum of the phases)", total, CI_BUDGET_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compiles", action="store_true", help="compile times only")
    parser.add_argument("--repeats", type=int, default=3, help="compiles per option set")
    args = parser.parse_args()
    compiles(args.repeats)
    if not args.compiles:
        startup(args.repeats)
        phases()
    return 0


if __name__ == "__main__":
    sys.exit(main())
