"""Export a ``tf.function``, a SavedModel or a Keras model (:func:`from_tf`).

TensorFlow and Keras are imported inside the functions.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import jax
import numpy as np
from jax.export import Exported

from labkit.core.types import PyTree
from labkit.export.artifact import remember
from labkit.export.common import (
    Spec,
    TrainingModeError,
    UnsupportedModelError,
    check_call,
    dtype_changes,
    export_platforms,
    match_dynamic,
    signature_of,
    slash_path,
    source_of,
    split_spec,
    symbolic_shapes,
)

if TYPE_CHECKING:  # imported inside the functions: not every environment has them
    import keras
    import tensorflow as tf

type TFModel = tf.types.experimental.GenericFunction | keras.Model | str | os.PathLike[str]
"""What :func:`from_tf` exports: a ``tf.function``, a Keras model or a SavedModel folder."""

type InputSpec = tf.TensorSpec | jax.ShapeDtypeStruct | keras.KerasTensor
"""One input's shape and dtype: ``tf.TensorSpec([8, 128], tf.float32)``,
``jax.ShapeDtypeStruct``, or ``keras.Input((128,))`` (a ``None`` batch)."""

_NONE_BATCH = (
    "TensorFlow's XLA bridge writes StableHLO for concrete shapes only, and {what}. What to "
    "do: pass input_signature with every size set (one export per batch size, e.g. "
    "[tf.TensorSpec([8, 128], tf.float32)]); or, for one artifact with a symbolic (and "
    "bounded) dimension, build the model in Keras 3 on the JAX backend (KERAS_BACKEND=jax "
    "before importing keras) and pass the Keras model, with dynamic= for bounds. "
    "(TensorFlow's own converter, savedmodel_to_stablehlo, keeps the None as a `?` size but "
    "writes shape-dialect ops that JAX cannot compile.)"
)

_FLOAT32_FIX = (
    "build the model and its inputs in float32 (keras.config.set_floatx('float32'), "
    "tf.TensorSpec(..., tf.float32))"
)


def _keras_model(obj: object) -> TypeGuard[keras.Model]:
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(obj, keras.Model)


def _np_dtype(dtype: Any) -> np.dtype:
    """A numpy dtype from a tf.DType, a Keras dtype name or a numpy dtype."""
    return np.dtype(getattr(dtype, "as_numpy_dtype", dtype))


def _shape(spec: object) -> tuple[int | None, ...]:
    shape = spec.shape  # type: ignore[attr-defined]
    dims = shape.as_list() if hasattr(shape, "as_list") else list(shape)
    return tuple(None if d is None else int(d) for d in dims)


def _is_spec(x: object) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _keras_arguments(
    model: keras.Model, input_signature: Sequence[PyTree] | None
) -> tuple[list[PyTree], list[str]]:
    """The model's positional arguments as trees of specs (sizes may be None), and their names.

    A functional or Sequential model says its inputs (``model.input``: one tensor, a list or
    a dict by name); a subclassed model needs ``input_signature``.
    """
    name = type(model).__name__
    if input_signature is not None:
        args = list(input_signature)
        sig = signature_of(model.call)
        check_call(f"{name}.call", sig, args, {})
        params = list(sig.parameters) if sig is not None else []
        return args, [params[i] if i < len(params) else f"args[{i}]" for i in range(len(args))]
    try:
        structure = model.input  # a tensor, a list, or a dict by name, as the model was built
    except (AttributeError, ValueError) as err:
        inputs = getattr(model, "inputs", None)  # a reloaded Sequential has only these
        if inputs:
            return [inputs[0] if len(inputs) == 1 else list(inputs)], ["inputs"]
        built = getattr(model, "_build_shapes_dict", None) or {}  # Keras's record, if any
        shapes = [tuple(s)[1:] for s in built.values() if isinstance(s, tuple | list)]
        example = ", ".join(f"keras.Input({s!r})" for s in shapes) or "keras.Input((16,))"
        raise UnsupportedModelError(
            f"Keras does not record the inputs of {name} (a subclassed keras.Model): {err} "
            f"What to do: pass input_signature, one spec per argument of {name}.call "
            f"(input_signature=[{example}]: keras.Input leaves the batch None, a symbol here; "
            "a dict of specs for a dict input); or build it as a functional model"
        ) from err
    return [structure], ["inputs"]


def _own_name(spec: object) -> str | None:
    """The name a spec was given (``keras.Input(name="tokens")``), not one Keras made up."""
    name = getattr(spec, "name", None)
    if not isinstance(name, str) or not name or name.startswith("keras_tensor"):
        return None
    return name


def _keras_leaves(args: list[PyTree], names: list[str]) -> dict[str, tuple[str, object]]:
    """Each input leaf by name: the Keras input's own name where it has one, else its path."""
    leaves: dict[str, tuple[str, object]] = {}
    for arg, name in zip(args, names, strict=True):
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg, is_leaf=_is_spec)[0]:
            own = _own_name(leaf)
            if own is not None and own not in leaves:
                leaves[own] = (own, leaf)
            else:
                leaves[slash_path(name, path)] = (name + jax.tree_util.keystr(path), leaf)
    return leaves


