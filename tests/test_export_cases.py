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
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    with pytest.raises(ValueError, match=match):
        export.from_tf(lambda x: x, platforms=platforms)  # checked before TensorFlow loads
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


# ---------------------------------------------------------------------------------------
# Keras 3 on the JAX backend: subclassed, dict inputs, bounded sizes


@pytest.fixture(scope="module")
def keras() -> Any:
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "jax":
        pytest.skip("Keras started on another backend in this process")
    return keras


def test_keras_subclassed_model_needs_and_takes_an_input_signature(keras: Any) -> None:
    class Scorer(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = keras.layers.Dense(8, activation="relu")
            self.norm = keras.layers.BatchNormalization()
            self.drop = keras.layers.Dropout(0.5)
            self.out = keras.layers.Dense(2)

        def call(self, x: Any) -> Any:
            return self.out(self.drop(self.norm(self.hidden(x))))

    model = Scorer()
    x = np.random.default_rng(3).normal(size=(6, 4)).astype(np.float32)
    with pytest.raises(export.UnsupportedModelError, match="no weights yet"):
        export.from_tf(model)
    model(x, training=True)
    with pytest.raises(export.UnsupportedModelError, match=r"input_signature=\[keras\.Input"):
        export.from_tf(model)
    with pytest.raises(TypeError, match=r"do not fit Scorer\.call\(x\)"):
        export.from_tf(model, input_signature=[keras.Input((4,)), keras.Input((4,))])
    exp = export.from_tf(
        model, input_signature=[keras.Input((4,))], dynamic={"x": ("b, 4", ["b <= 16"])}
    )
    assert export.symbol_bounds(exp) == {"b": (1.0, 16.0)}
    assert export.max_rel_error(exp.call(x), model(x, training=False)) < 1e-6


def test_keras_dict_inputs_are_passed_by_name(keras: Any, tmp_path: Path) -> None:
    keras.utils.set_random_seed(4)
    a, b = keras.Input((3,), name="a"), keras.Input((3,), name="b")  # same shape: swappable
    h = keras.layers.Concatenate()([keras.layers.Dense(4)(b), a])
    h = keras.layers.Dropout(0.2)(keras.layers.BatchNormalization()(h))
    model = keras.Model(inputs={"b": b, "a": a}, outputs=keras.layers.Dense(2)(h))
    rng = np.random.default_rng(4)
    xa, xb = (rng.normal(size=(5, 3)).astype(np.float32) for _ in range(2))
    model({"a": xa, "b": xb}, training=True)  # BatchNorm statistics move
    exp = export.from_tf(model)
    reference = model({"a": xa, "b": xb}, training=False)
    assert export.max_rel_error(exp.call({"b": xb, "a": xa}), reference) < 1e-6
    assert export.max_rel_error(exp.call({"a": xa, "b": xb}), reference) < 1e-6
    meta = json.loads(export.sidecar_path(export.save(exp, tmp_path / "d.jaxexport")).read_text())
    assert [i["name"] for i in meta["inputs"]] == ["a", "b"]
    assert meta["in_tree"] == "PyTreeDef((({'a': *, 'b': *},), {}))"


def test_keras_bounded_sequence_length(keras: Any) -> None:
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    positions = keras.layers.Lambda(lambda t: keras.ops.arange(keras.ops.shape(t)[1])[None])(tokens)
    h = keras.layers.Embedding(11, 8)(tokens) + keras.layers.Embedding(16, 8)(positions)
    model = keras.Model(tokens, keras.layers.Dense(11)(h))  # learned positions: t <= 16
    exp = export.from_tf(model, dynamic={"tokens": ("b, t", ["t <= 16"])})
    assert export.symbol_bounds(exp) == {"b": (1.0, float("inf")), "t": (1.0, 16.0)}
    ids = np.random.default_rng(5).integers(0, 11, (2, 9)).astype(np.int32)
    assert export.max_rel_error(exp.call(ids), model(ids)) < 1e-6
    with pytest.raises(export.InputShapeError, match=r"input tokens .* t = 17 is outside"):
        export.call(exp, np.zeros((2, 17), np.int32))
    with pytest.raises(ValueError, match=r"Keras fixes axis 1 of x to 4"):
        fixed = keras.Sequential([keras.Input((4,), name="x"), keras.layers.Dense(2)])
        export.from_tf(fixed, dynamic={"x": "b, n"})


def test_keras_state_change_at_inference_is_refused(keras: Any) -> None:
    class Counter(keras.layers.Layer):
        def build(self, shape: Any) -> None:
            self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False)

        def call(self, x: Any) -> Any:
            self.calls.assign(self.calls + 1.0)  # state that changes even at inference
            return x

    model = keras.Sequential([keras.Input((3,)), Counter(), keras.layers.Dense(2)])
    with pytest.raises(
        export.TrainingModeError, match=r"Sequential changed its own state .*counter/"
    ):
        export.from_tf(model)


