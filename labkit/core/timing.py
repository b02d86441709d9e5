"""Honest timing: warm-up, ``block_until_ready``, median and spread; MFU and a roofline.

JAX dispatches work asynchronously: a timer around ``f(x)`` measures the dispatch, not the
computation, unless the result is waited for. The first call also compiles. ``timeit``
handles both.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypedDict

from labkit.core.hardware import Hardware, Precision
from labkit.core.types import PyTree


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


def block[T](x: T) -> T:
    """Wait until every array in the pytree ``x`` is computed."""
    import jax

    return jax.block_until_ready(x)


def timeit(
    fn: Callable[..., PyTree],
    *args: object,
    warmup: int = 2,
    repeats: int = 10,
    **kwargs: object,
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


def mfu(
    flops_per_step: float,
    step_s: float,
    hw: Hardware,
    num_devices: int = 1,
    precision: Precision = "bf16",
) -> float:
    """Model FLOPs utilization: achieved FLOP/s over the dense peak of ``num_devices`` GPUs.

    ``flops_per_step`` is the *global* work of one step (all devices together), which is what
    :func:`labkit.xla.cost.flops` and ``compiled_flops`` return; a per-device count would
    come out ``num_devices`` times too low here.
    """
    peak = hw.peak_tflops(precision)
    if step_s <= 0:
        raise ValueError(f"step time must be positive, got {step_s}")
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    return flops_per_step / step_s / (peak * 1e12 * num_devices)


@dataclasses.dataclass(frozen=True)
class RooflinePoint:
    """One measured matmul: size, dtype, time, achieved FLOP/s and arithmetic intensity."""

    n: int
    dtype: str
    seconds: float
    tflops: float
    intensity: float  # FLOPs per byte moved (ideal: each operand read once, result written)


def sequence_param[T](
    value: Sequence[T], name: str, param: str, example: str = "[1024, 4096]"
) -> list[T]:
    """``value`` as a list; a string (papermill's ``-p`` passes a list as text) is an error.

    ``param`` is the notebook parameter that usually feeds it, named in the message.
    """
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(
            f"{name} must be a list, got {type(value).__name__} {value!r}. papermill's -p "
            f'passes text: give lists as YAML with -y, e.g. -y "{param}: {example}"'
        )
    return list(value)


def matmul_roofline(
    sizes: Sequence[int] = (128, 256, 512, 1024),
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    repeats: int = 5,
) -> list[RooflinePoint]:
    """Measure square matmuls on the default device: achieved TFLOP/s vs arithmetic intensity."""
    import jax
    import jax.numpy as jnp

    sizes = sequence_param(sizes, "sizes", "ROOFLINE_SIZES")
    dtypes = sequence_param(dtypes, "dtypes", "DTYPES", '["float32", "bfloat16"]')

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


# The peak each matmul dtype is held against: float32 at JAX's DEFAULT precision runs as
# TF32 on Ampere and Hopper tensor cores; float16 has the bf16 tensor-core rate.
PEAK_OF_DTYPE: dict[str, Precision] = {"float32": "tf32", "bfloat16": "bf16", "float16": "bf16"}


class PeakRow(TypedDict):
    """One row of :func:`best_against_peak`."""

    dtype: str
    n: int
    tflops: float
    peak: Precision
    peak_tflops: float
    fraction: float


def best_against_peak(points: Sequence[RooflinePoint], hw: Hardware) -> list[PeakRow]:
    """Per dtype, the fastest point against that dtype's own dense peak (see ``PEAK_OF_DTYPE``)."""
    rows: list[PeakRow] = []
    for dtype in dict.fromkeys(p.dtype for p in points):
        best = max((p for p in points if p.dtype == dtype), key=lambda p: p.tflops)
        precision = PEAK_OF_DTYPE.get(dtype, "fp32")
        peak = hw.peak_tflops(precision)
        rows.append(
            {
                "dtype": dtype,
                "n": best.n,
                "tflops": best.tflops,
                "peak": precision,
                "peak_tflops": peak,
                "fraction": best.tflops / peak,
            }
        )
    return rows


# One row of :func:`timing_rows` (its keys are table headers, some with spaces).
TimingRow = TypedDict(
    "TimingRow", {"flags": str, "median ms": float, "spread": str, "vs baseline": str}
)


def timing_rows(times: Mapping[str, Timing], baseline: str = "default") -> list[TimingRow]:
    """Rows ``{"flags", "median ms", "spread", "vs baseline"}`` from ``{name: Timing}``."""
    if baseline not in times:
        raise ValueError(f"baseline {baseline!r} is not one of the timings {list(times)}")
    base = times[baseline].median
    return [
        {
            "flags": name,
            "median ms": round(t.median * 1e3, 3),
            "spread": f"{t.spread:.0%}",
            "vs baseline": f"{t.median / base:.2f}x",
        }
        for name, t in times.items()
    ]
