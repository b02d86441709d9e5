"""labkit.export.iree: sharding stripped for IREE, compile and run, clear errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from labkit.export import iree


def f(params: dict, x: jax.Array) -> jax.Array:
    """A tiny model: (b, t, 4) -> (b,)."""
    return jnp.tanh(x @ params["w"]).sum(axis=(1, 2)) + params["b"].sum()


PARAMS = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "b": np.ones(3, np.float32)}
X = np.arange(32, dtype=np.float32).reshape(2, 4, 4) / 10  # (b, t, 4)


SHARDED = """module @jit_f attributes {mhlo.num_partitions = 1 : i32} {
  sdy.mesh @mesh = <["d"=1]>
  func.func public @main(%arg0: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"d"}]>}) -> (tensor<4xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{}]>}) {
    %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""  # noqa: E501


def test_strip_sharding() -> None:
    text = iree.strip_sharding(SHARDED)
    assert "sdy" not in text and '{jax.result_info = "result"}' in text
    assert "%arg0: tensor<4xf32>)" in text
    with pytest.raises(ValueError, match="export the function without"):
        iree.strip_sharding(SHARDED.replace("stablehlo.add %arg0", "sdy.sharding_constraint %arg0"))


def test_iree_missing_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(iree, "iree_available", lambda: False)
    with pytest.raises(iree.IreeUnavailable, match="pip install iree-base-compiler"):
        iree.iree_compile("module {}")


@pytest.mark.skipif(
    not iree.iree_available(),
    reason="IREE not installed: pip install iree-base-compiler iree-base-runtime",
)
def test_iree_compiles_and_runs_the_export() -> None:
    exp = jax.export.export(jax.jit(f), platforms=("cpu",))(PARAMS, X)
    vmfb = iree.iree_compile(exp.mlir_module())
    (out,) = iree.iree_run(vmfb, *iree.iree_inputs(exp, PARAMS, X))
    np.testing.assert_allclose(out, f(PARAMS, X), rtol=1e-5)
    stripped = iree.iree_compile(iree.strip_sharding(SHARDED))
    assert iree.iree_run(stripped, np.ones(4, np.float32))[0].tolist() == [2.0] * 4


@pytest.mark.skipif(not iree.iree_available(), reason="IREE not installed")
def test_iree_errors_are_explained() -> None:
    with pytest.raises(iree.IreeCompileError, match=r"Dialect `sdy' not found.*strip_sharding"):
        iree.iree_compile(SHARDED)


def test_a_long_iree_error_is_cut_at_a_word() -> None:
    words = " ".join(f"word{i}" for i in range(60))  # ~400 characters
    advice = iree._iree_advice(f"in.mlir:1:1: error: {words}")
    shown = advice.split("this module: ", 1)[1].split(" What to do:", 1)[0]
    assert shown.endswith(" ...") and len(shown) <= 160
    assert all(w in words.split() for w in shown.removesuffix(" ...").split())  # whole words
