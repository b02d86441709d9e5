"""10_your_model: a model the kit did not write, inspected on 8 H100s; and the checkers.

The inspection itself is :func:`labkit.xla.inspect.inspect` (and ``labkit inspect`` for a
file); this module only builds the notebook's abstract, sharded inputs from a Flax NNX
model whose params carry logical axis names (:mod:`labkit.parallel.sharding` maps them per
strategy), compiles the train step per strategy, and checks the exercises.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat, SupportsIndex

from labkit.core.feedback import Feedback, check_integer, judge, unanswered
from labkit.core.mesh import abstract
from labkit.core.types import CompilerOptions
from labkit.gpt.compile import same_program_options
from labkit.parallel.sharding import (
    Strategy,
    logical_to_spec,
    param_specs,
    ring_bytes,
    strategy_mesh,
)
from labkit.xla.inspect import inspect
from labkit.xla.inspect_report import Report

if TYPE_CHECKING:
    import jax
    from flax import nnx
    from jax.sharding import Mesh

BOUND_TERMS = ("math", "memory", "exposed communication", "floors")
# 10.1's hint: the count as the notebook's names would compute it (tests evaluate it)
SYNC_HINT = 'sum(c.kind == "all-reduce" and c.mode == "sync" for c in reports["tp"].collectives)'
# The notebook's folder: its `models/` paths are relative to it, wherever papermill runs.
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def model_path(spec: str) -> str:
    """``FILE.py[:NAME]`` as the notebook means it: a relative FILE that is not found from the
    working directory is taken relative to the notebook's folder (``models/...`` is there)."""
    file, colon, name = spec.rpartition(":")
    if not name.isidentifier():  # no :NAME after the file
        file, colon, name = spec, "", ""
    path = Path(file).expanduser()
    if not path.is_absolute() and not path.exists() and (NOTEBOOKS / path).exists():
        path = NOTEBOOKS / path
    return f"{path}{colon}{name}"


def sharded[N: nnx.Pytree](node: N, strategy: Strategy, mesh: Mesh) -> N:
    """An abstract NNX model or optimizer (``nnx.eval_shape``) with every leaf a sharded
    ``ShapeDtypeStruct``: params (and their optimizer moments) by their logical axis names
    under ``strategy``'s rules, everything else replicated. Nothing is allocated."""
    from flax import nnx

    graphdef, state = nnx.split(node)
    specs = param_specs(state, strategy, mesh)
    nnx.replace_by_pure_dict(state, abstract(nnx.to_pure_dict(state), mesh, specs))
    return nnx.merge(graphdef, state)


