"""labkit.lessons.n05_fp8: the experiments' helpers and each checker (right, wrong, to do)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from labkit.core.mesh import abstract, make_mesh
from labkit.gpt import train
from labkit.gpt.config import GPTConfig
from labkit.lessons import n05_fp8 as lesson
from labkit.numerics import fp8
from labkit.xla.aot import AotResult
from labkit.xla.gemms import gemms


def test_round_trip_checker() -> None:
    assert lesson.round_trip(0.3, 3.5) == 0.3125  # 0.3 / 2**-7 = 38.4 -> 40 in e4m3
    assert lesson.check_round_trip(0.3125).passed
    wrong = lesson.check_round_trip(3.5 / 448)  # the scale, not the value
    assert not wrong.passed and wrong.attempted and "amax / fp8_max" in wrong.message
    assert not lesson.check_round_trip("small").passed
    assert not lesson.check_round_trip(...).attempted


def test_op_between_checker_compiles_the_answer() -> None:
    right = lesson.check_op_between(jnp.transpose, n=128)
    assert right.passed and lesson.F8_TARGET in right.message
    wrong = lesson.check_op_between(jnp.negative, n=128)
    assert not wrong.passed and wrong.attempted and "__cublas$lt$matmul " in wrong.message
    same = lesson.check_op_between(lambda x: x, n=128)
    assert not same.passed and same.attempted and "unchanged" in same.message
    shape = lesson.check_op_between(lambda x: x[:4], n=128)
    assert not shape.passed and shape.attempted and "(4, 128)" in shape.message
    assert not lesson.check_op_between(42).passed
    assert not lesson.check_op_between(...).attempted


def test_recovery_checker() -> None:
    assert lesson.recovery_step(5, 16) == 21
    assert lesson.check_recovery(21).passed
    wrong = lesson.check_recovery(6)
    assert not wrong.passed and wrong.attempted and "history" in wrong.message
    assert not lesson.check_recovery(None).attempted


@pytest.mark.parametrize(
    ("name", "target"),
    [("scaled e4m3 x e4m3", lesson.F8_TARGET), ("per-row scale (vector)", "__cublas$lt$matmul")],
)
def test_dequant_gemm_variants(name: str, target: str) -> None:
    lhs, rhs, scale, op, q = lesson.GEMM_VARIANTS[name]
    (gemm,) = gemms(lesson.dequant_gemm(lhs, rhs, scale, op, q, n=128).hlo)
    assert gemm.target == target


SHAPE = (128, 128, 128)


@pytest.fixture(scope="module")
def fp8_layer() -> AotResult:
    """One FP8 dense layer's step for an H100, compiled once for this module."""
    return lesson.linear_step(fp8.fp8_dot_general, shape=SHAPE)


def test_fp8_dot_general_has_fp8_gemms(fp8_layer: AotResult) -> None:
    assert fp8.gemm_passes(fp8_layer.hlo) == {"forward": 1, "backward": 2, "not FP8": 0}
    assert lesson.gemm_rows(fp8_layer.hlo)[0]["operands"] == "f8e4m3fn x f8e4m3fn"


def test_qdq_trap_has_no_fp8_gemm_and_names_simplify_fp_conversions() -> None:
    trap = lesson.qdq_trap(shape=SHAPE)
    assert trap.removed_by.endswith("/ simplify-fp-conversions")
    assert fp8.gemm_passes(trap.result.hlo) == {"forward": 0, "backward": 0, "not FP8": 3}
    assert fp8.fp8_gemms(trap.result.hlo) == []


def test_pass_that_removes_a_needle_never_there_raises() -> None:
    step = jax.jit(lambda x: x * 2)
    x = jax.ShapeDtypeStruct((8,), jnp.float32)
    mesh = lesson.gpu_mesh((1,), ("x",))
    with pytest.raises(ValueError, match="never removed"):
        lesson.pass_that_removes(step, abstract(x, mesh), needle="f8e4m3fn[")


def test_raw_e5m2_dot_triton_reads_fp8_cublas_widens() -> None:
    (default,) = gemms(lesson.raw_dot_program(n=128).hlo)
    assert (default.lhs, default.rhs) == ("f8e5m2", "f8e5m2")
    (cublas,) = gemms(lesson.raw_dot_program(n=128, options=lesson.CUBLAS).hlo)
    assert cublas.lhs == "f16" and cublas.target == "__cublas$lt$matmul"


def test_scale_modes_name_the_gpus() -> None:
    modes = {m.mode: m for m in fp8.SCALE_MODES}
    assert "Hopper (sm_90) only" in modes["BLK128x128_32F"].gpus
    assert modes["VEC32_UE8M0"].gpus.startswith("Blackwell")
    assert "docs.nvidia.com/cuda/cublas" in fp8.SCALE_MODES_SOURCE


def test_block_scaled_beats_per_tensor_on_wide_rows() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 128)).astype(np.float32) * np.logspace(-4, 2, 64)[:, None]
    b = rng.standard_normal((128, 32)).astype(np.float32)
    ref = a.astype(np.float64) @ b
    mx = lesson.worst_row_error(lesson.mxfp8_matmul(a, b), ref)
    assert mx < 0.1 < lesson.worst_row_error(lesson.per_tensor_matmul(a, b), ref)


# One block of the tiny GPT: the cheapest FP8 step to compile tried here (a d_model 16 GPT took
# 8.6 s of CPU against 6.5 s).
ONE_BLOCK = GPTConfig.preset("tiny", num_layers=1, dtype=jnp.bfloat16)


