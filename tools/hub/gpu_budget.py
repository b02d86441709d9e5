"""How much H100 memory a learner's lesson programs need: the numbers behind the room's GPU shares.

Usage: .venv/bin/python tools/hub/gpu_budget.py   (no GPU needed; about a minute)

Compiles the largest program of the lessons' GPU-mode parameters for one H100, deviceless
(compiled, not run, not autotuned), and prints XLA's own memory analysis of each: arguments +
outputs + temporaries - aliased bytes, the device memory the program holds while it runs.
A share of a GPU (``XLA_CLIENT_MEM_FRACTION``) must hold that plus what the kernel keeps
alive between cells; the CUDA context and library workspaces of each process come on top and
are not counted here (they are measured only on a GPU).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labkit.core import env
from labkit.core.hardware import hardware

GIB = 2**30
LEARNERS_PER_GPU = (4, 8, 16)  # `make hub HUB_ARGS=--learners-per-gpu=N`


def program_bytes(compiled: Any) -> int:
    """Device bytes a compiled program holds while it runs (XLA's memory analysis)."""
    m = compiled.memory_analysis()
    return int(
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )


def matmul(size: int, dtype: str) -> Callable[[], Any]:
    """The roofline's largest GEMM (00, 04, 05 in GPU mode): ``size`` x ``size`` squared."""

    def build() -> Any:
        import jax.numpy as jnp

        from labkit.xla.aot import abstract, compile_for_gpu, h100_mesh

        mesh = h100_mesh((1,), ("x",))
        a = abstract(jnp.zeros((size, size), dtype), mesh)
        return compile_for_gpu(jnp.matmul, a, a).compiled

    return build


def train_step(preset: str, batch: int) -> Callable[[], Any]:
    """The capstone's bf16 GPT train step (08 in GPU mode) on one H100."""

    def build() -> Any:
        from labkit.gpt.compile import compile_train_step, default_mesh
        from labkit.lessons.n08_capstone import make_config

        cfg = make_config(preset, "bf16")
        return compile_train_step(cfg, "dp", batch_size=batch, mesh=default_mesh(1)).compiled

    return build


PROGRAMS = {
    "00/04 roofline GEMM 8192, float32": matmul(8192, "float32"),
    "04/05 GEMM 8192, bfloat16": matmul(8192, "bfloat16"),
    "08 GPT 'small', batch 64 (its GPU values)": train_step("small", 64),
    "08 GPT 'base' (85 M), batch 8": train_step("base", 8),
}


def main() -> int:
    """Print each program's device memory and whether it fits each learner's share."""
    env.setup(cpu_devices=8, mode="cpu")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from labhub import memory_fraction

    gpu_gib = hardware("H100 SXM").memory_gb
    shares = {k: memory_fraction(k) * gpu_gib for k in LEARNERS_PER_GPU}
    head = [f"{k} learners/GPU ({gib:.1f} GiB)" for k, gib in shares.items()]
    print("| program (one H100, compiled, not run) | device memory | " + " | ".join(head) + " |")
    print("|---|---|" + "---|" * len(head))
    for name, build in PROGRAMS.items():
        gib = program_bytes(build()) / GIB
        fits = ["fits" if gib <= share else "too big" for share in shares.values()]
        print(f"| {name} | {gib:.2f} GiB | " + " | ".join(fits) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
