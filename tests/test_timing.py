"""labkit.core.timing and labkit.xla.cost: timing protocol, FLOPs, MFU arithmetic, roofline."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from labkit.core import timing as bench
from labkit.core.hardware import hardware
from labkit.xla import cost


def test_timeit_waits_for_results_and_counts_calls() -> None:
    calls = []

    def f(x: jax.Array) -> jax.Array:
        calls.append(1)
        return x * 2

    timing = bench.timeit(f, jnp.ones(4), warmup=2, repeats=5)
    assert len(calls) == 1 + 2 + 5
    assert len(timing.times) == 5 and all(t > 0 for t in timing.times)
    assert timing.spread >= 0 and "median" in str(timing)


def test_timeit_rejects_bad_counts() -> None:
    with pytest.raises(ValueError, match="repeats >= 1"):
        bench.timeit(jnp.sin, jnp.ones(2), repeats=0)


def test_flops_of_a_matmul_match_2mnk() -> None:
    a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
    assert cost.flops(jnp.matmul, a, b) == 2 * 64 * 32 * 16


def test_flops_refuses_zero() -> None:
    with pytest.raises(ValueError, match="no FLOPs"):
        cost.flops(lambda x: x, jnp.ones(3))


def test_mfu_arithmetic() -> None:
    h100 = hardware("H100 SXM")
    # half of one H100's bf16 peak for one second
    assert bench.mfu(989e12 / 2, 1.0, h100) == pytest.approx(0.5)
    assert bench.mfu(989e12, 1.0, h100, num_devices=8) == pytest.approx(1 / 8)
    assert bench.mfu(1979e12, 1.0, h100, precision="fp8") == pytest.approx(1.0)


def test_mfu_errors() -> None:
    with pytest.raises(ValueError, match="no fp8 tensor-core peak"):
        bench.mfu(1.0, 1.0, hardware("A100 SXM"), precision="fp8")
    with pytest.raises(ValueError, match="precision must be"):
        bench.mfu(1.0, 1.0, hardware("H100 SXM"), precision="int4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        bench.mfu(1.0, 0.0, hardware("H100 SXM"))


def test_roofline_points_are_consistent() -> None:
    points = bench.matmul_roofline(sizes=(32, 64), dtypes=("float32",), repeats=2)
    assert [(p.n, p.dtype) for p in points] == [(32, "float32"), (64, "float32")]
    for p in points:
        assert p.intensity == pytest.approx(2 * p.n**3 / (3 * p.n * p.n * 4))
        assert p.tflops == pytest.approx(2 * p.n**3 / p.seconds / 1e12)


def test_timing_rows_against_baseline() -> None:
    rows = bench.timing_rows(
        {"default": bench.Timing((0.002, 0.002), 0.1), "x": bench.Timing((0.003,), 0.1)}
    )
    assert rows[0] == {"flags": "default", "median ms": 2.0, "spread": "0%", "vs baseline": "1.00x"}
    assert rows[1]["vs baseline"] == "1.50x"