# ---------------------------------------------------------------------------------------
# TensorFlow: messages; Keras on the TensorFlow backend (a subprocess)


@pytest.fixture(scope="module")
def tf() -> Any:
    """TensorFlow, imported only by the tests that need it (several seconds)."""
    return pytest.importorskip("tensorflow")


def test_tf_messages(tf: Any) -> None:
    with pytest.raises(export.UnsupportedModelError, match=r"<lambda> is not a tf\.function"):
        export.from_tf(lambda x: x * 2)
    exp = export.from_tf(lambda x: x * 2, input_signature=[tf.TensorSpec([2], tf.float32)])
    np.testing.assert_allclose(exp.call(np.ones(2, np.float32)), [2.0, 2.0])
    serve = tf.function(lambda x: x * 2, input_signature=[tf.TensorSpec([2], tf.float32)])
    with pytest.raises(export.UnsupportedModelError, match="Keras 3 on the JAX backend"):
        export.from_tf(serve, dynamic={"x": ("b", ["b <= 4"])})
    f64 = tf.function(lambda x: x * 2, input_signature=[tf.TensorSpec([2], tf.float64)])
    with pytest.raises(export.DtypeError, match="float64"):
        export.from_tf(f64)


KERAS_ON_TF = """
import json, sys, numpy as np, keras, tensorflow as tf
from labkit import export
keras.utils.set_random_seed(6)
a, b = keras.Input((3,), name="a"), keras.Input((3,), name="b")
h = keras.layers.Concatenate()([keras.layers.Dense(4)(b), a])
h = keras.layers.Dropout(0.2)(keras.layers.BatchNormalization()(h))
model = keras.Model(inputs={"b": b, "a": a}, outputs=keras.layers.Dense(2)(h))
rng = np.random.default_rng(6)
xa, xb = (rng.normal(size=(4, 3)).astype(np.float32) for _ in range(2))
model({"a": xa, "b": xb}, training=True)
spec = {"a": tf.TensorSpec([4, 3], tf.float32), "b": tf.TensorSpec([4, 3], tf.float32)}
exp = export.from_tf(model, input_signature=[spec])
reference = model({"a": xa, "b": xb}, training=False).numpy()
class Sub(keras.Model):
    def __init__(self):
        super().__init__()
        self.d, self.bn = keras.layers.Dense(2), keras.layers.BatchNormalization()
    def call(self, x):
        return self.bn(self.d(x))
sub = Sub()
sub(xa, training=True)
try:
    export.from_tf(sub)
    refused = ""
except export.UnsupportedModelError as err:
    refused = str(err)
sub_exp = export.from_tf(sub, input_signature=[tf.TensorSpec([4, 3], tf.float32)])
print(json.dumps({
    "dict": export.max_rel_error(exp.call({"b": xb, "a": xa}), reference),
    "sub": export.max_rel_error(sub_exp.call(xa), sub(xa, training=False).numpy()),
    "refused": refused,
}))
"""