def _keras_specs(
    leaves: Mapping[str, tuple[str, object]], dynamic: Mapping[str, Spec]
) -> dict[str, jax.ShapeDtypeStruct]:
    """One ShapeDtypeStruct per leaf: ``None`` sizes become symbols (``b`` for the batch)."""
    shapes = {k: _shape(leaf) for k, (_, leaf) in leaves.items()}
    wanted = match_dynamic(dynamic, leaves)
    specs: dict[str, Spec] = {}
    for i, (key, shape) in enumerate(shapes.items()):
        if key in wanted:
            entries, _ = split_spec(wanted[key], key)
            for axis, (entry, size) in enumerate(zip(entries, shape, strict=False)):
                if size is not None and entry not in ("_", str(size)):
                    raise ValueError(
                        f"dynamic[{key!r}] = {wanted[key]!r}: Keras fixes axis {axis} of {key} "
                        f"to {size} (shape {shape}); write '_' or {size} there"
                    )
            specs[key] = wanted[key]
        else:
            sizes = [
                ("b" if axis == 0 else f"d{i}_{axis}") if size is None else str(size)
                for axis, size in enumerate(shape)
            ]
            specs[key] = ", ".join(sizes)
    dims = symbolic_shapes(shapes, specs)
    return {
        k: jax.ShapeDtypeStruct(dims[k], _np_dtype(leaf.dtype))  # type: ignore[attr-defined]
        for k, (_, leaf) in leaves.items()
    }


def _from_keras_jax(
    model: keras.Model,
    input_signature: Sequence[PyTree] | None,
    dynamic: Mapping[str, Spec],
    platforms: tuple[str, ...] | None,
) -> Exported:
    """A Keras 3 model on the JAX backend, called as ``model(*args, training=False)``.

    Every variable goes inside the artifact; the inputs keep the model's structure (a dict
    input is passed by name); ``None`` sizes become symbols. A model that changes its own
    state while computing (training mode) is refused.
    """
    import keras

    if not model.built:
        raise UnsupportedModelError(
            f"{type(model).__name__} has no weights yet: call it once on an example batch "
            "(model(x)) or build it, then export"
        )
    args, names = _keras_arguments(model, input_signature)
    leaves = _keras_leaves(args, names)
    changes = dtype_changes(
        {
            **{f"input {k}": _np_dtype(leaf.dtype) for k, (_, leaf) in leaves.items()},  # type: ignore[attr-defined]
            **{f"variable {v.path}": _np_dtype(v.dtype) for v in model.variables},
        },
        fix=_FLOAT32_FIX,
    )
    flat_specs = iter(_keras_specs(leaves, dynamic).values())
    arg_specs = [jax.tree.map(lambda _: next(flat_specs), arg, is_leaf=_is_spec) for arg in args]
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]  # BatchNorm statistics

    def forward(*xs: PyTree) -> PyTree:
        mapping = [
            *zip(model.trainable_variables, trainable, strict=True),
            *zip(model.non_trainable_variables, non_trainable, strict=True),
        ]
        with keras.StatelessScope(state_mapping=mapping) as scope:
            out = model(*xs, training=False)
        changed = [
            v.path
            for v, old in zip(model.non_trainable_variables, non_trainable, strict=True)
            if scope.get_current_value(v) is not old
        ]
        if changed:
            raise TrainingModeError(
                f"{type(model).__name__} changed its own state while computing with "
                f"training=False: {', '.join(changed)}. A layer ignores the training "
                "argument (pass it on to every sublayer in call) or keeps other state: "
                "export a model whose inference leaves its variables alone"
            )
        return out

    forward.__name__ = model.name
    source_of(forward, model.call, names)
    exp = jax.export.export(jax.jit(forward), platforms=platforms)(*arg_specs)
    return remember(
        exp,
        source=f"keras {keras.__version__} (jax backend)",
        input_names=[keystr for keystr, _ in leaves.values()],
        dtype_changes=changes,
    )


def _tf_callable(
    obj: TFModel, signature_key: str, input_signature: Sequence[PyTree] | None
) -> tuple[Callable[..., PyTree], list[PyTree], str]:
    """The TensorFlow function to call, its arguments as trees of specs, and its kind."""
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
        model = obj
        args, _ = _keras_arguments(model, input_signature)

        def keras_call(*xs: tf.Tensor) -> PyTree:
            return model(*xs, training=False)

        return keras_call, args, "Keras model"
    if isinstance(obj, tf.types.experimental.GenericFunction):
        return obj, list(getattr(obj, "input_signature", None) or []), "tf.function"
    if callable(obj):
        return obj, [], f"Python function {getattr(obj, '__name__', type(obj).__name__)}"
    raise TypeError(
        f"from_tf takes a tf.function, a Keras model or a SavedModel folder, got "
        f"{type(obj).__name__}"
    )


