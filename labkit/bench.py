"""Honest timing: warm-up, ``block_until_ready``, median and spread; FLOPs, MFU, roofline.

JAX dispatches work asynchronously: a timer around ``f(x)`` measures the dispatch, not the
computation, unless the result is waited for. The first call also compiles. ``timeit``
handles both.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from labkit.env import Hardware


@dataclasses.dataclass(frozen=True)
class Timing:
    """Wall times of repeated calls, in seconds (compile excluded)."""

    times: tuple[float, ...]
    compile_s: float

    @property
    def median(self) -> float:
        """Median time per call."""
        return statistics.median(self.times)

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the measurement was."""
        return (max(self.times) - min(self.times)) / self.median

    def __str__(self) -> str:
        return (
            f"median {self.median * 1e3:.3f} ms over {len(self.times)} runs "
            f"(spread {self.spread:.0%}, first call {self.compile_s * 1e3:.1f} ms)"
        )


def block(x: Any) -> Any:
    """Wait until every array in the pytree ``x`` is computed."""
    import jax

    return jax.block_until_ready(x)


def timeit(
    fn: Callable[..., Any], *args: Any, warmup: int = 2, repeats: int = 10, **kwargs: Any
) -> Timing:
    """Time ``fn(*args)``: the first call (compile + run) apart, then warm-up, then repeats."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats=} {warmup=}")
    start = time.perf_counter()
    block(fn(*args, **kwargs))
    first = time.perf_counter() - start
    for _ in range(warmup):
        block(fn(*args, **kwargs))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        block(fn(*args, **kwargs))
        times.append(time.perf_counter() - start)
    return Timing(tuple(times), first)


def cost(compiled: Any) -> dict[str, float]:
    """XLA's cost analysis of a compiled executable, as one flat dict (``flops``, bytes...)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, Sequence):  # older jaxlibs returned one dict per device
        analysis = analysis[0] if analysis else {}
    return {str(k): float(v) for k, v in (analysis or {}).items()}


def flops(fn: Callable[..., Any], *args: Any) -> float:
    """FLOPs of one call of ``fn(*args)`` as counted by XLA's cost analysis."""
    import jax

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    counted = cost(jitted.lower(*args).compile()).get("flops", 0.0)
    if counted <= 0:
        raise ValueError("XLA's cost analysis reported no FLOPs for this function")
    return counted


def mfu(
    flops_per_step: float, step_s: float, hw: Hardware, num_devices: int = 1, dtype: str = "bf16"
) -> float:
    """Model FLOPs utilization: achieved FLOP/s over the hardware's dense peak."""
    peaks = {"bf16": hw.bf16_tflops, "fp8": hw.fp8_tflops, "fp32": hw.fp32_tflops}
    if dtype not in peaks:
        raise ValueError(f"dtype must be one of {sorted(peaks)}, got {dtype!r}")
    peak = peaks[dtype]
    if peak is None:
        raise ValueError(f"{hw.name} has no {dtype} peak in the hardware table")
    if step_s <= 0:
        raise ValueError(f"step time must be positive, got {step_s}")
    return flops_per_step / step_s / (peak * 1e12 * num_devices)


@dataclasses.dataclass(frozen=True)
class RooflinePoint:
    """One measured matmul: size, dtype, time, achieved FLOP/s and arithmetic intensity."""

    n: int
    dtype: str
    seconds: float
    tflops: float
    intensity: float  # FLOPs per byte moved (ideal: each operand read once, result written)


def matmul_roofline(
    sizes: Sequence[int] = (128, 256, 512, 1024),
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    repeats: int = 5,
) -> list[RooflinePoint]:
    """Measure square matmuls on the default device: achieved TFLOP/s vs arithmetic intensity."""
    import jax
    import jax.numpy as jnp

    points = []
    matmul = jax.jit(jnp.matmul)
    for dtype in dtypes:
        for n in sizes:
            a = jax.random.normal(jax.random.key(0), (n, n), dtype=dtype)  # (n, n)
            b = jax.random.normal(jax.random.key(1), (n, n), dtype=dtype)  # (n, n)
            timing = timeit(matmul, a, b, warmup=1, repeats=repeats)
            work = 2.0 * n**3
            moved = 3 * n * n * jnp.dtype(dtype).itemsize
            points.append(
                RooflinePoint(n, dtype, timing.median, work / timing.median / 1e12, work / moved)
            )
    return points
