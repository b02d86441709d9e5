"""labkit.export on the model shapes people write, and on what used to go silently wrong.

Each case is a model written here (no downloads): dtypes that would change (float64 with x64
off), platform names, bounded symbolic dimensions in all three front ends, ``dynamic`` on
pytree leaves, Keras subclassed and dict-input models, NNX modules that take their mode at
call time, PyTorch submodules left in training mode, and the messages for the usual mistakes.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

os.environ.setdefault("KERAS_BACKEND", "jax")  # before anything imports tensorflow or keras

from labkit import export


def cancel(x: jax.Array) -> jax.Array:
    """``(x + 1e8) - 1e8``: exact in float64, off by up to 4 in float32 (x in [0, 1))."""
    return (x + 1e8) - 1e8


# ---------------------------------------------------------------------------------------
# Dtypes: nothing changes silently


def test_float64_is_refused_with_both_fixes() -> None:
    x = np.random.default_rng(0).random(5)  # float64, as numpy makes it
    with pytest.raises(export.DtypeError, match=r"x \(float64\).*astype\(np\.float32\).*x64"):
        export.from_jax(cancel, x)
    exp = export.from_jax(cancel, x.astype(np.float32))  # the cast, on purpose
    assert exp.in_avals[0].dtype == np.float32


def test_float64_weights_of_a_module_are_refused() -> None:
    class Scale(nnx.Module):
        def __init__(self) -> None:
            self.w = nnx.Param(np.linspace(0, 1, 3))  # a numpy float64 weight

        def __call__(self, x: jax.Array) -> jax.Array:
            return x * self.w[...]

    with pytest.raises(export.DtypeError, match=r"weight w \(float64\)"):
        export.from_jax(Scale(), np.ones(3, np.float32))


def test_float64_exported_with_x64_keeps_its_precision(tmp_path: Path) -> None:
    x = np.random.default_rng(1).random(5)
    with jax.enable_x64(True):
        exp = export.from_jax(cancel, x)
    assert exp.in_avals[0].dtype == np.float64 and export.needs_x64(exp)
    path = export.save(exp, tmp_path / "f64.jaxexport")
    assert json.loads(export.sidecar_path(path).read_text())["x64"] is True
    art = export.load(path)
    assert np.abs(np.asarray(art.call(x)) - x).max() < 1e-7  # labkit.call turns x64 on
    with pytest.raises(export.InputShapeError, match="exported with x64 on"):
        export.check_inputs(art, x)  # x64 is off out here: a plain call would fail
    fresh = export.run_in_fresh_process(path, x)
    assert fresh.outputs[0].dtype == np.float64 and np.abs(fresh.outputs[0] - x).max() < 1e-7
    f32 = export.from_jax(cancel, x.astype(np.float32)).call(x.astype(np.float32))
    assert np.abs(np.asarray(f32) - x).max() > 0.1  # what the silent float32 export computed


def test_int64_to_int32_is_recorded_in_the_sidecar(tmp_path: Path) -> None:
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    exp = export.from_jax(lambda tokens: tokens * 2, ids)
    meta = json.loads(export.sidecar_path(export.save(exp, tmp_path / "i.jaxexport")).read_text())
    assert meta["dtype_changes"] == ["tokens: int64 -> int32"] and meta["x64"] is False
    assert meta["in_tree"] == "PyTreeDef(((*,), {}))"


# ---------------------------------------------------------------------------------------
# Platforms are checked at export


@pytest.mark.parametrize(
    ("platforms", "match"),
    [
        (["tpuu"], r"unknown platform 'tpuu' \(did you mean 'tpu'\?\)"),
        (["CPU"], r"did you mean 'cpu'"),
        (["gpu"], r"'cuda' \(NVIDIA\) or 'rocm' \(AMD\)"),
        (["cpu", "cpu"], "twice"),
        ([], "empty"),
    ],
)
def test_platform_names_are_checked_at_export(platforms: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        export.from_jax(jnp.tanh, np.ones(2, np.float32), platforms=platforms)
    assert export.from_jax(jnp.tanh, np.ones(2, np.float32), platforms="cpu").platforms == ("cpu",)


# ---------------------------------------------------------------------------------------
# dynamic: leaves of a pytree by path, bounds


def scaled(params: dict, x: jax.Array) -> jax.Array:
    return x * params["scale"]


def test_dynamic_names_pytree_leaves_by_path() -> None:
    params, x = {"scale": np.ones(3, np.float32)}, np.arange(3, dtype=np.float32)
    for key in ("params/scale", "params['scale']"):
        exp = export.from_jax(scaled, params, x, dynamic={key: ("n", ["n <= 8"]), "x": "n"})
        assert [str(a.shape[0]) for a in exp.in_avals] == ["n", "n"]
        assert export.symbol_bounds(exp) == {"n": (1.0, 8.0)}
    five = np.arange(5, dtype=np.float32)
    np.testing.assert_allclose(export.call(exp, {"scale": five}, five), five * five)
    with pytest.raises(export.InputShapeError, match=r"n = 9 is outside .* n <= 8"):
        export.call(exp, {"scale": np.ones(9, np.float32)}, np.ones(9, np.float32))
    with pytest.raises(ValueError, match=r"'a', which is not an array input.*\['params/scale'"):
        export.from_jax(scaled, params, x, dynamic={"a": "n"})
    with pytest.raises(ValueError, match=r"'params', which holds several arrays.*params/scale"):
        export.from_jax(scaled, params, x, dynamic={"params": "n"})


# ---------------------------------------------------------------------------------------
# Flax NNX: the mode passed at call time


class CallTimeMode(nnx.Module):
    """BatchNorm and Dropout whose mode is an argument of __call__, as many models write it."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.lin = nnx.Linear(4, 8, rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.head = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        h = self.bn(self.lin(x), use_running_average=not train)  # (b, 8)
        return self.head(self.drop(h, deterministic=not train))  # (b, 2)