def _keep[T](fn: Callable[..., T], owner: object) -> Callable[..., T]:
    """``fn`` holding a strong reference to ``owner`` (restored functions hold it weakly)."""

    def kept(*xs: object) -> T:
        return fn(*xs)

    kept.owner = owner  # type: ignore[attr-defined]
    return kept


def from_tf(
    obj: TFModel,
    input_signature: Sequence[PyTree] | None = None,
    platforms: Sequence[str] | None = None,
    signature_key: str = "serving_default",
    dynamic: Mapping[str, Spec] | None = None,
) -> Exported:
    """Export a ``tf.function``, a SavedModel directory or a Keras model to a JAX artifact.

    TensorFlow compiles the function with XLA for concrete shapes and JAX embeds that
    StableHLO (``jax.experimental.jax2tf.call_tf``); variables become constants inside the
    artifact. ``input_signature`` (one spec per argument: ``tf.TensorSpec``,
    ``jax.ShapeDtypeStruct`` or ``keras.Input(...)``, or a dict of them for a dict input)
    replaces the function's own. A Keras model on the JAX backend is exported with
    ``jax.export`` directly, called as the model is (a dict input by name), in inference
    mode: its ``None`` sizes become symbols and ``dynamic`` names and bounds them by input
    name (``{"tokens": ("b, t", ["t <= 64"])}``); a subclassed model needs
    ``input_signature``. float64 is refused while x64 is off.
    """
    lowering = export_platforms(platforms)
    dynamic = dict(dynamic or {})
    if _keras_model(obj) and sys.modules["keras"].backend.backend() == "jax":
        return _from_keras_jax(obj, input_signature, dynamic, lowering)
    import tensorflow as tf
    from jax.experimental import jax2tf

    fn, args, kind = _tf_callable(obj, signature_key, input_signature)
    if input_signature is not None:
        args = list(input_signature)
    if dynamic:
        raise UnsupportedModelError(
            _NONE_BATCH.format(what=f"dynamic={dynamic!r} asks for symbols in the {kind}")
        )
    if not args:
        example = "input_signature=[tf.TensorSpec([8, 128], tf.float32)]"
        if kind == "tf.function":
            raise UnsupportedModelError(
                f"the tf.function has no input signature: pass {example}, or give the "
                "tf.function one (tf.function(fn, input_signature=[...]))"
            )
        raise UnsupportedModelError(
            f"the {kind} is not a tf.function, so it has no input signature: pass {example}, "
            "or make it one with tf.function(fn, input_signature=[...])"
        )
    flat, treedef = jax.tree.flatten(args, is_leaf=_is_spec)
    shapes = [_shape(s) for s in flat]
    if any(d is None for shape in shapes for d in shape):
        raise UnsupportedModelError(
            _NONE_BATCH.format(what=f"the {kind}'s input {shapes} has a None dimension")
        )
    dtypes = [_np_dtype(s.dtype) for s in flat]
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(args, is_leaf=_is_spec)[0]]
    names = [
        _own_name(s) or (f"x{i}" if len(p) == 1 else "args" + jax.tree_util.keystr(p))
        for i, (s, p) in enumerate(zip(flat, paths, strict=True))
    ]
    changes = dtype_changes(dict(zip(names, dtypes, strict=True)), fix=_FLOAT32_FIX)

    def tf_fn(*xs: tf.Tensor) -> PyTree:
        return fn(*jax.tree.unflatten(treedef, xs))

    zeros = [tf.zeros(s, d) for s, d in zip(shapes, dtypes, strict=True)]
    try:
        result = tf_fn(*zeros)  # the output shapes and dtypes, for call_tf
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
    called = jax2tf.call_tf(tf_fn, has_side_effects=False, output_shape_dtype=out_struct)

    def forward(*xs: PyTree) -> PyTree:
        out = called(*jax.tree.leaves(xs))
        return next(iter(out.values())) if single else out

    forward.__name__ = kind.split()[0]
    avals = [jax.ShapeDtypeStruct(s, d) for s, d in zip(shapes, dtypes, strict=True)]
    arg_avals = jax.tree.unflatten(treedef, avals)
    exp = jax.export.export(jax.jit(forward), platforms=lowering)(*arg_avals)
    return remember(
        exp,
        source=f"tensorflow {tf.__version__} ({kind})",
        input_names=names,
        dtype_changes=changes,
    )
