"""labkit.numerics.fp8: scales, quantize / dequantize, delayed scaling, the FP8 dot_general."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from labkit.numerics import fp8

DIMS = (((1,), (0,)), ((), ()))


def test_fp8_max_and_bad_dtype() -> None:
    assert fp8.fp8_max(fp8.E4M3) == 448.0 and fp8.fp8_max(fp8.E5M2) == 57344.0
    with pytest.raises(ValueError, match="float8_e4m3fn or float8_e5m2"):
        fp8.fp8_max(jnp.bfloat16)


def test_scale_maps_amax_to_max() -> None:
    x = jnp.array([-3.5, 1.0, 2.0])
    assert float(fp8.amax(x)) == 3.5
    assert float(fp8.scale_from_amax(3.5)) == pytest.approx(3.5 / 448)
    assert float(fp8.scale_from_amax(3.5, fp8.E5M2, margin=1)) == pytest.approx(7.0 / 57344)
    data, scale = fp8.quantize_current(x)
    assert float(jnp.abs(data.astype(jnp.float32)).max()) == 448.0
    assert float(fp8.dequantize(data, scale)[0]) == pytest.approx(-3.5)


@pytest.mark.parametrize("bad", [0.0, -1.0, np.nan, np.inf])
def test_scale_of_zero_nan_inf_amax_is_one(bad: float) -> None:
    assert float(fp8.scale_from_amax(bad)) == 1.0


def test_zero_input_quantizes_to_zero() -> None:
    data, scale = fp8.quantize_current(jnp.zeros((4, 4)))
    assert float(scale) == 1.0
    assert not bool(jnp.isnan(fp8.dequantize(data, scale)).any())
    assert float(jnp.abs(fp8.dequantize(data, scale)).max()) == 0.0


def test_zero_scale_is_replaced_not_divided_by() -> None:
    out = fp8.dequantize(fp8.quantize(jnp.array([1.0, -2.0]), 0.0), 0.0)
    np.testing.assert_array_equal(np.asarray(out), [1.0, -2.0])


def test_overflow_saturates_or_follows_the_cast() -> None:
    x = jnp.array([1e6, -1e6])
    np.testing.assert_array_equal(np.asarray(fp8.quantize(x).astype(jnp.float32)), [448, -448])
    raw = fp8.quantize(x, saturate=False).astype(jnp.float32)
    assert bool(jnp.isnan(raw).all())  # e4m3fn has no inf
    raw5 = fp8.quantize(x, dtype=fp8.E5M2, saturate=False).astype(jnp.float32)
    np.testing.assert_array_equal(np.asarray(raw5), [np.inf, -np.inf])


def test_nan_stays_nan() -> None:
    x = jnp.array([np.nan, 1.0])
    data, scale = fp8.quantize_current(x)  # NaN amax: scale 1
    assert float(scale) == 1.0
    out = np.asarray(fp8.dequantize(data, scale))
    assert np.isnan(out[0]) and out[1] == 1.0


def test_qdq_error_within_half_ulp_and_modes() -> None:
    x = jnp.asarray(np.random.default_rng(0).standard_normal(4096), jnp.float32) * 1e-3
    assert fp8.rel_error(fp8.qdq(x, scaling="current"), x) < 0.0625
    assert fp8.rel_error(fp8.qdq(x, scaling="none"), x) > 0.3  # below e4m3's normals
    with pytest.raises(ValueError, match="scaling must be"):
        fp8.qdq(x, scaling="per-row")


def test_delayed_scaling_uses_history_then_updates() -> None:
    state = fp8.DelayedScaling.create(history_len=2)
    assert float(state.scale) == 1.0  # empty history
    data, scale, state = fp8.quantize_delayed(jnp.full((3,), 100.0), state)
    assert float(scale) == 1.0 and float(data[0].astype(jnp.float32)) == 96.0  # e4m3 grid
    assert float(state.scale) == pytest.approx(100.0 / 448)
    state = state.update(jnp.ones(3)).update(jnp.ones(3))  # the 100 leaves a history of 2
    assert float(state.scale) == pytest.approx(1.0 / 448)
    assert float(state.update(jnp.array([np.nan])).history[0]) == 0.0
    with pytest.raises(ValueError, match="history_len"):
        fp8.DelayedScaling.create(0)


def test_delayed_lags_growing_data() -> None:
    rng = np.random.default_rng(0)
    seq = [rng.standard_normal((64, 64)) * 2.0**t for t in range(6)]
    delayed = fp8.delayed_errors(seq, history_len=4)
    current = fp8.rel_error(fp8.qdq(jnp.asarray(seq[-1], jnp.float32)), seq[-1])
    assert delayed[-1] > 1.5 * current


def test_rel_error_special_cases() -> None:
    assert fp8.rel_error([np.nan], [1.0]) == np.inf
    assert fp8.rel_error([0.0], [0.0]) == 0.0


def test_scaled_dot_matches_float() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((32, 64)), rng.standard_normal((64, 16))
    (qa, sa), (qb, sb) = fp8.quantize_current(a), fp8.quantize_current(b)
    out = fp8.scaled_dot(qa, qb, sa, sb, compute_dtype=jnp.float32)  # (32, 16)
    assert out.shape == (32, 16) and fp8.rel_error(out, a @ b) < 0.08
    q = fp8.scaled_dot(qa, qb, sa, sb, compute_dtype=jnp.float32, out_dtype=fp8.E4M3)
    assert q.dtype == jnp.float8_e4m3fn


def test_fp8_dot_general_forward_and_gradients() -> None:
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((8, 32)), jnp.float32)  # (batch, in)
    w = jnp.asarray(rng.standard_normal((32, 4)), jnp.float32)  # (in, out)
    out = fp8.fp8_dot_general(x, w, DIMS)
    assert fp8.rel_error(out, x @ w) < 0.08

    def loss(dg, x, w):
        return (dg(x, w, DIMS) ** 2).sum()

    g8 = jax.grad(lambda x, w: loss(fp8.fp8_dot_general, x, w), argnums=(0, 1))(x, w)
    g = jax.grad(lambda x, w: loss(jax.lax.dot_general, x, w), argnums=(0, 1))(x, w)
    for a, b in zip(g8, g, strict=True):
        assert a.shape == b.shape and fp8.rel_error(a, b) < 0.2
    jitted = jax.jit(jax.grad(lambda x, w: loss(fp8.fp8_dot_general, x, w)))(x, w)
    assert not bool(jnp.isnan(jitted).any())


def test_qdq_dot_general_is_the_plain_dot_of_rounded_operands() -> None:
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((8, 32)), jnp.float32)  # (batch, in)
    w = jnp.asarray(rng.standard_normal((32, 4)), jnp.float32)  # (in, out)
    seen: list[str] = []
    dg = fp8.make_qdq_dot_general(observer=lambda kind, _: seen.append(kind))
    out, (gx, gw) = jax.value_and_grad(lambda x, w: dg(x, w, DIMS).sum(), argnums=(0, 1))(x, w)
    rounded = fp8.qdq(x) @ fp8.qdq(w)  # the same current-scaled e4m3 rounding, then a dot
    assert float(jnp.abs(out - rounded.sum())) < 1e-3 * float(jnp.abs(rounded).sum())
    g = fp8.qdq(jnp.ones((8, 4)), dtype=fp8.E5M2)  # the incoming gradient, rounded to e5m2
    assert fp8.rel_error(gx, g @ fp8.qdq(w).T) < 1e-6 and fp8.rel_error(gw, fp8.qdq(x).T @ g) < 1e-6
    assert seen == ["lhs", "rhs", "grad"] and gx.dtype == x.dtype


def test_fp8_dot_general_zero_input_and_recorder() -> None:
    recorder = fp8.AmaxRecorder()
    dg = recorder.dot_general()
    x, w = jnp.zeros((2, 3)), jnp.ones((3, 2))
    out, grad = jax.value_and_grad(lambda x: dg(x, w, DIMS).sum())(x)
    assert float(out) == 0.0 and not bool(jnp.isnan(grad).any())
    assert [k for k, _ in recorder.seen] == ["lhs", "rhs", "grad"]
    with pytest.raises(ValueError, match="float8"):
        fp8.make_fp8_dot_general(fwd_dtype=jnp.int8)