def test_nnx_mode_at_call_time_is_named_and_works_when_passed() -> None:
    model = CallTimeMode(nnx.Rngs(0))
    x = np.random.default_rng(2).normal(size=(6, 4)).astype(np.float32)
    model(jnp.asarray(x))  # a training step moves the statistics
    model.eval()
    mean = np.asarray(model.bn.mean[...])
    with pytest.raises(
        export.TrainingModeError, match=r"bn\.mean \(BatchStat\).*RngCount.*pass train=False"
    ):
        export.from_jax(model, x)  # train=True by default: eval() cannot override it
    exp = export.from_jax(model, x[:2], train=False, dynamic={"x": "b, 4"})
    assert export.max_rel_error(exp.call(x), model(jnp.asarray(x), train=False)) < 1e-6
    np.testing.assert_array_equal(model.bn.mean[...], mean)  # the export left the model alone
    assert "allow_training" not in inspect.signature(export.from_jax).parameters  # removed


# ---------------------------------------------------------------------------------------
# Messages


def test_too_many_arguments_show_the_signature() -> None:
    x = np.ones(3, np.float32)
    with pytest.raises(TypeError, match=r"do not fit scaled\(params, x\): too many"):
        export.from_jax(scaled, {"scale": x}, x, x)


def test_numpy_on_a_tracer_points_at_the_users_function() -> None:
    def uses_numpy(x: jax.Array) -> jax.Array:
        return jnp.asarray(np.sin(np.asarray(x)))

    with pytest.raises(jax.errors.TracerArrayConversionError) as caught:
        export.from_jax(uses_numpy, np.ones(3, np.float32))
    assert f"uses_numpy at {__file__}" in str(caught.value)
    assert "labkit/export" not in str(caught.value)


def test_the_digest_detects_corruption_not_origin(tmp_path: Path) -> None:
    x = np.ones(3, np.float32)
    mine = export.save(export.from_jax(jnp.sin, x), tmp_path / "mine.jaxexport")
    other = export.save(export.from_jax(jnp.cos, x), tmp_path / "other.jaxexport")
    shutil.copy(other, mine)  # someone swaps the artifact and its sidecar together
    shutil.copy(export.sidecar_path(other), export.sidecar_path(mine))
    np.testing.assert_allclose(export.load(mine).call(x), np.cos(x), rtol=1e-6)  # it loads
    assert "not a forged one" in (export.load.__doc__ or "")
    assert "sign it" in (export.artifact.__doc__ or "")