@pytest.fixture(scope="module")
def fp8_runs() -> tuple[lesson.Curve, lesson.Curve]:
    """Two FP8 runs of one compiled step from one state (random params, not the model's
    init, which would cost a compile), recording their first step's amaxes."""
    cfg = dataclasses.replace(ONE_BLOCK, dot_general=fp8.fp8_dot_general)
    mesh = make_mesh((1,), ("data",), devices=jax.devices()[:1])
    _, abstract_state, _ = train.abstract_train_state(cfg, mesh, "dp", 1)
    params = jax.device_get(train.timing_state(abstract_state["params"]))
    state = {"params": params, "opt_state": jax.device_get(train.make_tx(1e-3).init(params))}
    a, b = (
        lesson.train_curve(cfg, steps=2, batch_size=2, state=state, record_amaxes=True)
        for _ in range(2)
    )
    return a, b


def test_train_curve_same_state_same_curve(fp8_runs: tuple[lesson.Curve, lesson.Curve]) -> None:
    a, b = fp8_runs  # the first run's donated buffers were copies: the state is intact
    assert a.losses.shape == (2,) and np.isfinite(a.losses).all()
    assert np.array_equal(a.losses, b.losses) and a.amaxes == b.amaxes


def test_train_curve_records_the_first_steps_amaxes(
    fp8_runs: tuple[lesson.Curve, lesson.Curve],
) -> None:
    rows = fp8_runs[0].amaxes
    assert [r["layer"] for r in rows] == ["0.q", "0.k", "0.v", "0.o", "0.up", "0.down", "head"]
    assert all(r["grad amax"] > 0 and r["input scale"] > 0 for r in rows)


def test_record_amaxes_needs_the_fp8_dot_general() -> None:
    with pytest.raises(ValueError, match="fp8_dot_general"):
        lesson.train_curve(ONE_BLOCK, steps=1, batch_size=2, record_amaxes=True)


def test_scale_sweep_shows_the_window_of_an_unscaled_cast() -> None:
    decades = (-8, -2, 0, 2, 5)
    found = lesson.scale_sweep(decades, size=16)
    assert list(found) == [
        "e4m3, no scale",
        "e4m3, current scaling",
        "e5m2, no scale",
        "e5m2, current scaling",
    ]
    scaled = found["e4m3, current scaling"]
    assert max(scaled) / min(scaled) < 1.1  # the same error at every magnitude
    assert found["e4m3, no scale"][0] == 1.0  # 1e-8: all flushed to zero
    assert found["e4m3, no scale"][-1] > 0.9  # 1e5: saturated at 448
    assert lesson.working_decades(found, "e4m3", decades) == [0, 2]
    assert lesson.working_decades(found, "e5m2", decades) == [-2, 0, 2]
    shown = lesson.scale_sweep_picture(found, decades)
    assert shown.figure is not None
    (ax,) = shown.figure.axes
    assert (ax.get_xscale(), ax.get_yscale(), len(ax.lines)) == ("log", "log", 4)
    assert list(ax.lines[0].get_xdata()) == [1e-8, 1e-2, 1.0, 1e2, 1e5]
    assert "unscaled e4m3 errs within 2x of current scaling from 1e0 to 1e2" in shown.caption
    assert "unscaled e5m2 errs within 2x of current scaling from 1e-2 to 1e2" in shown.caption


def test_amax_picture_names_each_matmul() -> None:
    rows = [
        {"layer": "0.q", "input amax": 3.0, "weight amax": 0.2, "grad amax": 1e-5},
        {"layer": "head", "input amax": 5.0, "weight amax": 0.3, "grad amax": 1e-3},
    ]
    shown = lesson.amax_picture(rows)
    assert shown.figure is not None
    (ax,) = shown.figure.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.q", "head"]
    assert [ln.get_label() for ln in ax.lines] == ["input amax", "weight amax", "grad amax"]
    assert shown.caption == (
        "Over 2 FP8 matmuls: input amax 3 to 5; weight amax 0.2 to 0.3; grad amax 1e-05 to "
        "0.001. Gradient amax per matmul: 0.q 1e-05, head 0.001."
    )


def test_fp8_gemm_kernels_are_counted_from_the_compiled_code() -> None:
    untuned, ruled = (lesson.linear_kernels(tiles=t) for t in ("untuned", "rule"))
    assert [g.issues for g in untuned.gemms] == ["mma.sync"] * 3
    assert not any(g.fp8 for g in untuned.gemms)  # FP8 widened to f16 for mma.sync
    rows = lesson.fp8_wgmma_rows(ruled)
    assert [r["issues"] for r in rows] == ["wgmma"] * 3 and all(g.fp8 for g in ruled.gemms)
    assert sorted(r["multiplies"] for r in rows) == ["e4m3 x e4m3", "e4m3 x e5m2", "e5m2 x e4m3"]
    assert all(m.endswith(".e5m2.e5m2") for m in lesson.raw_dot_mma(tiles="rule"))


def test_e4m3_cast_prediction() -> None:
    assert lesson.check_e4m3_cast("nan").passed and lesson.check_e4m3_cast(float("nan")).passed
    assert not lesson.check_e4m3_cast(448).passed and not lesson.check_e4m3_cast("inf").passed
    assert "answer a number" in lesson.check_e4m3_cast("big").message
    assert lesson.check_e4m3_cast(448.0, value=448.0).passed  # in range: the value itself
