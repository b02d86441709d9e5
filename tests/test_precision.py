"""labkit.numerics.precision: formats, rounding, error metrics (special values too), HLO readers."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from labkit.numerics import precision as p

NUMERIC = (
    "bits",
    "exponent_bits",
    "mantissa_bits",
    "max",
    "smallest_normal",
    "smallest_subnormal",
    "eps",
    "has_inf",
)


def _numbers(f: p.FloatFormat) -> tuple:
    return tuple(getattr(f, k) for k in NUMERIC)


# ---------------------------------------------------------------------------------------
# Formats


def test_format_table_matches_finfo() -> None:
    for name in ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"):
        f, fi = p.FORMATS[name], ml_dtypes.finfo(name)
        assert (f.bits, f.mantissa_bits, f.max, f.eps) == (
            fi.bits,
            fi.nmant,
            float(fi.max),
            float(fi.eps),
        )
        assert f.dtype == name and f.smallest_normal == float(fi.smallest_normal)
    assert p.FORMATS["float8_e4m3fn"].max == 448 and not p.FORMATS["float8_e4m3fn"].has_inf
    assert p.FORMATS["float8_e5m2"].max == 57344 and p.FORMATS["float8_e5m2"].has_inf


def test_ieee_like_reproduces_the_ieee_formats_and_defines_tf32() -> None:
    assert _numbers(p.ieee_like("x", 8, 7)) == _numbers(p.FORMATS["bfloat16"])
    assert _numbers(p.ieee_like("x", 5, 10)) == _numbers(p.FORMATS["float16"])
    assert _numbers(p.ieee_like("x", 8, 23)) == _numbers(p.FORMATS["float32"])
    tf32 = p.get_format("tf32")
    assert (tf32.bits, tf32.exponent_bits, tf32.mantissa_bits, tf32.dtype) == (19, 8, 10, None)
    assert tf32.eps == 2.0**-10 and tf32.smallest_normal == p.FORMATS["float32"].smallest_normal
    assert tf32.unit_roundoff == 2.0**-11 and 3 < tf32.decimal_digits < 4
    with pytest.raises(ValueError, match="exponent >= 2"):
        p.ieee_like("bad", 1, 3)


def test_get_format_by_name_dtype_and_errors() -> None:
    assert p.get_format(jnp.bfloat16) == p.FORMATS["bfloat16"]
    assert p.get_format(p.FORMATS["float16"]) is p.FORMATS["float16"]
    assert p.get_format("float64").mantissa_bits == 52
    with pytest.raises(ValueError, match="unknown format"):
        p.get_format("float7")
    with pytest.raises(ValueError, match="unknown format"):
        p.get_format(jnp.int32)
    row = p.FORMATS["tensorfloat32"].row()
    assert row["storage dtype"] == "none" and row["mantissa"] == 10


@pytest.mark.parametrize(
    "name,dtype,count",
    [
        ("bfloat16", np.uint16, 2**16),
        ("float16", np.uint16, 2**16),
        ("float8_e4m3fn", np.uint8, 2**8),
        ("float8_e5m2", np.uint8, 2**8),
    ],
)
def test_grid_is_every_positive_value_of_the_format(name: str, dtype: type, count: int) -> None:
    with np.errstate(invalid="ignore"):
        every = np.arange(count, dtype=dtype).view(name).astype(np.float64)
    positive = np.unique(every[np.isfinite(every) & (every > 0)])
    assert np.array_equal(p.grid(name, 0.0, 1e39, max_points=10**6), positive)


def test_grid_between_one_and_four_and_its_limits() -> None:
    assert len(p.grid("bfloat16", 1.0, 4.0)) == 2 * 2**7 + 1
    assert len(p.grid("tensorfloat32", 1.0, 2.0)) == 2**10 + 1
    with pytest.raises(ValueError, match="narrow the range"):
        p.grid("float32", 1.0, 4.0)
    with pytest.raises(ValueError, match="lo <= hi"):
        p.grid("bfloat16", 2.0, 1.0)


def test_spacing_normal_subnormal_zero_and_specials() -> None:
    bf16 = p.FORMATS["bfloat16"]
    x = np.array([1.0, 1.5, 2.0, -3.0, 0.0, 1e-40, np.nan, np.inf])
    got = p.spacing(x, bf16)
    assert list(got[:4]) == [2**-7, 2**-7, 2**-6, 2**-6]
    assert got[4] == got[5] == bf16.smallest_subnormal
    assert np.isnan(got[6]) and np.isnan(got[7])
    assert p.spacing(1.0, "float32") == np.spacing(np.float32(1.0))


# ---------------------------------------------------------------------------------------
# Rounding


def test_round_mantissa_rounds_to_nearest_even_and_keeps_specials() -> None:
    x = np.array([1.0, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-10, -(1 + 3 * 2**-11)], np.float32)
    assert list(p.round_mantissa(x, 10)) == [1.0, 1.0, 1 + 2**-9, 1 + 2**-10, -(1 + 2**-9)]
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    out = p.round_mantissa(special, 10)
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == -np.inf
    assert out[3] == 0 and np.signbit(out[4])
    assert p.round_mantissa(np.float32(3.4e38), 7) == np.inf  # past bfloat16-like max
    assert np.array_equal(p.round_mantissa(x.astype(np.float64), 10), p.round_mantissa(x, 10))
    with pytest.raises(ValueError, match="mantissa_bits"):
        p.round_mantissa(x, 23)


def test_round_mantissa_7_bits_equals_the_bfloat16_cast() -> None:
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 1e3  # (10000,)
    cast = x.astype(jnp.bfloat16).astype(np.float32)
    assert np.array_equal(p.round_mantissa(x, 7), cast)


def test_round_to_overflow_per_format() -> None:
    assert p.round_to(1e6, "float16") == np.inf
    assert np.isnan(p.round_to(1e3, "float8_e4m3fn"))  # no inf in e4m3fn: overflow is NaN
    assert p.round_to(257.0, "bfloat16") == 256.0 and p.round_to(1 + 1e-3, "bfloat16") == 1.0
    assert p.round_to(1e38, "bfloat16") < np.inf  # float32's range


@pytest.mark.parametrize("name", ["tensorfloat32", "bfloat16", "float16", "float8_e4m3fn"])
def test_rounding_float32_is_within_half_an_ulp(name: str) -> None:
    x = np.random.default_rng(1).uniform(-100, 100, 20_000).astype(np.float32)  # (20000,)
    stats = p.errors(p.round_to(x, name), x, name)
    assert stats.mismatches == 0 and stats.max_ulp <= 0.5
    assert stats.max_rel <= p.get_format(name).unit_roundoff


# ---------------------------------------------------------------------------------------
# Error metrics


def test_errors_exact_match_is_zero() -> None:
    x = np.array([1.0, -2.5, 3e-3], np.float32)
    stats = p.errors(x, x.astype(np.float64))
    assert (stats.max_rel, stats.mean_rel, stats.norm_rel, stats.max_ulp) == (0, 0, 0, 0)
    assert stats.fmt == "float32" and stats.count == 3


def test_errors_relative_and_ulp_values() -> None:
    stats = p.errors(np.array([1.0078125]), np.array([1.0]), "bfloat16")  # one bf16 ulp off
    assert stats.max_rel == pytest.approx(2**-7) and stats.max_ulp == pytest.approx(1.0)
    assert stats.norm_rel == pytest.approx(2**-7) and stats.max_abs == pytest.approx(2**-7)


def test_errors_special_values() -> None:
    ref = np.array([np.nan, np.inf, -np.inf, 1.0])
    same = p.errors(ref.copy(), ref)
    assert same.mismatches == 0 and same.max_rel == 0 and same.max_ulp == 0
    cases = (
        [1.0, np.inf, -np.inf, 1.0],
        [np.nan, -np.inf, -np.inf, 1.0],
        [np.nan, np.inf, -np.inf, np.nan],
        [np.nan, np.inf, -np.inf, np.inf],
    )
    for actual in cases:
        stats = p.errors(np.array(actual), ref)
        assert stats.mismatches == 1 and stats.max_rel == math.inf and stats.max_ulp == math.inf
    only_special = p.errors(np.array([np.nan]), np.array([1.0]))
    assert math.isnan(only_special.mean_rel) and only_special.norm_rel == 0.0


def test_errors_zero_and_subnormal_references_are_floored() -> None:
    bf16 = p.FORMATS["bfloat16"]
    stats = p.errors(np.array([0.0, 1e-40, 0.0]), np.array([0.0, 0.0, 1e-40]), bf16)
    assert stats.mismatches == 0
    assert stats.max_rel == pytest.approx(1e-40 / bf16.smallest_normal)  # absolute, floored
    assert stats.max_ulp == pytest.approx(1e-40 / bf16.smallest_subnormal)
    zero_norm = p.errors(np.array([1e-3]), np.array([0.0]))
    assert zero_norm.norm_rel == math.inf


def test_errors_rejects_shape_mismatch_and_defaults_fmt() -> None:
    with pytest.raises(ValueError, match="differ in shape"):
        p.errors(np.ones(3), np.ones(4))
    assert p.errors(np.ones(2, jnp.bfloat16), np.ones(2)).fmt == "bfloat16"
    assert p.errors(np.ones(2), np.ones(2)).fmt == "float32"  # float64 actual: float32 units
    assert p.errors(np.ones(2, np.int32), np.ones(2)).fmt == "float32"
    assert p.errors(np.ones(2), np.ones(2)).row("x")["case"] == "x"


def test_matmul_errors_on_cpu() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 64)), rng.standard_normal((64, 64))  # (64, 64) each
    f32 = p.matmul_errors(a, b)
    highest = p.matmul_errors(a, b, precision=jax.lax.Precision.HIGHEST)
    assert f32.norm_rel < 1e-6 and highest.norm_rel == f32.norm_rel
    bf16 = p.matmul_errors(a, b, input_format="bfloat16", preferred_element_type=jnp.float32)
    tf32 = p.matmul_errors(a, b, input_format="tf32")
    assert 5e-4 < bf16.norm_rel < p.FORMATS["bfloat16"].unit_roundoff
    assert 5e-5 < tf32.norm_rel < p.FORMATS["tensorfloat32"].unit_roundoff


# ---------------------------------------------------------------------------------------
# HLO readers

CUBLAS_AND_TRITON = """HloModule m, is_scheduled=true

