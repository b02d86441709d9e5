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
    with pytest.raises(ValueError, match="shows FLOPs"):
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


def test_mfu_of_a_sharded_program_uses_global_flops() -> None:
    from labkit.core.mesh import abstract, make_mesh

    mesh = make_mesh((8,), ("data",))
    a = abstract(jax.ShapeDtypeStruct((1024, 512), jnp.float32), mesh, jax.P("data"))
    b = abstract(jax.ShapeDtypeStruct((512, 256), jnp.float32), mesh)
    work = cost.flops(jnp.matmul, a, b)  # all 8 devices together
    assert work == 2 * 1024 * 512 * 256
    h100 = hardware("H100 SXM")
    step_s = work / (8 * h100.tf32_tflops * 1e12)  # as if every GPU ran at its TF32 peak
    assert bench.mfu(work, step_s, h100, num_devices=8, precision="tf32") == pytest.approx(1.0)


@pytest.mark.parametrize("bad", ["[1024, 4096]", "1024", 1024])
def test_roofline_rejects_text_from_papermill_p(bad: object) -> None:
    with pytest.raises(TypeError, match=r"sizes must be a list.*-y \"ROOFLINE_SIZES: "):
        bench.matmul_roofline(sizes=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dtypes must be a list"):
        bench.matmul_roofline(sizes=[8], dtypes="float32")


def test_best_against_own_peak() -> None:
    points = [
        bench.RooflinePoint(8, "float32", 1.0, 100.0, 1.0),
        bench.RooflinePoint(9, "float32", 1.0, 200.0, 1.0),
        bench.RooflinePoint(8, "bfloat16", 1.0, 300.0, 1.0),
    ]
    rows = bench.best_against_peak(points, hardware("H100 SXM"))
    assert [(r["dtype"], r["n"], r["peak"]) for r in rows] == [
        ("float32", 9, "tf32"),
        ("bfloat16", 8, "bf16"),
    ]
    assert rows[0]["fraction"] == pytest.approx(200 / 494.5)
    assert rows[1]["fraction"] == pytest.approx(300 / 989.0)


def test_timing_rows_against_baseline() -> None:
    rows = bench.timing_rows(
        {"default": bench.Timing((0.002, 0.002), 0.1), "x": bench.Timing((0.003,), 0.1)}
    )
    assert rows[0] == {"flags": "default", "median ms": 2.0, "spread": "0%", "vs baseline": "1.00x"}
    assert rows[1]["vs baseline"] == "1.50x"
