"""Export a ``tf.function``, a SavedModel or a Keras model (:func:`from_tf`).

TensorFlow and Keras are imported inside the functions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

import jax
import numpy as np
from jax.export import Exported

from labkit.core.types import PyTree
from labkit.export.artifact import remember
from labkit.export.common import UnsupportedModelError, platform_tuple, symbolic_shapes

if TYPE_CHECKING:  # imported inside the functions: not every environment has them
    import keras
    import tensorflow as tf

type TFModel = tf.types.experimental.GenericFunction | keras.Model | str | os.PathLike[str]
"""What :func:`from_tf` exports: a ``tf.function``, a Keras model or a SavedModel folder."""

_NONE_BATCH = (
    "TensorFlow's XLA bridge writes StableHLO for concrete shapes only, and {what} has a None "
    "dimension. What to do: pass input_signature with every size set (one export per batch "
    "size, e.g. [tf.TensorSpec([8, 128], tf.float32)]); or, for one artifact with a symbolic "
    "batch, build the model in Keras 3 on the JAX backend (KERAS_BACKEND=jax before importing "
    "keras) and pass the Keras model. (TensorFlow's own converter, savedmodel_to_stablehlo, "
    "keeps the None as a `?` size but writes shape-dialect ops that JAX cannot compile.)"
)


def _keras_model(obj: object) -> TypeGuard[keras.Model]:
    keras = __import__("sys").modules.get("keras")
    return keras is not None and isinstance(obj, keras.Model)


def _from_keras_jax(model: keras.Model, platforms: Sequence[str] | None) -> Exported:
    """A Keras 3 model on the JAX backend: ``stateless_call`` with every variable inside."""
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]  # BatchNorm statistics

    def forward(*xs: jax.Array) -> PyTree:
        inputs = xs[0] if len(xs) == 1 else list(xs)
        return model.stateless_call(trainable, non_trainable, inputs, training=False)[0]

    forward.__name__ = model.name
    names = [f"x{i}" for i in range(len(model.inputs))]
    entries = []
    for i, t in enumerate(model.inputs):
        sizes = [
            ("b" if axis == 0 else f"d{i}_{axis}") if size is None else str(size)
            for axis, size in enumerate(t.shape)
        ]
        entries.append(", ".join(sizes))
    shapes = {
        n: tuple(1 if s is None else s for s in t.shape)
        for n, t in zip(names, model.inputs, strict=True)
    }
    dims = symbolic_shapes(shapes, dict(zip(names, entries, strict=True)))
    specs = [
        jax.ShapeDtypeStruct(dims[n], t.dtype) for n, t in zip(names, model.inputs, strict=True)
    ]
    exp = jax.export.export(jax.jit(forward), platforms=platform_tuple(platforms))(*specs)
    keras_version = __import__("keras").__version__
    names = [t.name for t in model.inputs]
    return remember(exp, source=f"keras {keras_version} (jax backend)", input_names=names)


def _tf_callable(
    obj: TFModel, signature_key: str
) -> tuple[Callable[..., PyTree], list[tf.TensorSpec], str]:
    """The TensorFlow function to call, its input specs (maybe with None) and its kind."""
    import tensorflow as tf

    if isinstance(obj, str | os.PathLike):
        path = Path(obj)
        if not (path / "saved_model.pb").is_file():
            raise UnsupportedModelError(
                f"{path} is not a SavedModel directory (no saved_model.pb): pass the folder "
                "that tf.saved_model.save or model.export() wrote"
            )
        loaded = tf.saved_model.load(str(path))
        serve = getattr(loaded, "serve", None)  # Keras model.export() writes this endpoint
        if serve is not None and getattr(serve, "input_signature", None):
            return _keep(serve, loaded), list(serve.input_signature), "SavedModel endpoint serve"
        if signature_key not in loaded.signatures:
            raise UnsupportedModelError(
                f"{path} has no signature {signature_key!r}; it has {sorted(loaded.signatures)}"
            )
        sig = loaded.signatures[signature_key]
        names = list(sig.structured_input_signature[1])
        specs = [sig.structured_input_signature[1][n] for n in names]

        def by_name(*xs: tf.Tensor) -> PyTree:
            return sig(**dict(zip(names, xs, strict=True)))

        return _keep(by_name, loaded), specs, f"SavedModel signature {signature_key}"
    if _keras_model(obj):
        specs = [tf.TensorSpec(t.shape, t.dtype) for t in obj.inputs]
        return tf.function(obj, jit_compile=True), specs, "Keras model"
    specs = list(getattr(obj, "input_signature", None) or [])
    return obj, specs, "tf.function"


def _keep[T](fn: Callable[..., T], owner: object) -> Callable[..., T]:
    """``fn`` holding a strong reference to ``owner`` (restored functions hold it weakly)."""

    def kept(*xs: object) -> T:
        return fn(*xs)

    kept.owner = owner  # type: ignore[attr-defined]
    return kept


def from_tf(
    obj: TFModel,
    input_signature: Sequence[tf.TensorSpec | jax.ShapeDtypeStruct] | None = None,
    platforms: Sequence[str] | None = None,
    signature_key: str = "serving_default",
) -> Exported:
    """Export a ``tf.function``, a SavedModel directory or a Keras model to a JAX artifact.

    TensorFlow compiles the function with XLA for concrete shapes and JAX embeds that
    StableHLO (``jax.experimental.jax2tf.call_tf``); variables become constants inside the
    artifact. ``input_signature`` (``tf.TensorSpec`` or ``jax.ShapeDtypeStruct`` with every
    size set) replaces the function's own. A Keras model on the JAX backend is exported with
    ``jax.export`` directly and keeps a ``None`` batch as a symbol.
    """
    if _keras_model(obj) and __import__("keras").backend.backend() == "jax":
        return _from_keras_jax(obj, platforms)
    import tensorflow as tf
    from jax.experimental import jax2tf

    fn, specs, kind = _tf_callable(obj, signature_key)
    specs = list(input_signature) if input_signature is not None else specs
    if not specs:
        raise UnsupportedModelError(
            f"the {kind} has no input signature: pass input_signature=[tf.TensorSpec(...)]"
        )
    shapes = [tuple(s.shape) for s in specs]
    if any(d is None for shape in shapes for d in shape):
        raise UnsupportedModelError(_NONE_BATCH.format(what=f"the {kind}'s input {shapes}"))
    dtypes = [np.dtype(tf.as_dtype(s.dtype).as_numpy_dtype) for s in specs]
    zeros = [tf.zeros(s, d) for s, d in zip(shapes, dtypes, strict=True)]
    try:
        result = fn(*zeros)  # the output shapes and dtypes, for call_tf
    except tf.errors.InvalidArgumentError as err:
        if "portable artifact" not in str(err):
            raise
        raise UnsupportedModelError(
            f"TensorFlow {tf.__version__} cannot run this {kind}: it holds StableHLO "
            "(an XlaCallModule, as jax2tf and Keras on the JAX backend write) newer than this "
            "TensorFlow reads. What to do: export the model where it was built, with "
            "labkit.export.from_tf(keras_model) or from_jax, or save it from Keras on the "
            "TensorFlow backend"
        ) from err
    single = isinstance(result, dict) and len(result) == 1
    out_struct = jax.tree.map(
        lambda t: jax.ShapeDtypeStruct(tuple(t.shape), t.dtype.as_numpy_dtype), result
    )

    def tf_fn(*xs: tf.Tensor) -> PyTree:
        return fn(*xs)

    called = jax2tf.call_tf(tf_fn, has_side_effects=False, output_shape_dtype=out_struct)

    def forward(*xs: jax.Array) -> PyTree:
        out = called(*xs)
        return next(iter(out.values())) if single else out

    forward.__name__ = kind.split()[0]
    avals = [jax.ShapeDtypeStruct(s, d) for s, d in zip(shapes, dtypes, strict=True)]
    exp = jax.export.export(jax.jit(forward), platforms=platform_tuple(platforms))(*avals)
    names = [getattr(s, "name", None) or f"x{i}" for i, s in enumerate(specs)]
    return remember(exp, source=f"tensorflow {tf.__version__} ({kind})", input_names=names)
