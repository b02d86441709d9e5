"""labkit.export on models the kit did not write: JAX (NNX), PyTorch (transformers), TensorFlow.

Every model here is written in this file (or built by a library from a config with random
weights: nothing is downloaded). Each is exported, saved, reloaded by plain
``jax.export.deserialize`` in a fresh Python that imports only jax and numpy, and checked
against its own framework.
"""

from __future__ import annotations

import json
import os
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

# ---------------------------------------------------------------------------------------
# A small function and the artifact format


def f(params: dict, x: jax.Array) -> jax.Array:
    """A tiny model: (b, t, 4) -> (b,)."""
    return jnp.tanh(x @ params["0"]["w"]).sum(axis=(1, 2)) + params["0"]["b"].sum()


PARAMS = {
    "0": {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "b": np.ones(3, np.float32)}
}


def _symbolic() -> jax.export.Exported:
    x = np.zeros((2, 4, 4), np.float32)
    return export.from_jax(f, PARAMS, x, dynamic={"x": ("b, t, _", ["t <= 4"])})


def _x(batch: int = 2, t: int = 4) -> np.ndarray:
    return np.arange(batch * t * 4, dtype=np.float32).reshape(batch, t, 4) / 10  # (b, t, 4)


def test_keys_round_trip() -> None:
    tree = {0: {"w": 1}, "a": {1: 2}}
    assert export.string_keys(tree) == {"0": {"w": 1}, "a": {"1": 2}}
    assert export.int_keys(export.string_keys(tree)) == tree


def test_main_signature_and_max_rel_error() -> None:
    text = (
        jax.jit(lambda a, b: (a @ b).sum(0)).lower(jnp.zeros((2, 3)), jnp.zeros((3, 4))).as_text()
    )
    assert export.main_signature(text) == (
        ["tensor<2x3xf32>", "tensor<3x4xf32>"],
        ["tensor<4xf32>"],
    )
    with pytest.raises(ValueError, match=r"func\.func @main"):
        export.main_signature("HloModule m")
    assert export.max_rel_error([1.0, 2.0], [1.0, 2.5]) == pytest.approx(0.2)


def test_save_writes_exactly_the_serialized_bytes_and_a_sidecar(tmp_path: Path) -> None:
    exp = _symbolic()
    path = export.save(exp, tmp_path / "f.jaxexport")
    assert path.read_bytes() == bytes(exp.serialize())  # nothing added
    plain = jax.export.deserialize(bytearray(path.read_bytes()))  # no labkit needed
    np.testing.assert_allclose(plain.call(PARAMS, _x()), f(PARAMS, _x()), rtol=1e-6)
    meta = json.loads(export.sidecar_path(path).read_text())
    assert meta["sha256"] and meta["bytes"] == path.stat().st_size
    assert meta["jax"] == jax.__version__ and meta["jaxlib"] and meta["created"][:2] == "20"
    assert meta["source"] == "jax" and meta["platforms"] == ["cpu"]
    assert [i["name"] for i in meta["inputs"]] == ["params['0']['b']", "params['0']['w']", "x"]
    assert meta["inputs"][-1] == {"name": "x", "shape": "['b', 't', '4']", "dtype": "float32"}
    assert meta["outputs"] == [{"name": "", "shape": "['b']", "dtype": "float32"}]
    assert meta["bounds"] == {"b": [1, float("inf")], "t": [1, 4]}


def test_load_call_and_describe(tmp_path: Path) -> None:
    art = export.load(export.save(_symbolic(), tmp_path / "f.jaxexport", vjp_order=1))
    np.testing.assert_allclose(art.call(PARAMS, _x()), f(PARAMS, _x()), rtol=1e-6)
    info = export.describe(art)
    assert info.platforms == ("cpu",) and info.has_vjp and info.symbols["t"] == (1, 4)
    assert "float32[b,t,4]" in info.inputs and info.outputs == ["float32[b]"]
    assert info.ops["stablehlo.dot_general"] == 1
    assert {r["field"] for r in info.rows()} >= {"platforms", "symbols", "calling convention"}


