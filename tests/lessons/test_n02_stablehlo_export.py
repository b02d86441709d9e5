"""labkit.lessons.n02_stablehlo_export: the GPT as a pure function, int8, each checker."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from labkit.gpt.config import GPTConfig
from labkit.gpt.train import create_model
from labkit.lessons import n02_stablehlo_export as lesson
from labkit.xla.gemms import gemms

TWO_DOTS = """module @m {
  func.func public @main(%arg0: tensor<2x2xf32>) -> tensor<2x2xf32> {
    %0 = stablehlo.dot_general %arg0, %arg0, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %1 = stablehlo.dot_general %0, %0, contracting_dims = [1] x [0] : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    return %1 : tensor<2x2xf32>
  }
}
"""  # noqa: E501


@pytest.fixture(scope="module")
def model() -> object:
    return create_model(GPTConfig.preset("tiny"))


def test_pure_forward_matches_the_model(model: object) -> None:
    forward, params = lesson.pure_forward(model)  # type: ignore[arg-type]
    assert all(isinstance(k, str) for k in params["blocks"])  # export needs string keys
    tokens = lesson.tokens_of("abc", 2, 8)
    assert tokens.shape == (2, 8) and tokens.dtype == np.int32
    out = jax.jit(forward)(params, tokens)
    assert lesson.max_rel_error(out, model(tokens)) < 1e-5  # type: ignore[operator]


def test_train_briefly_lowers_the_loss() -> None:
    _, losses = lesson.train_briefly(GPTConfig.preset("tiny"), steps=6, batch_size=4)
    assert losses.shape == (6,) and losses[-1] < losses[0]


def test_quantize_and_int8_linear() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8)).astype(np.float32) * np.linspace(0.01, 1, 8, dtype=np.float32)
    qw = lesson.quantize_weight(w)
    assert qw.q.dtype == np.int8 and qw.scale.shape == (8,) and np.abs(qw.q).max() == 127
    assert lesson.quantize_weight(w, per_channel=False).scale.shape == (1,)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    per_channel, per_tensor = lesson.int8_error(x, w), lesson.int8_error(x, w, per_channel=False)
    assert per_channel < 0.02 and per_tensor > per_channel
    text = jax.jit(lesson.int8_linear).lower(x, qw.q, qw.scale).as_text()
    assert "tensor<16x8xi8>) -> tensor<32x8xi32>" in text


def test_the_exported_int8_layer_has_the_error_int8_error_reports() -> None:
    # The notebook measures the exported layer; int8_error (its exercise's checker) must agree.
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    qw = lesson.quantize_weight(w)
    exported = jax.export.export(jax.jit(lesson.int8_linear), platforms=("cpu",))(x, qw.q, qw.scale)
    out = exported.call(x, qw.q, qw.scale)  # (32, 8)
    assert abs(lesson.max_rel_error(out, x @ w) - lesson.int8_error(x, w)) < 1e-6


def test_int8_linear_h100_is_an_s8_gemm() -> None:
    result = lesson.int8_linear_h100(64, 32, 64, xla_gpu_enable_triton_gemm=False)
    (gemm,) = gemms(result.hlo)
    assert (gemm.kernel, gemm.lhs, gemm.rhs, gemm.out) == ("cublas", "s8", "s8", "s32")


def test_dot_count_checker() -> None:
    assert lesson.check_dot_count(2, TWO_DOTS).passed
    wrong = lesson.check_dot_count(3, TWO_DOTS)
    assert not wrong.passed and wrong.attempted and "op_histogram" in wrong.message
    assert not lesson.check_dot_count("two", TWO_DOTS).passed
    assert not lesson.check_dot_count(..., TWO_DOTS).attempted


def test_token_spec_checker() -> None:
    assert lesson.check_token_spec(("b, t", ("t <= 32",))).passed
    assert lesson.check_token_spec(("batch, seq", ["seq <= 32"])).passed
    free = lesson.check_token_spec("b, t")
    assert not free.passed and free.attempted and "t <= ..." in free.message
    assert not lesson.check_token_spec(("b, t", ("t <= 64",))).passed
    assert not lesson.check_token_spec(("b, t", ("b <= 8", "t <= 32"))).passed  # batch bound
    assert "two symbols" in lesson.check_token_spec("b").message
    assert "rejects" in lesson.check_token_spec(("b, t", ("t <== 3",))).message
    assert not lesson.check_token_spec(None).attempted


def test_per_tensor_error_checker() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    w = rng.standard_normal((4, 6)).astype(np.float32) * np.arange(1, 7, dtype=np.float32)
    right = lesson.int8_error(x, w, per_channel=False)
    assert lesson.check_per_tensor_error(right, x, w).passed
    wrong = lesson.check_per_tensor_error(lesson.int8_error(x, w) * 0.1, x, w)
    assert not wrong.passed and wrong.attempted and "per channel" in wrong.message
    assert not lesson.check_per_tensor_error(..., x, w).attempted
    assert jnp.asarray(right).dtype == jnp.float32 or isinstance(right, float)