%gemm_body (p0: bf16[4,4], p1: bf16[4,4]) -> f32[4,4] {
  %p0 = bf16[4,4]{1,0} parameter(0)
  %p1 = bf16[4,4]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={highest,highest}, algorithm=dot_bf16_bf16_f32
}

%cast_body (q0: f32[4,4]) -> bf16[4,4] {
  %q0 = f32[4,4]{1,0} parameter(0)
  ROOT %c = bf16[4,4]{1,0} convert(%q0)
}

ENTRY %main (a: f32[4,4], b: f32[4,4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0)
  %b = f32[4,4]{1,0} parameter(1)
  %ca = bf16[4,4]{1,0} fusion(%a), kind=kLoop, calls=%cast_body
  %cb = bf16[4,4]{1,0} convert(%b)
  %g = f32[4,4]{1,0} fusion(%ca, %cb), kind=kCustom, calls=%gemm_body, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %cc = (f32[4,4]{1,0}, s8[16]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"precision_config":{"operand_precision":["DEFAULT","DEFAULT"],"algorithm":"ALG_UNSET"}}}
  %gte = f32[4,4]{1,0} get-tuple-element(%cc), index=0
  %back = f32[4,4]{1,0} convert(%cb)
  ROOT %s = f32[4,4]{1,0} add(%g, %gte)
}
"""  # noqa: E501


def test_gemms_reads_triton_and_cublas() -> None:
    found = {g.kernel: g for g in p.gemms(CUBLAS_AND_TRITON)}
    triton, cublas = found["triton"], found["cublas"]
    assert (triton.lhs, triton.rhs, triton.out) == ("bf16", "bf16", "f32")
    assert (triton.precision, triton.algorithm) == ("HIGHEST", "dot_bf16_bf16_f32")
    assert triton.target == "__triton_nested_gemm_fusion"
    assert (cublas.lhs, cublas.out, cublas.precision, cublas.algorithm) == (
        "f32",
        "f32",
        "DEFAULT",
        "",
    )
    assert cublas.target == "__cublas$lt$matmul" and len(found) == 2


def test_convert_counts_include_fusion_bodies() -> None:
    counts = p.convert_counts(CUBLAS_AND_TRITON)
    assert counts == {"f32->bf16": 2, "bf16->f32": 1}


def test_gemms_of_a_real_cpu_compile() -> None:
    x = jnp.ones((8, 8), jnp.bfloat16)
    text = jax.jit(lambda a, b: a @ b).lower(x, x).compile().as_text()
    (gemm,) = p.gemms(text)
    assert gemm.kernel == "dot" and gemm.lhs == "bf16"


# ---------------------------------------------------------------------------------------
# Policies


def test_policies_give_gpt_overrides_and_cast_floats_only() -> None:
    mixed = p.get_policy("mixed_bf16")
    assert mixed.config_overrides() == {
        "param_dtype": jnp.dtype("float32"),
        "dtype": jnp.dtype("bfloat16"),
    }
    tree = {"w": jnp.ones(2, jnp.float32), "ids": jnp.ones(2, jnp.int32)}
    assert mixed.cast_to_compute(tree)["w"].dtype == jnp.bfloat16
    assert mixed.cast_to_compute(tree)["ids"].dtype == jnp.int32
    assert mixed.cast_to_params(mixed.cast_to_compute(tree))["w"].dtype == jnp.float32
    assert p.get_policy("pure_bf16").cast_to_output(tree)["w"].dtype == jnp.float32
    assert p.POLICIES["float32"].compute == "float32"


def test_policy_validation_and_dot_general_hook() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        p.get_policy("fp4")
    with pytest.raises(ValueError, match="float dtype"):
        p.Policy("bad", "int8", "bfloat16", "float32")
    hooked = dataclasses.replace(
        p.get_policy("mixed_bf16"), name="hooked", dot_general=jax.lax.dot_general
    )
    assert hooked.config_overrides()["dot_general"] is jax.lax.dot_general
    assert p.Policy("x", jnp.bfloat16, "bfloat16", "float32").params == "bfloat16"
