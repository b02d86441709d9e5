"""labkit.lessons.n04_bf16: the experiments' helpers and each checker (right, wrong, to do)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from labkit.core.figures import overlapping_labels
from labkit.lessons import n04_bf16 as lesson
from labkit.numerics.precision import convert_counts, gemms


def test_exact_integers_checker() -> None:
    assert lesson.check_exact_integers(2048).passed  # float16: 10 stored bits + 1
    assert lesson.check_exact_integers(256, "bfloat16").passed
    wrong = lesson.check_exact_integers(256)  # bfloat16's answer for float16
    assert not wrong.passed and wrong.attempted and "significand" in wrong.message
    assert not lesson.check_exact_integers("many").passed
    assert not lesson.check_exact_integers(...).attempted


def test_default_precision_checker_compiles_under_the_setting() -> None:
    assert lesson.check_default_precision("highest").passed
    assert lesson.check_default_precision("float32").passed
    tf32 = lesson.check_default_precision("tensorfloat32")
    assert not tf32.passed and tf32.attempted and "HIGH" in tf32.message
    assert not lesson.check_default_precision("F32_F32_F32").passed  # dropped on 8 GPUs
    bogus = lesson.check_default_precision("not-a-precision")
    assert not bogus.passed and bogus.attempted and "does not take" in bogus.message
    assert not lesson.check_default_precision(None).attempted


def test_convert_count_checker_lowers_the_layers_asked_for() -> None:
    """04.3's hint holds: each layer adds the same casts (a fixed part plus one per layer)."""
    lowered = [lesson.lowered_step_hlo("mixed_bf16", n, 8) for n in (1, 2, 3)]
    counts = [convert_counts(text)["f32->bf16"] for text in lowered]
    assert counts[0] > 0 and counts[2] - counts[1] == counts[1] - counts[0] > 0
    assert all(
        convert_counts(text)["bf16->f32"] == n for text, n in zip(lowered, counts, strict=True)
    )
    assert lesson.check_convert_count(counts[2], 8).passed
    assert lesson.check_convert_count(counts[1], 8, num_layers=2).passed
    wrong = lesson.check_convert_count(counts[1], 8)
    assert not wrong.passed and "per layer" in wrong.message
    assert not lesson.check_convert_count("two", 8).passed
    assert not lesson.check_convert_count(..., 8).attempted


def test_h100_matmul_and_gemm_row() -> None:
    result = lesson.h100_matmul(jax.lax.Precision.HIGHEST, num_gpus=2, n=128)
    (gemm,) = gemms(result.hlo)
    assert result.num_devices == 2 and gemm.precision == "HIGHEST" and gemm.lhs == "f32"
    row = lesson.gemm_row("HIGHEST", gemm, 2)
    assert row["operands"] == "f32 x f32 -> f32" and row["algorithm"] == "(none)"


def test_loss_gap() -> None:
    assert lesson.loss_gap([1.0, 2.0], [1.5, 2.0]) == {"max": 0.5, "mean": 0.25}
    with pytest.raises(ValueError, match="differ in length"):
        lesson.loss_gap([1.0], [1.0, 2.0])


def test_train_run_same_seed_same_start_and_casts_in_the_hlo() -> None:
    f32 = lesson.train_run("float32", steps=2, batch_size=2, seeds=(0, 1))
    mixed = lesson.train_run("mixed_bf16", steps=2, batch_size=2, seeds=(0,))
    assert f32.losses[0].shape == (2,) and np.all(np.isfinite(f32.losses[0]))
    assert abs(f32.losses[0][0] - mixed.losses[0][0]) < 0.01  # same weights, same batch
    assert f32.losses[0][0] != f32.losses[1][0]  # another seed, another start
    assert convert_counts(f32.hlo)["f32->bf16"] == 0 < convert_counts(mixed.hlo)["f32->bf16"]
    assert (
        convert_counts(f32.lowered)["f32->bf16"] == 0 < convert_counts(mixed.lowered)["f32->bf16"]
    )
    assert f32.compile_s > 0 and mixed.policy == "mixed_bf16"