@pytest.mark.parametrize("damage", ["truncate", "flip", "sidecar", "foreign", "missing"])
def test_damaged_artifacts_raise_clear_errors(tmp_path: Path, damage: str) -> None:
    path = export.save(_symbolic(), tmp_path / "f.jaxexport")
    blob = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(blob[:-3])
        match = "truncated"
    elif damage == "flip":  # the same size: only the digest can tell
        path.write_bytes(blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:])
        match = "corrupted: its SHA-256"
    elif damage == "sidecar":
        export.sidecar_path(path).unlink()
        match = "has no sidecar"
    elif damage == "foreign":
        export.sidecar_path(path).write_text('{"sha256": "x"}')
        match = "not a labkit sidecar"
    else:
        path = tmp_path / "nothing.jaxexport"
        match = "no artifact"
    with pytest.raises(export.ArtifactError, match=match):
        export.load(path)


def test_wrong_arguments_give_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"save takes a jax.export.Exported .* got str: 'hello'"):
        export.save("hello", tmp_path / "x.jaxexport")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"load takes a file path .* got NoneType"):
        export.load(None)  # type: ignore[arg-type]
    with pytest.raises(export.ArtifactError, match="is a folder"):
        export.save(_symbolic(), tmp_path)


def test_wrong_platform_is_explained() -> None:
    exp = export.from_jax(f, PARAMS, _x(), platforms=("cuda",))
    with pytest.raises(export.PlatformMismatch, match=r"exported for \('cuda',\).*re-export"):
        export.call(exp, PARAMS, _x())
    both = export.from_jax(f, PARAMS, _x(), platforms=("cuda", "cpu"))
    assert export.check_platform(both) == "cpu"


def test_checks_agree_with_exported_call() -> None:
    exp = _symbolic()
    with pytest.raises(export.InputShapeError, match=r"t = 5 is outside .* t <= 4"):
        export.call(exp, PARAMS, _x(2, 5))
    with pytest.raises(export.InputShapeError, match="must be 4"):
        export.call(export.from_jax(f, PARAMS, _x()), PARAMS, _x(2, 3))
    with pytest.raises(export.InputShapeError, match="pass a float32 array of rank 3"):
        export.call(exp, PARAMS, _x().astype(np.int32))
    with pytest.raises(export.InputShapeError, match="structured as"):
        export.call(exp, {"w": PARAMS["0"]["w"]}, _x())
    assert export.check_inputs(exp, PARAMS, _x(3)) == {"b": 3, "t": 4}
    ids = export.from_jax(lambda t: t * 2, np.zeros((2, 3), np.int32))
    wide = np.arange(6, dtype=np.int64).reshape(2, 3)  # what a tokenizer gives
    assert export.check_inputs(ids, wide) == {} and ids.call(wide).dtype == jnp.int32


def test_dynamic_specs_are_checked() -> None:
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="rank 2"):
        export.from_jax(jnp.tanh, x, dynamic={"x": "b"})
    with pytest.raises(ValueError, match="not an array input"):
        export.from_jax(jnp.tanh, x, dynamic={"y": "b, _"})
    with pytest.raises(TypeError, match="spec string"):
        export.from_jax(jnp.tanh, x, dynamic={"x": 3})  # type: ignore[dict-item]


# ---------------------------------------------------------------------------------------
# An NNX CNN with BatchNorm and Dropout


