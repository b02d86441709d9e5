"""Proof that mypy catches a value a labkit alias rules out.

Each call below passes a value of the right Python type but outside the alias
(:data:`labkit.parallel.sharding.Strategy`, :data:`labkit.core.types.CompilerOptions`,
:data:`labkit.core.types.JSON`, a ``GPTConfig`` or preset name) and carries
``# type: ignore[...]``. ``make lint`` runs mypy with ``warn_unused_ignores``: if an alias
loosens back to ``str`` or ``Any``, its ignore goes unused and lint fails. Nothing here
runs: the function is never called, and pytest does not collect this file.
"""

from __future__ import annotations

from pathlib import Path

from jax.sharding import Mesh

from labkit.gpt import compile as gpt_compile
from labkit.gpt import train
from labkit.gpt.config import GPTConfig
from labkit.parallel import sharding
from labkit.runner import preflight


def wrong_values(cfg: GPTConfig, mesh: Mesh) -> None:
    """Every call here passes one value its parameter's type excludes; mypy reports each."""
    # Strategy = Literal["dp", "fsdp", "tp", "fsdp_tp"]: a misspelled name
    train.train_setup(cfg, mesh, "pd")  # type: ignore[arg-type]
    sharding.strategy_mesh("data")  # type: ignore[arg-type]
    gpt_compile.compile_train_step(cfg, "zero3")  # type: ignore[arg-type]
    # CompilerOptions = Mapping[str, str | bool | int | float]: a value XLA cannot take
    gpt_compile.compile_train_step(cfg, "dp", {"xla_dump_to": None})  # type: ignore[dict-item]
    # GPTConfig.of(cfg: GPTConfig | str): a size is not a config
    GPTConfig.of(64)  # type: ignore[arg-type]
    # papermill parameters travel as JSON: an object json.dumps cannot write
    notebook = Path("a.ipynb")
    preflight.papermill_command(notebook, notebook, {"N": object()})  # type: ignore[dict-item]
