"""Print the lab's speed budgets as measured on this machine (`make bench`).

Budgets (issue: foundation): compiling the GPT step for 8 H100s under 5 s; 00_welcome under
60 s in CI mode; `make test` under 20 minutes. Figures are printed, never asserted: timings
on the 2-core CI machines swing 2-3x between runs.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from labkit.core import env

env.setup(cpu_devices=8, mode="cpu")

from labkit.cli import preflight  # noqa: E402
from labkit.gpt import train  # noqa: E402
from labkit.gpt.config import PRESETS  # noqa: E402
from labkit.xla import aot as gpu_aot  # noqa: E402


def compile_seconds(preset: str, strategy: str, options: dict[str, bool]) -> float:
    """Wall time of one deviceless compile of the GPT train step for 8 H100s."""
    mesh = gpu_aot.h100_mesh((8,), ("data",))
    step, state, batch = train.train_setup(PRESETS[preset], mesh, strategy, 32)
    start = time.perf_counter()
    gpu_aot.compile_for_gpu(step, state, batch, compiler_options=options)
    return time.perf_counter() - start


def main() -> int:
    rows = []
    for strategy in ("dp", "fsdp"):
        for label, options in (
            ("default", {}),
            ("cuBLAS GEMMs", {"xla_gpu_enable_triton_gemm": False}),
        ):
            seconds = compile_seconds("tiny", strategy, options)
            rows.append((f"GPT tiny {strategy} step -> 8 x H100 ({label})", seconds, 5.0))
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("00_welcome.ipynb",):
            result = preflight.execute(preflight.notebooks_dir() / name, Path(tmp) / name)
            rows.append((f"notebook {name} ({result.status})", result.seconds, 60.0))
    print(f"{'what':<52} {'seconds':>8} {'budget':>7}")
    for what, seconds, budget in rows:
        flag = "" if seconds <= budget else "  over budget"
        print(f"{what:<52} {seconds:8.2f} {budget:7.0f}{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