def test_float32_dot_forms_sorts_dots_by_what_made_them_float32() -> None:
    from labkit.lessons.n04_bf16 import float32_dot_forms

    hlo = """HloModule m

ENTRY %main (a: f32[8,4], b: f32[8,6], c: f32[2,3,4], d: f32[2,4,5], e: bf16[4,8]) -> f32[4,6] {
  %a = f32[8,4]{1,0} parameter(0)
  %b = f32[8,6]{1,0} parameter(1)
  %c = f32[2,3,4]{2,1,0} parameter(2)
  %d = f32[2,4,5]{2,1,0} parameter(3)
  %e = bf16[4,8]{1,0} parameter(4)
  %wgrad = f32[4,6]{1,0} dot(%a, %b), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %attn = f32[2,3,5]{2,1,0} dot(%c, %d), lhs_batch_dims={0}, lhs_contracting_dims={2}, """ + (
        """rhs_batch_dims={0}, rhs_contracting_dims={1}
  %fwd = f32[8,6]{1,0} dot(%a, %wgrad), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %half = bf16[4,4]{1,0} dot(%e, %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %out = f32[4,6]{1,0} copy(%wgrad)
}
"""
    )
    assert float32_dot_forms(hlo) == {"token-contracting": 1, "batched": 1, "other": 1}


def test_shardy_reproducer_is_a_self_contained_script() -> None:
    import ast

    tree = ast.parse(lesson.SHARDY_REPRODUCER)
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module)])
    }
    assert imported == {"os", "jax", "jaxlib"}
    assert "DotAlgorithmPreset.BF16_BF16_F32" in lesson.SHARDY_REPRODUCER


def test_run_reproducer_runs_the_script_in_a_fresh_process() -> None:
    verdicts = lesson.reproducer_verdicts(lesson.run_reproducer())
    assert verdicts == {  # Shardy drops it, even when nothing is partitioned
        (1, True, "split"): True,
        (8, True, "split"): False,
        (8, True, "replicated"): False,
        (8, False, "split"): True,
    }


def test_reproducer_verdicts_read_each_line() -> None:
    out = "jax 0\ndevices=1 shardy=True x=split algorithm_kept=True\n"
    out += "devices=8 shardy=True x=replicated algorithm_kept=False\n"
    assert lesson.reproducer_verdicts(out) == {
        (1, True, "split"): True,
        (8, True, "replicated"): False,
    }
    assert lesson.reproducer_verdicts("nothing") == {}


def test_rounded_input_errors_fall_with_the_mantissa() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    b = rng.standard_normal((64, 64)).astype(np.float32)
    found = lesson.rounded_input_errors(a, b)
    assert list(found) == list(lesson.SWEPT_FORMATS)
    assert found["float8_e5m2"] > found["float8_e4m3fn"] > found["bfloat16"] > found["float16"]
    assert found["float16"] == pytest.approx(found["tensorfloat32"], rel=0.05)  # both 10 bits
    assert found["float32"] < 1e-6  # inputs exact: float32 accumulation alone


def test_error_sweep_picture_plots_errors_beside_half_eps() -> None:
    found = {"float32": 3e-7, "bfloat16": 2.3e-3, "float8_e4m3fn": 0.037}
    shown = lesson.error_sweep_picture(found, 256)
    assert shown.figure is not None
    (ax,) = shown.figure.axes
    assert ax.get_xlabel() == "mantissa bits of the input format" and ax.get_yscale() == "log"
    measured, half_eps = ax.lines
    assert list(measured.get_xdata()) == [3.0, 7.0, 23.0]  # fewest mantissa bits first
    assert list(half_eps.get_ydata()) == [2**-4, 2**-8, 2**-24]
    assert "0.037 at e4m3fn, 0.0023 at bfloat16, 3e-07 at float32" in shown.caption
    assert shown.title.startswith("Matmul error against the input format (256 x 256")


def test_formats_picture_counts_the_values_it_ticks() -> None:
    shown = lesson.formats_picture()
    assert shown.figure is not None
    values, spacing = shown.figure.axes
    assert [len(ln.get_xdata()) for ln in values.lines] == [257, 17, 9]  # in [1, 4]
    assert len(spacing.lines) == 6 and spacing.get_ylabel() == "ulp / |x| (relative gap)"
    assert "bfloat16 257, float8_e4m3fn 17, float8_e5m2 9" in shown.caption
    assert "bfloat16 0.00391 to 0.00781" in shown.caption
    assert overlapping_labels(shown.figure) == []


def test_bf16_increment_prediction() -> None:
    assert lesson.check_bf16_increment(1.0).passed
    wrong = lesson.check_bf16_increment(1.001)
    assert not wrong.passed and "(1.0078125)" in wrong.message
    assert not lesson.check_bf16_increment(...).attempted
