"""Proof that mypy catches a call with its arguments in the wrong order.

Each call below swaps arguments of a real labkit function and carries
``# type: ignore[arg-type]``. ``make lint`` runs mypy on this file with
``warn_unused_ignores``: if a signature loosens (an argument typed ``Any``, a swapped pair
that no longer clashes), its ignore goes unused and lint fails. Nothing here runs: the
function is never called, and pytest does not collect this file.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh

from labkit.core import mesh as core_mesh
from labkit.core import report, timing
from labkit.core.hardware import Hardware
from labkit.gpt import train
from labkit.gpt.config import GPTConfig
from labkit.kernels import pallas
from labkit.numerics import fp8, precision
from labkit.parallel import sharding


def wrong_orders(
    cfg: GPTConfig,
    mesh: Mesh,
    hw: Hardware,
    x: jax.Array,
    times: dict[str, timing.Timing],
    state: fp8.DelayedScaling,
) -> None:
    """Every call here has two or more arguments swapped; mypy reports each one."""
    # train_setup(cfg, mesh, strategy="dp", batch_size=32, tx=None)
    train.train_setup(cfg, "dp", 32, mesh)  # type: ignore[arg-type]
    # make_mesh(shape, names, devices=None, explicit=False)
    core_mesh.make_mesh(("x",), (8,))  # type: ignore[arg-type]
    # ring_bytes(kind, size, n)
    sharding.ring_bytes(8, "all-reduce", 1024)  # type: ignore[arg-type]
    # logical_to_spec(names, strategy, mesh=None)
    sharding.logical_to_spec("dp", ("batch", None))  # type: ignore[arg-type]
    # check_fits(sizes, mesh, strategy)
    sharding.check_fits(mesh, {"heads": 4}, "dp")  # type: ignore[arg-type]
    # strategy_mesh(strategy, devices=None)
    sharding.strategy_mesh(jax.devices(), "dp")  # type: ignore[arg-type]
    # activation_sharding(mesh, strategy)
    sharding.activation_sharding("dp", mesh)  # type: ignore[arg-type]
    # mfu(flops_per_step, step_s, hw, num_devices=1, precision="bf16")
    timing.mfu(hw, 0.1, 1e15)  # type: ignore[arg-type]
    # timing_rows(times, baseline="default")
    timing.timing_rows("default", times)  # type: ignore[arg-type]
    # markdown_table(rows, columns)
    rows, columns = [{"a": 1}], ["a"]
    report.markdown_table(columns, rows)  # type: ignore[arg-type]
    # compile_kernel_for_h100(fn, *arrays, **options)
    pallas.compile_kernel_for_h100(x, pallas.softmax)  # type: ignore[arg-type]
    # quantize_delayed(x, state)
    fp8.quantize_delayed(state, x)  # type: ignore[arg-type]
    # grid(fmt, lo, hi, max_points=100_000)
    precision.grid(0.0, "bfloat16", 1.0)  # type: ignore[arg-type]