class CNN(nnx.Module):
    """Conv, BatchNorm, ReLU, Dropout, global average pool, Linear: (b, 8, 8, 1) -> (b, 3)."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.conv = nnx.Conv(1, 4, kernel_size=(3, 3), rngs=rngs)
        self.norm = nnx.BatchNorm(4, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.head = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        h = self.drop(nnx.relu(self.norm(self.conv(images))))  # (b, 8, 8, 4)
        return self.head(h.mean(axis=(1, 2)))  # (b, 3)


def _cnn_with_statistics() -> tuple[CNN, np.ndarray]:
    model = CNN(nnx.Rngs(0))
    rng = np.random.default_rng(0)
    for _ in range(3):  # training-mode passes move BatchNorm's running statistics
        model(jnp.asarray(rng.standard_normal((4, 8, 8, 1)) * 3 + 1, jnp.float32))
    return model, (rng.standard_normal((5, 8, 8, 1)) * 3 + 1).astype(np.float32)


def test_training_mode_is_refused_with_the_layers_named() -> None:
    model, images = _cnn_with_statistics()
    assert sorted(export.training_layers(model))[0].startswith("drop (Dropout")
    with pytest.raises(export.TrainingModeError, match=r"drop \(Dropout.*norm \(BatchNorm.*eval"):
        export.from_jax(model, images)


def test_cnn_in_eval_mode_round_trips_in_a_fresh_process(tmp_path: Path) -> None:
    model, images = _cnn_with_statistics()
    model.eval()
    exp = export.from_jax(model, images[:2], dynamic={"images": "b, 8, 8, 1"})
    reference = np.asarray(model(jnp.asarray(images)))  # (5, 3), eval mode
    path = export.save(exp, tmp_path / "cnn.jaxexport")
    fresh = export.run_in_fresh_process(path, images)
    assert fresh.imported == [] and export.max_rel_error(fresh.result, reference) < 1e-5
    assert json.loads(export.sidecar_path(path).read_text())["inputs"][0]["name"] == "images"


def test_weights_saved_beside_the_artifact(tmp_path: Path) -> None:
    model, images = _cnn_with_statistics()
    model.eval()
    exp = export.from_jax(model, images[:2], dynamic={"images": "b, 8, 8, 1"}, weights_outside=True)
    learned = jax.tree.leaves(nnx.state(model, nnx.Any(nnx.Param, nnx.BatchStat)))
    assert len(exp.in_avals) == len(learned) + 1  # weights first, then the images
    path = export.save(exp, tmp_path / "cnn.jaxexport")
    meta = json.loads(export.sidecar_path(path).read_text())
    assert meta["weights"]["file"] == "cnn.jaxexport.weights.npz" and meta["inputs"][0][
        "name"
    ].startswith("weights")
    art = export.load(path)
    reference = np.asarray(model(jnp.asarray(images)))
    assert export.max_rel_error(art.call(images), reference) < 1e-5
    fresh = export.run_in_fresh_process(path, images)
    assert export.max_rel_error(fresh.result, reference) < 1e-5
    blob = (tmp_path / meta["weights"]["file"]).read_bytes()
    (tmp_path / meta["weights"]["file"]).write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(export.ArtifactError, match=r"weights\.npz is corrupted"):
        export.load(path)


# ---------------------------------------------------------------------------------------
# A Flax transformer whose forward takes several inputs, one of them by keyword


class Encoder(nnx.Module):
    """Embeddings, masked self-attention, LayerNorm, a head: tokens (b, t) -> logits (b, t, 11)."""

    def __init__(self, rngs: nnx.Rngs, vocab: int = 11, d: int = 16, max_len: int = 12) -> None:
        self.embed = nnx.Embed(vocab, d, rngs=rngs)
        self.pos = nnx.Embed(max_len, d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(2, d, decode=False, rngs=rngs)
        self.norm = nnx.LayerNorm(d, rngs=rngs)
        self.head = nnx.Linear(d, vocab, rngs=rngs)

    def __call__(self, tokens: jax.Array, mask: jax.Array, *, positions: jax.Array) -> jax.Array:
        h = self.embed(tokens) + self.pos(positions)  # (b, t, d)
        pair = mask[:, None, :, None] & mask[:, None, None, :]  # (b, 1, t, t)
        return self.head(self.norm(h + self.attn(h, mask=pair)))  # (b, t, vocab)


def test_multi_input_transformer_with_dynamic_batch_and_length(tmp_path: Path) -> None:
    model = Encoder(nnx.Rngs(1))
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 11, (3, 7)).astype(np.int32)
    mask = np.ones((3, 7), bool)
    mask[0, 5:] = False
    positions = np.broadcast_to(np.arange(7, dtype=np.int32), (3, 7)).copy()
    exp = export.from_jax(
        model,
        tokens,
        mask,
        positions=positions,
        dynamic={"tokens": "b, t", "mask": "b, t", "positions": ("b, t", ["t <= 12"])},
    )
    assert [str(d) for d in exp.in_avals[0].shape] == ["b", "t"] and exp.in_avals[1].dtype == bool
    path = export.save(exp, tmp_path / "encoder.jaxexport")
    small = (tokens[:2, :4], mask[:2, :4])
    fresh = export.run_in_fresh_process(path, *small, positions=positions[:2, :4])
    reference = np.asarray(model(*small, positions=positions[:2, :4]))
    assert export.max_rel_error(fresh.result, reference) < 1e-5
    long = np.zeros((3, 13), np.int32)
    with pytest.raises(export.InputShapeError, match=r"t = 13 is outside .* t <= 12"):
        export.call(export.load(path), long, long > 0, positions=long)


# ---------------------------------------------------------------------------------------
# TensorFlow and Keras


@pytest.fixture(scope="module")
def tf() -> Any:
    """TensorFlow, imported only by the tests that need it (several seconds)."""
    return pytest.importorskip("tensorflow")


KERAS_MODEL = """
import sys, numpy as np, keras
keras.utils.set_random_seed(2)
layers = keras.layers
model = keras.Sequential([keras.Input((16,)), layers.Dense(32, activation="gelu"),
                          layers.BatchNormalization(), layers.Dropout(0.3), layers.Dense(4)])
