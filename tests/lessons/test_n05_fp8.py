"""labkit.lessons.n05_fp8: the experiments' helpers and each checker (right, wrong, to do)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from labkit import fp8
from labkit.gpt.config import GPTConfig
from labkit.lessons import n05_fp8 as lesson
from labkit.xla.gemms import gemms


def test_current_scale_checker() -> None:
    assert lesson.check_current_scale(3.5 / 448).passed
    wrong = lesson.check_current_scale(448 / 3.5)
    assert not wrong.passed and wrong.attempted and "amax / fp8_max" in wrong.message
    assert not lesson.check_current_scale("small").passed
    assert not lesson.check_current_scale(...).attempted


def test_unsupported_pair_checker_compiles_the_answer() -> None:
    assert lesson.check_unsupported_pair((fp8.E5M2, fp8.E5M2)).passed
    assert lesson.check_unsupported_pair(("float8_e5m2", "float8_e5m2")).passed
    wrong = lesson.check_unsupported_pair((fp8.E4M3, fp8.E5M2))
    assert not wrong.passed and wrong.attempted and lesson.F8_TARGET in wrong.message
    bogus = lesson.check_unsupported_pair((jnp.bfloat16, fp8.E4M3))
    assert not bogus.passed and bogus.attempted and "FP8 dtypes" in bogus.message
    assert not lesson.check_unsupported_pair(42).passed
    assert not lesson.check_unsupported_pair(...).attempted


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
def test_h100_fp8_gemm_variants(name: str, target: str) -> None:
    lhs, rhs, scale, op, q = lesson.GEMM_VARIANTS[name]
    (gemm,) = gemms(lesson.h100_fp8_gemm(lhs, rhs, scale, op, q, n=128).hlo)
    assert gemm.target == target
    assert lesson.gemm_kinds(lesson.h100_fp8_gemm(n=128).hlo)[0].startswith("cublas")


def test_block_scaled_beats_per_tensor_on_wide_rows() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 128)).astype(np.float32) * np.logspace(-4, 2, 64)[:, None]
    b = rng.standard_normal((128, 32)).astype(np.float32)
    ref = a.astype(np.float64) @ b
    mx = lesson.worst_row_error(lesson.mxfp8_matmul(a, b), ref)
    assert mx < 0.1 < lesson.worst_row_error(lesson.per_tensor_matmul(a, b), ref)


def test_layer_amaxes_rows() -> None:
    cfg = GPTConfig.preset("tiny", dtype=jnp.bfloat16, num_layers=1)
    rows = lesson.layer_amaxes(cfg, batch_size=2)
    assert [r["layer"] for r in rows] == ["0.q", "0.k", "0.v", "0.o", "0.up", "0.down", "head"]
    assert all(r["grad amax"] > 0 and r["input scale"] > 0 for r in rows)


def test_train_curve_same_seed_same_curve() -> None:
    cfg = GPTConfig.preset("tiny", num_layers=1, dot_general=fp8.fp8_dot_general)
    a = lesson.train_curve(cfg, steps=2, batch_size=2).losses
    b = lesson.train_curve(cfg, steps=2, batch_size=2).losses
    assert a.shape == (2,) and np.array_equal(a, b) and np.isfinite(a).all()