def train_inputs[M: nnx.Module](
    model: M,
    optimizer: nnx.Optimizer[M],
    strategy: Strategy,
    batch: int,
    image: tuple[int, int, int],
) -> tuple[M, nnx.Optimizer[M], jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """``(model, optimizer, images, labels)`` for ``strategy`` on its 8-H100 mesh
    (:func:`labkit.parallel.sharding.strategy_mesh`): images ``(batch, *image)`` bf16 and int32
    labels, split over the batch axis's mesh axis."""
    import jax
    import jax.numpy as jnp

    mesh = strategy_mesh(strategy)
    rows = logical_to_spec(("batch",), strategy, mesh)
    images = jax.ShapeDtypeStruct((batch, *image), jnp.bfloat16)  # (batch, height, width, 3)
    labels = jax.ShapeDtypeStruct((batch,), jnp.int32)
    return (
        sharded(model, strategy, mesh),
        sharded(optimizer, strategy, mesh),
        abstract(images, mesh, logical_to_spec(("batch", None, None, None), strategy, mesh)),
        abstract(labels, mesh, rows),
    )


def inspect_strategy[M: nnx.Module](
    step: Callable[..., object],
    model: M,
    optimizer: nnx.Optimizer[M],
    strategy: Strategy,
    batch: int,
    image: tuple[int, int, int],
    compiler_options: CompilerOptions | None = None,
) -> Report:
    """The report of ``step(model, optimizer, images, labels)`` under ``strategy`` on 8 H100s,
    named ``"<step> (<strategy>)"``; compiled with the kit's same-program options."""
    report = inspect(
        step,
        *train_inputs(model, optimizer, strategy, batch, image),
        compiler_options=compiler_options,
        same_program_options=same_program_options(),
    )
    name = f"{report.program.name} ({strategy})"
    return dataclasses.replace(report, program=dataclasses.replace(report.program, name=name))


def strategy_rows(reports: Mapping[str, Report]) -> list[dict[str, str | float | None]]:
    """One table row per report: mesh, collectives, bytes, verdicts, memory, the model's step."""
    rows: list[dict[str, str | float | None]] = []
    for name, r in reports.items():
        v = r.verdicts()
        memory = r.memory.total / 1e6 if r.memory is not None else None
        rows.append(
            {
                "strategy": name,
                "mesh": ",".join(f"{k}={n}" for k, n in r.program.mesh.items()),
                "collectives": ", ".join(
                    f"{n} {k}" for k, n in sorted(r.collective_counts().items())
                ),
                "MB sent": round(sum(c.link_bytes * c.per_step for c in r.collectives) / 1e6, 3),
                "hidden/partly/exposed": f"{v['hidden']}/{v['partly hidden']}/{v['exposed']}",
                "argument MB": round(r.memory.argument / 1e6, 2) if r.memory else None,
                "memory MB": round(memory, 2) if memory is not None else None,
                "step us": f"{r.step.lower_us:g}-{r.step.upper_us:g}",
            }
        )
    return rows


def count_params(model: nnx.Module) -> int:
    """Parameters of an NNX model (abstract or not): elements of its ``nnx.Param`` variables."""
    import math

    import jax
    from flax import nnx

    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def gradient_all_reduce_bytes(report: Report) -> int:
    """Bytes per device of the all-reduces that carry more than a scalar (the gradients)."""
    return sum(
        c.bytes * c.per_step for c in report.collectives if c.kind == "all-reduce" and c.bytes > 8
    )


def bf16_all_reduce_error(
    num_devices: int = 8, size: int = 1 << 16, seed: int = 0
) -> dict[str, float]:
    """Normwise relative error of summing ``num_devices`` bf16 gradients (standard normal,
    ``size`` each) two ways, against the exact sum: ``"bf16, hop by hop"`` as a ring
    all-reduce does (the partial sum travels in bf16, rounded after each of the
    ``num_devices - 1`` additions) and ``"exact, rounded once"`` (summed exactly, then
    rounded to bf16 once: the least any bf16 result can err)."""
    import ml_dtypes
    import numpy as np

    bf16 = ml_dtypes.bfloat16
    grads = np.random.default_rng(seed).standard_normal((num_devices, size)).astype(bf16)
    exact = grads.astype(np.float64).sum(axis=0)  # (size,)
    partial = grads[0]
    for grad in grads[1:]:  # one hop of the ring: add in f32, send the result as bf16
        partial = (partial.astype(np.float32) + grad.astype(np.float32)).astype(bf16)
    once = exact.astype(np.float32).astype(bf16)

    def error(x: np.ndarray) -> float:
        return float(np.linalg.norm(x.astype(np.float64) - exact) / np.linalg.norm(exact))

    return {"bf16, hop by hop": error(partial), "exact, rounded once": error(once)}


def bound_term(report: Report) -> str:
    """Which term sets the low end of the model's step range (one of :data:`BOUND_TERMS`)."""
    terms = report.step.terms_by_name()
    return max(BOUND_TERMS, key=lambda t: terms[t])


# ---------------------------------------------------------------------------------------
# Checkers


def check_sync_all_reduces(answer: object, report: Report) -> Feedback:
    """10.1: how many all-reduces of the tensor-parallel step are synchronous."""
    expected = sum(c.kind == "all-reduce" and c.mode == "sync" for c in report.collectives)
    return check_integer(
        "10.1",
        answer,
        expected,
        f"{expected}: the rows whose mode is sync; the scheduler put no kernel beside them.",
        f"Count the collectives table's rows with kind all-reduce and mode sync (or: {SYNC_HINT}).",
    )


def check_gradient_bytes(answer: object, model: nnx.Module, gpus: int = 4) -> Feedback:
    """10.2: bytes each GPU sends per step in a ring all-reduce of the data-parallel
    gradients (bf16, 2 bytes per parameter) over ``gpus`` GPUs: ``2 (n-1)/n`` times them."""
    size = 2 * count_params(model)  # the gradients, bf16
    expected = round(ring_bytes("all-reduce", size, gpus))
    if unanswered(answer):
        return judge("10.2", answer, False, "", "")
    hint = (
        f"A ring all-reduce is a reduce-scatter then an all-gather: each GPU sends (n-1)/n of "
        f"the data in each, with n = {gpus}. How many bytes are the gradients?"
    )
    if answer == round(ring_bytes("all-reduce", 2 * size, gpus)):
        hint = "That is float32 gradients; the products run in bf16, so the gradients do too."
    elif answer == round(ring_bytes("all-reduce", size + 4, gpus)):
        hint = "That counts the loss's 4 bytes too; it travels in an all-reduce of its own."
    elif answer == size:
        hint = "That is the gradients' size; a ring sends more than that from each GPU."
    return check_integer(
        "10.2",
        answer,
        expected,
        f"{expected} bytes: 2 x ({gpus}-1)/{gpus} x {size} bytes of bf16 gradients.",
        hint,
    )


def argument_ratio(dp: Report, fsdp: Report) -> float:
    """How many times fewer argument bytes per GPU FSDP holds than data parallelism."""
    if dp.memory is None or fsdp.memory is None:
        raise ValueError("both reports need a memory section: inspect compiled programs")
    return dp.memory.argument / fsdp.memory.argument


def check_argument_ratio(answer: object, dp: Report, fsdp: Report) -> Feedback:
    """10.3: the factor by which FSDP cuts the argument bytes per GPU (within 5%)."""
    import math

    expected = argument_ratio(dp, fsdp)
    passed = False
    if isinstance(answer, str | bytes | SupportsFloat | SupportsIndex):  # what float() takes
        try:
            passed = math.isclose(float(answer), expected, rel_tol=0.05)
        except (TypeError, ValueError):
            passed = False
    return judge(
        "10.3",
        answer,
        passed,
        f"{expected:.2f}x: FSDP splits the parameters with an 'embed' axis and their AdamW "
        "moments 8 ways, but not what has none (the token-mixing kernels), nor the batch "
        "(split the same way in both layouts) or the step counts: that keeps it under 8.",
        "Divide report_dp.memory.argument by fsdp.memory.argument (within 5%).",
    )


def check_threshold_zero_all_reduces(answer: object, model: nnx.Module) -> Feedback:
    """10.p1 (predict): all-reduces of the DP step at combine threshold 0: one per parameter
    array, plus the loss."""
    import jax
    from flax import nnx

    arrays = len(jax.tree.leaves(nnx.state(model, nnx.Param)))
    return check_integer(
        "10.p1",
        answer,
        arrays + 1,
        f"{arrays + 1}: {arrays} parameter arrays and the loss; section 5 compiles it.",
        "count the parameter arrays (nnx.state(model, nnx.Param)); what else is averaged?",
    )


def check_split_gradients(
    answer: object,
    step: Callable[..., object],
    model: nnx.Module,
    optimizer: nnx.Optimizer[Any],
    batch: int = 64,
    image: tuple[int, int, int] = (32, 32, 3),
) -> Feedback:
    """10.4: per-compile options under which the data-parallel step sends its gradients in
    3 to 5 all-reduces (plus the loss's), all asynchronous; compiled by the checker."""
    if unanswered(answer):
        return judge("10.4", answer, False, "", "")
    if not isinstance(answer, dict):
        return Feedback("10.4", False, True, f"expected a dict of options, got {answer!r}")
    report = inspect_strategy(step, model, optimizer, "dp", batch, image, answer)
    reduces = [c for c in report.collectives if c.kind == "all-reduce"]
    synchronous = sum(c.mode != "async" for c in reduces)
    return judge(
        "10.4",
        answer,
        4 <= len(reduces) <= 6 and not synchronous,
        f"{len(reduces)} all-reduces, none synchronous.",
        f"{len(reduces)} all-reduces, {synchronous} synchronous: which threshold groups the "
        "gradients (their sizes: 2 bytes per parameter) into 3 to 5 transfers?",
    )
