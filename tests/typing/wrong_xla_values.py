"""Proof that mypy catches a value the types of labkit.xla and lessons 05-10 rule out.

As in ``wrong_values.py``: each line passes a value of a plausible Python type that the
annotation excludes, with ``# type: ignore[...]``; ``make lint`` runs mypy with
``warn_unused_ignores``, so a type loosened back to ``Any`` or ``str`` leaves its ignore
unused and fails lint. Nothing here runs and pytest does not collect this file.
"""

from __future__ import annotations

import jax

from labkit.lessons import n06_collective_flags as n06
from labkit.lessons import n08_capstone as n08
from labkit.xla import hlo, predict
from labkit.xla.aot import compile_for_gpu
from labkit.xla.inspect import mesh_axes
from labkit.xla.inspect_report import Report


def wrong_xla_values(x: jax.ShapeDtypeStruct, text: str, a: Report, b: Report) -> None:
    """Every call here passes one value its parameter's type excludes; mypy reports each."""
    # MeshLike: a mesh, an axis -> size mapping or "data=4,model=2", not a device count
    mesh_axes(8)  # type: ignore[arg-type]
    # JitKwargs: the keyword arguments jax.jit takes, spelled as jax.jit spells them
    compile_for_gpu(jax.numpy.sin, x, jit_kwargs={"donate": 0})  # type: ignore[arg-type]
    # Strategy in the lessons' sweeps and explorer
    n06.flag_tokens([], None, "ddp")  # type: ignore[arg-type]
    n06.sweep_threshold([0], "tiny", "zero3")  # type: ignore[arg-type]
    # StepOptions: what compile_train_step takes beyond (cfg, strategy, options)
    n06.sweep_threshold([0], batch=32)  # type: ignore[call-arg]
    # CompileStep: a compile function must take (cfg, strategy, options)
    n06.flag_diff([], compile_fn=lambda cfg: None)  # type: ignore[arg-type]
    # (Strategy, precision) pairs in the capstone's comparison
    n08.compare_configs("tiny", [("zero3", "bf16")], 8)  # type: ignore[list-item]
    # TypedDicts: a misspelled key of a summary, a step term, a diff row
    hlo.summary(text)["colectives"]  # type: ignore[typeddict-item]
    predict.predict(text).rows()[0]["seconds"]  # type: ignore[typeddict-item]
    a.diff(b).rows[0]["delta"]  # type: ignore[typeddict-item]