model.compile(optimizer="sgd", loss="mse")
rng = np.random.default_rng(2)
x = rng.standard_normal((32, 16)).astype(np.float32)
model.fit(x, np.zeros((32, 4), np.float32), epochs=1, batch_size=8, verbose=0)  # stats move
model.export(sys.argv[1], format="tf_saved_model", verbose=False)
probe = rng.standard_normal((4, 16)).astype(np.float32)
np.savez(sys.argv[2], x=probe, y=np.asarray(model(probe, training=False)))
if keras.backend.backend() == "jax":
    model.save(sys.argv[3])
"""


def _keras_model_export(tmp_path: Path, backend: str) -> tuple[Path, np.ndarray, np.ndarray]:
    """``model.export()`` of a Keras model (BatchNorm, Dropout), made by Keras on ``backend``."""
    saved, probe = tmp_path / f"saved_{backend}", tmp_path / f"probe_{backend}.npz"
    env = {**os.environ, "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-c", KERAS_MODEL, str(saved), str(probe), str(tmp_path / "m.keras")]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=300)
    with np.load(probe) as z:
        return saved, z["x"], z["y"]


def test_keras_model_export_round_trips(tf: Any, tmp_path: Path) -> None:
    saved, x, reference = _keras_model_export(tmp_path, "tensorflow")
    with pytest.raises(export.UnsupportedModelError, match=r"None dimension.*Keras 3 on the JAX"):
        export.from_tf(saved)
    exp = export.from_tf(saved, input_signature=[tf.TensorSpec([4, 16], tf.float32)])
    path = export.save(exp, tmp_path / "keras.jaxexport")
    fresh = export.run_in_fresh_process(path, x)
    assert fresh.imported == [] and export.max_rel_error(fresh.result, reference) < 1e-5
    assert json.loads(export.sidecar_path(path).read_text())["source"].startswith("tensorflow")


def test_keras_model_on_jax_keeps_a_symbolic_batch(tf: Any, tmp_path: Path) -> None:
    import keras

    if keras.backend.backend() != "jax":
        pytest.skip("Keras started on another backend in this process")
    saved, x, reference = _keras_model_export(tmp_path, "jax")
    spec = [tf.TensorSpec([4, 16], tf.float32)]
    with pytest.raises(export.UnsupportedModelError, match="newer than this TensorFlow reads"):
        export.from_tf(saved, input_signature=spec)  # jax2tf's StableHLO is too new for TF
    model = keras.models.load_model(tmp_path / "m.keras")
    exp = export.from_tf(model)
    assert str(exp.in_avals[0].shape[0]) == "b"
    fresh = export.run_in_fresh_process(export.save(exp, tmp_path / "k.jaxexport"), x[:3])
    assert export.max_rel_error(fresh.result, reference[:3]) < 1e-5


def test_tf_function_static_export(tf: Any) -> None:
    w = tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))

    @tf.function(input_signature=[tf.TensorSpec([2, 4], tf.float32)])
    def serve(x: Any) -> Any:
        return tf.nn.relu(x @ w)

    exp = export.from_tf(serve)
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    assert export.max_rel_error(exp.call(x), serve(x).numpy()) < 1e-6
    dynamic = tf.function(serve.python_function, input_signature=[tf.TensorSpec([None, 4])])
    with pytest.raises(export.UnsupportedModelError, match="input_signature with every size"):
        export.from_tf(dynamic)


# ---------------------------------------------------------------------------------------
# PyTorch: a transformers decoder built from a config (random weights, nothing downloaded)


@pytest.fixture(scope="module")
def llama() -> Any:
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        attn_implementation="eager",
    )
    import torch

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _ids_and_mask(batch: int, seq: int, seed: int = 0) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 96, (batch, seq), generator=g, dtype=torch.int64)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, : seq // 3] = 0  # left padding in the first sequence
    return ids, mask


@pytest.mark.torch
def test_transformers_decoder_round_trips(llama: Any, tmp_path: Path) -> None:
    import torch

    ids, mask = _ids_and_mask(3, 10)
    exp = export.from_torch(
        llama,
        (ids,),
        {"attention_mask": mask, "use_cache": False},
        dynamic={"input_ids": "b, t", "attention_mask": "b, t"},
    )
    assert [str(d) for d in exp.in_avals[0].shape] == ["b", "t"]
    assert llama.lm_head.weight is llama.model.embed_tokens.weight  # tied
    constants = [line for line in exp.mlir_module().splitlines() if "stablehlo.constant" in line]
    assert len([c for c in constants if "tensor<96x32xf32>" in c]) == 1  # stored once
    path = export.save(exp, tmp_path / "llama.jaxexport")
    ids2, mask2 = _ids_and_mask(2, 7, seed=1)  # another batch and length
    with torch.no_grad():
        reference = llama(ids2, attention_mask=mask2, use_cache=False).logits.numpy()
    fresh = export.run_in_fresh_process(path, ids2.numpy(), attention_mask=mask2.numpy())
    assert fresh.imported == [] and set(fresh.result) == {"logits"}
    assert export.max_rel_error(fresh.result["logits"], reference) < 1e-4
    meta = json.loads(export.sidecar_path(path).read_text())
    assert [i["name"] for i in meta["inputs"]] == ["input_ids", "attention_mask"]
    assert meta["source"].startswith("torch")


@pytest.mark.torch
def test_torch_errors_say_what_to_do(llama: Any) -> None:
    ids, mask = _ids_and_mask(3, 10)
    llama.train()
    with pytest.raises(export.TrainingModeError, match=r"model\.eval\(\)"):
        export.from_torch(llama, (ids,))
    llama.eval()
    with pytest.raises(ValueError, match="name a tensor input"):
        export.from_torch(llama, (ids,), dynamic={"ids": "b, t"})
    dynamic = {"input_ids": "b, t", "attention_mask": "b, t"}
    with pytest.raises(export.UnsupportedModelError, match=r"(?s)DynamicCache.*use_cache=False"):
        export.from_torch(llama, (ids,), {"attention_mask": mask}, dynamic=dynamic)
    one = {"attention_mask": mask[:1], "use_cache": False}
    with pytest.raises(export.UnsupportedModelError, match=r"suggests b = 1.*size >= 2 on b"):
        export.from_torch(llama, (ids[:1],), one, dynamic=dynamic)
