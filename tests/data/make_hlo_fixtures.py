"""Regenerate the HLO text fixtures in ``tests/data/hlo/`` (the tests read them, never run this).

    .venv/bin/python tests/data/make_hlo_fixtures.py

Each program in ``tests/data/programs/`` (written for these tests, none of them the kit's) is
compiled for H100s without a GPU by ``labkit.xla.inspect`` and saved as optimized, scheduled
HLO text without metadata and file tables. ``low_precision`` is saved twice: XLA's default
program, and the cuBLAS variant where its FP8 and int8 products become cuBLASLt calls. The
shard_map program is also saved as lowered HLO (before SPMD partitioning), where its manual
region is still a call with sharding custom calls around it.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = {
    "scan_mlp": "scan_mlp.py",
    "remat_mlp": "remat_mlp.py:train_step",
    "shard_map_matmul": "shard_map_matmul.py",
    "low_precision": "low_precision.py",
}


def clean(text: str) -> str:
    """HLO text without metadata={...} and without the file and stack tables."""
    from labkit.xla.hlo import strip_metadata, strip_tables

    return strip_tables(strip_metadata(text))


def main() -> int:
    """Compile every program and write its fixture(s); print their sizes."""
    sys.path.insert(0, str(HERE.parent.parent))
    from labkit.core.env import setup

    setup(cpu_devices=8, mode="cpu")
    import jax

    from labkit.gpt.compile import CUBLAS, same_program_options
    from labkit.xla.inspect import inspect_file, load_program, target_mesh

    out = HERE / "hlo"
    out.mkdir(exist_ok=True)
    written = {}
    for name, spec in PROGRAMS.items():
        report = inspect_file(HERE / "programs" / spec, same_program_options=same_program_options())
        written[f"{name}.hlo"] = clean(report.hlo)
    variant = inspect_file(HERE / "programs" / PROGRAMS["low_precision"], compiler_options=CUBLAS)
    written["low_precision.cublas.hlo"] = clean(variant.hlo)
    module = load_program(HERE / "programs" / "shard_map_matmul.py")
    mesh = target_mesh(module.MESH)
    with jax.set_mesh(mesh):
        lowered = module.step.lower(*module.example_args())
    written["shard_map_matmul.lowered.hlo"] = clean(lowered.as_text(dialect="hlo"))
    for file, text in written.items():
        (out / file).write_text(text)
        print(f"{file:<32} {len(text) / 1e3:6.1f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