def test_keras_on_the_tensorflow_backend(tf: Any) -> None:
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "JAX_PLATFORMS": "cpu"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run(
        [sys.executable, "-c", KERAS_ON_TF],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["dict"] < 1e-6 and report["sub"] < 1e-6
    assert "input_signature" in report["refused"]


# ---------------------------------------------------------------------------------------
# PyTorch


def test_from_torch_without_torch_names_the_environment() -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("this Python has torch")
    with pytest.raises(ModuleNotFoundError, match=r"\.venv-torch.*make setup-torch"):
        export.from_torch(object(), ())


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch")


@pytest.mark.torch
def test_torch_float64_refused_or_kept_with_x64(torch: Any) -> None:
    class Cancel(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return (x + 1e8) - 1e8

    class Widens(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return ((x.double() + 1e8) - 1e8).float()  # float64 inside only

    x = torch.rand(5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(export.DtypeError, match=r"input x \(float64\).*model\.float\(\)"):
        export.from_torch(Cancel().eval(), (x,))
    with pytest.raises(export.DtypeError, match=rf"value \w+ at {__file__}:\d+ in forward"):
        export.from_torch(Widens().eval(), (x.float(),))
    with jax.enable_x64(True):
        exp = export.from_torch(Cancel().eval(), (x,))
    assert exp.in_avals[0].dtype == np.float64
    assert np.abs(np.asarray(export.call(exp, x.numpy())) - x.numpy()).max() < 1e-7


class LearnedPositions:
    """A token model with a learned position table of 64 rows, sliced to the length."""

    @staticmethod
    def make(torch: Any) -> Any:
        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.tokens = torch.nn.Embedding(10, 8)
                self.positions = torch.nn.Parameter(torch.randn(64, 8))

            def forward(self, ids: Any) -> Any:
                return self.tokens(ids) + self.positions[: ids.shape[1]]  # (b, t, 8)

        torch.manual_seed(0)
        return Model().eval()


@pytest.mark.torch
def test_torch_bound_from_its_own_suggestion(torch: Any) -> None:
    model = LearnedPositions.make(torch)
    ids = torch.randint(0, 10, (2, 12), generator=torch.Generator().manual_seed(1))
    with pytest.raises(
        export.UnsupportedModelError,
        match=r"(?s)suggests t = Dim\('t', max=64\).*dynamic=\{'ids': \('b, t', \['t <= 64'\]\)\}",
    ):
        export.from_torch(model, (ids,), dynamic={"ids": "b, t"})
    exp = export.from_torch(model, (ids,), dynamic={"ids": ("b, t", ["t <= 64"])})
    assert export.symbol_bounds(exp)["t"] == (1.0, 64.0)
    longer = torch.randint(0, 10, (3, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = model(longer).numpy()
    assert export.max_rel_error(export.call(exp, longer.numpy()), reference) < 1e-6
    with pytest.raises(export.InputShapeError, match=r"t = 65 is outside .* t <= 64"):
        export.call(exp, np.zeros((2, 65), np.int64))


class TwoLayers:
    @staticmethod
    def make(torch: Any) -> Any:
        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)
                self.drop = torch.nn.Dropout(0.5)

            def forward(self, x: Any) -> Any:
                return self.drop(self.lin(x))

        return Model().eval()


@pytest.mark.torch
def test_torch_submodule_in_training_mode_is_named(torch: Any) -> None:
    model = TwoLayers.make(torch)
    model.drop.train()  # left in training mode under an eval() model
    with pytest.raises(export.TrainingModeError, match=r"eval mode but .*: drop \(Dropout\)"):
        export.from_torch(model, (torch.ones(2, 4),))


@pytest.mark.torch
def test_torch_messages(torch: Any, capfd: pytest.CaptureFixture[str]) -> None:
    model = TwoLayers.make(torch)
    with pytest.raises(
        export.UnsupportedModelError, match=r"(?s)same reduction dim.*inputs were x \[2, 5\]"
    ):
        export.from_torch(model, (torch.ones(2, 5),))  # a wrong input shape
    assert "fake_tensor.py" not in capfd.readouterr().err  # torch's log lines stay quiet
    with pytest.raises(TypeError, match=r"do not fit Model\.forward\(x\)"):
        export.from_torch(model, (torch.ones(2, 4), torch.ones(2, 4)))
    with pytest.raises(ValueError, match="did you mean 'tpu'"):
        export.from_torch(model, (torch.ones(2, 4),), platforms=["tpuu"])

    class Add(torch.nn.Module):
        def forward(self, x: Any, y: Any) -> Any:
            return x + y

    pair = (torch.ones(3, 4), torch.ones(3, 4))
    with pytest.raises(export.UnsupportedModelError, match="use the symbol b for both"):
        export.from_torch(Add().eval(), pair, dynamic={"x": "b, 4", "y": "c, 4"})

    class TakesDict(torch.nn.Module):
        def forward(self, batch: dict) -> Any:
            return batch["x"] * 2

    with pytest.raises(export.UnsupportedModelError, match="'batch' is a dict holding tensors"):
        export.from_torch(TakesDict().eval(), ({"x": torch.ones(2)},))


@pytest.mark.torch
def test_torch_causal_sdpa_exports(torch: Any) -> None:
    class Attention(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = torch.randn(3, 2, 4, 8, 16, generator=torch.Generator().manual_seed(3))
    spec = "b, 4, t, 16"
    exp = export.from_torch(Attention().eval(), (q, k, v), dynamic=dict.fromkeys("qkv", spec))
    with torch.no_grad():
        reference = Attention()(q[:1, :, :5], k[:1, :, :5], v[:1, :, :5]).numpy()
    out = exp.call(q[:1, :, :5].numpy(), k[:1, :, :5].numpy(), v[:1, :, :5].numpy())
    assert export.max_rel_error(out, reference) < 1e-5
