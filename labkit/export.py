"""Export your own model: one API for JAX, PyTorch and TensorFlow models, one artifact format.

Each front end returns a :class:`jax.export.Exported` with the model's weights inside it, so a
process that has only the saved file and ``jax`` calls it with the model's own inputs
(``exp.call(ids, attention_mask=mask)``):

- :func:`from_jax`: any callable or Flax NNX module, any pytree of inputs and dtypes, keyword
  arguments, dynamic dimensions named per argument in one symbolic scope
  (``dynamic={"tokens": "b, t"}``). A module in training mode is refused.
- :func:`from_torch`: ``torch.export`` then torchax's JAX interpreter of the ATen graph, with
  dtypes, input names and keyword inputs kept, tied weights stored once, every dynamic
  dimension in one symbolic scope.
- :func:`from_tf`: a ``tf.function``, a SavedModel directory (``model.export()`` writes one)
  or a Keras model, through TensorFlow's XLA bridge (``jax2tf.call_tf``); a ``None`` batch
  where it can be had (Keras on the JAX backend), a clear error naming the alternative
  where it cannot.

The artifact format (:func:`save`, :func:`load`, the checks, :func:`run_in_fresh_process`,
:func:`describe`) lives in :mod:`labkit.artifact` and is re-exported here, with the helpers
the export lessons share (:func:`max_rel_error`, :func:`main_signature`).
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.export import Exported

from labkit.artifact import (
    Artifact,
    ArtifactError,
    ExportInfo,
    FreshRun,
    InputShapeError,
    PlatformMismatch,
    call,
    check_inputs,
    check_platform,
    describe,
    load,
    provenance,
    read_sidecar,
    remember,
    run_in_fresh_process,
    save,
    sidecar_path,
    symbol_bounds,
)

__all__ = [
    "Artifact",
    "ArtifactError",
    "ExportInfo",
    "FreshRun",
    "InputShapeError",
    "PlatformMismatch",
    "TrainingModeError",
    "UnsupportedModelError",
    "call",
    "check_inputs",
    "check_platform",
    "describe",
    "from_jax",
    "from_tf",
    "from_torch",
    "int_keys",
    "load",
    "main_signature",
    "max_rel_error",
    "provenance",
    "read_sidecar",
    "run_in_fresh_process",
    "save",
    "sidecar_path",
    "string_keys",
    "symbol_bounds",
    "training_layers",
]

Spec = str | tuple[str, Sequence[str]]  # "b, t" or ("b, t", ["t <= 64"])


class TrainingModeError(ValueError):
    """A module is in training mode: its export would compute something else than inference."""


class UnsupportedModelError(ValueError):
    """The model cannot be exported as it is; the message says what to change."""


# ---------------------------------------------------------------------------------------
# Helpers the export lessons share


def max_rel_error(actual: Any, reference: Any) -> float:
    """``max |actual - reference| / max |reference|`` (a normwise, scale-free error)."""
    a, r = np.asarray(actual, np.float64), np.asarray(reference, np.float64)
    return float(np.abs(a - r).max() / max(np.abs(r).max(), 1e-30))


_MAIN = re.compile(r"func\.func\s+(?:public\s+)?@main\((.*?)\)\s*->\s*(.*?)\s*\{\s*$", re.M)
_TENSOR = re.compile(r"tensor<[^<>]*>")


def main_signature(text: str) -> tuple[list[str], list[str]]:
    """The argument and result types of ``@main``, e.g. ``(["tensor<8x128xf32>"], [...])``.

    Reads StableHLO text from any producer (JAX, torchax, TensorFlow).
    """
    match = _MAIN.search(text)
    if match is None:
        raise ValueError("no func.func @main(...) -> ... { line found: is this StableHLO text?")
    return _TENSOR.findall(match.group(1)), _TENSOR.findall(match.group(2))


def string_keys(tree: Any) -> Any:
    """Nested dicts with every key a string (serialization wants ``"0"``, not ``0``)."""
    if isinstance(tree, dict):
        return {str(k): string_keys(v) for k, v in tree.items()}
    return tree


def int_keys(tree: Any) -> Any:
    """Undo :func:`string_keys`: keys made of digits become ints again (``nnx.List`` indices)."""
    if isinstance(tree, dict):
        return {
            (int(k) if isinstance(k, str) and k.isdigit() else k): int_keys(v)
            for k, v in tree.items()
        }
    return tree


# ---------------------------------------------------------------------------------------
# Dynamic dimensions: one symbolic scope for every input


def _split_spec(spec: Spec, name: str) -> tuple[list[str], list[str]]:
    if isinstance(spec, str):
        text, constraints = spec, []
    elif isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str):
        text, constraints = spec[0], list(spec[1])
    else:
        raise TypeError(
            f"dynamic[{name!r}] must be a spec string such as 'b, t' or a (spec, constraints) "
            f"pair such as ('b, t', ['t <= 64']), got {spec!r}"
        )
    return [d.strip() for d in text.split(",")], constraints


def symbolic_shapes(
    shapes: Mapping[str, tuple[int, ...]], dynamic: Mapping[str, Spec]
) -> dict[str, tuple[Any, ...]]:
    """Each named input's shape with its dynamic dimensions as symbols of one scope.

    ``dynamic`` maps an input name to one entry per axis: a symbol (``"b"``), an
    expression (``"2*b"``), an integer, or ``"_"`` to keep the example's size. Symbols with
    the same name are the same dimension across inputs.
    """
    dims: dict[str, list[str]] = {}
    constraints: list[str] = []
    for name, spec in dynamic.items():
        if name not in shapes:
            raise ValueError(
                f"dynamic names {name!r}, which is not an array input; the inputs are "
                f"{sorted(shapes)}"
            )
        entries, more = _split_spec(spec, name)
        if len(entries) != len(shapes[name]):
            raise ValueError(
                f"dynamic[{name!r}] = {spec!r} has {len(entries)} entries but {name} has rank "
                f"{len(shapes[name])} (shape {shapes[name]}): give one entry per axis, '_' "
                "for the example's size"
            )
        dims[name] = [str(s) if e == "_" else e for e, s in zip(entries, shapes[name], strict=True)]
        constraints += more
    flat = [e for entries in dims.values() for e in entries]
    try:
        symbols = jax.export.symbolic_shape(", ".join(flat), constraints=constraints)
    except ValueError as err:
        raise ValueError(
            f"jax.export.symbolic_shape rejects dynamic={dict(dynamic)!r}: {err}"
        ) from err
    out, i = {}, 0
    for name, entries in dims.items():
        out[name] = tuple(symbols[i : i + len(entries)])
        i += len(entries)
    return out


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray | np.generic | jax.Array | jax.ShapeDtypeStruct)


def _has_arrays(tree: Any) -> bool:
    return any(_is_array(leaf) for leaf in jax.tree.leaves(tree))


# ---------------------------------------------------------------------------------------
# JAX


def training_layers(module: Any) -> list[str]:
    """Paths of the NNX layers that train: BatchNorm on batch statistics, live Dropout."""
    from flax import nnx

    found = []
    for path, node in nnx.iter_graph(module):
        if not isinstance(node, nnx.Module):
            continue
        where = ".".join(map(str, path)) or "(the module itself)"
        kind = type(node).__name__
        if getattr(node, "use_running_average", None) is False:
            found.append(f"{where} ({kind}: normalizes with the batch's own statistics)")
        rate = getattr(node, "rate", getattr(node, "dropout_rate", 0.0)) or 0.0
        if getattr(node, "deterministic", None) is False and rate > 0:
            found.append(f"{where} ({kind}: drops {rate:g} of its inputs at random)")
    return found


def _refuse_training(module: Any) -> None:
    layers = training_layers(module)
    if layers:
        raise TrainingModeError(
            f"{type(module).__name__} is in training mode; its export would not compute "
            f"inference: {'; '.join(layers)}. Call model.eval() before exporting (or export "
            "nnx.view(model, deterministic=True, use_running_average=True)); pass "
            "allow_training=True only if you mean to export the training behaviour"
        )


def from_jax(
    fn_or_module: Callable[..., Any],
    *args: Any,
    dynamic: Mapping[str, Spec] | None = None,
    platforms: Sequence[str] | None = None,
    allow_training: bool = False,
    weights_outside: bool = False,
    **kwargs: Any,
) -> Exported:
    """Export a JAX callable or Flax NNX module called as ``fn(*args, **kwargs)``.

    Positional arguments and keyword arguments holding arrays (any pytree: dicts, lists,
    ``jax.ShapeDtypeStruct`` specs) become the artifact's inputs, with their dtypes; keyword
    arguments without arrays (``deterministic=True``) are fixed at export time. An NNX
    module's weights go inside the artifact. ``dynamic`` names inputs and their symbolic
    dimensions, all in one scope (``{"tokens": "b, t", "mask": ("b, t", ["t <= 64"])}``).
    ``platforms`` defaults to this machine's (e.g. ``("cuda", "cpu")`` for both).
    ``weights_outside=True`` (NNX modules) makes the weights the first input instead, a
    dict with string keys that :func:`save` writes beside the artifact and :func:`load`
    passes back in.
    """
    from flax import nnx

    weights = None
    if isinstance(fn_or_module, nnx.Module):
        if not allow_training:
            _refuse_training(fn_or_module)
        graphdef, state = nnx.split(fn_or_module)

        def fn(*a: Any, **k: Any) -> Any:
            if weights is None:
                return nnx.merge(graphdef, state)(*a, **k)
            fresh = jax.tree.map(lambda x: x, state)  # new Variables the trace may fill
            nnx.replace_by_pure_dict(fresh, int_keys(a[0]))
            return nnx.merge(graphdef, fresh)(*a[1:], **k)

        if weights_outside:  # parameters and batch statistics (not RNG state)
            learned = nnx.state(fn_or_module, nnx.Any(nnx.Param, nnx.BatchStat))
            weights = string_keys(nnx.to_pure_dict(learned))

        signature = inspect.signature(type(fn_or_module).__call__)
        params = list(signature.parameters.values())[1:]  # without self
        source_name = type(fn_or_module).__name__
    elif callable(fn_or_module):
        fn = fn_or_module
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # a builtin or a jitted function without a signature
            params = []
        source_name = getattr(fn, "__name__", type(fn).__name__)
    else:
        raise TypeError(
            f"from_jax takes a function or a Flax NNX module, got {type(fn_or_module).__name__}"
        )
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if weights is not None:
        args, positional = (weights, *args), ["weights", *positional]
    names = [positional[i] if i < len(positional) else f"args[{i}]" for i in range(len(args))]
    traced_kwargs = {k: v for k, v in kwargs.items() if _has_arrays(v)}
    static_kwargs = {k: v for k, v in kwargs.items() if k not in traced_kwargs}
    named = dict(zip(names, args, strict=True)) | traced_kwargs
    shapes = {k: tuple(np.shape(v)) for k, v in named.items() if _is_array(v)}
    dims = symbolic_shapes(shapes, dynamic or {})

    def spec(name: str, value: Any) -> Any:
        if name in dims:
            return jax.ShapeDtypeStruct(dims[name], _dtype(value))
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), _dtype(x)), value)

    arg_specs = [spec(n, a) for n, a in zip(names, args, strict=True)]
    kwarg_specs = {k: spec(k, v) for k, v in traced_kwargs.items()}

    def exported_fn(*a: Any, **k: Any) -> Any:
        return fn(*a, **k, **static_kwargs)

    exported_fn.__name__ = source_name
    exp = jax.export.export(jax.jit(exported_fn), platforms=_platforms(platforms))(
        *arg_specs, **kwarg_specs
    )
    names_out = _leaf_names(names, arg_specs, kwarg_specs)
    return remember(exp, source="jax", input_names=names_out, weights=weights)


def _dtype(x: Any) -> Any:
    """The dtype JAX gives ``x`` (int64 becomes int32 unless x64 is on, as in ``jax.jit``)."""
    return jax.dtypes.canonicalize_dtype(x.dtype if hasattr(x, "dtype") else np.result_type(x))


def _platforms(platforms: Sequence[str] | None) -> tuple[str, ...] | None:
    if platforms is None:
        return None
    if isinstance(platforms, str):
        return (platforms,)
    return tuple(platforms)


def _leaf_names(names: list[str], arg_specs: list[Any], kwarg_specs: dict[str, Any]) -> list[str]:
    """A readable name per input leaf: the argument's name, plus the path inside a pytree."""
    out = []
    for name, tree in [*zip(names, arg_specs, strict=True), *sorted(kwarg_specs.items())]:
        paths = jax.tree_util.tree_flatten_with_path(tree)[0]
        out += [name + jax.tree_util.keystr(p) for p, _ in paths]
    return out


# ---------------------------------------------------------------------------------------
# PyTorch (imported inside the functions: the lab's main environment has no torch)


def _torch_dims(
    shapes: Mapping[str, tuple[int, ...]], dynamic: Mapping[str, Spec]
) -> tuple[dict[str, dict[int, Any]], dict[str, list[str]]]:
    """``torch.export`` dynamic shapes (one ``Dim`` per symbol name) and each input's axes."""
    import torch

    bounds: dict[str, dict[str, int]] = {}
    axes: dict[str, list[str]] = {}
    for name, spec in dynamic.items():
        entries, constraints = _split_spec(spec, name)
        if name not in shapes or len(entries) != len(shapes[name]):
            raise ValueError(
                f"dynamic[{name!r}] = {spec!r} does not fit the tensor inputs "
                f"{ {k: v for k, v in shapes.items()} }: name a tensor input, one entry per axis"
            )
        axes[name] = entries
        for text in constraints:
            m = re.fullmatch(r"\s*(\w+)\s*(<=|>=)\s*(\d+)\s*", text)
            if m is None:
                raise ValueError(f"constraint {text!r}: from_torch takes 'x <= N' or 'x >= N'")
            bounds.setdefault(m[1], {})["max" if m[2] == "<=" else "min"] = int(m[3])
    symbols = {e for entries in axes.values() for e in entries if e.isidentifier() and e != "_"}
    dims = {s: torch.export.Dim(s, **bounds.get(s, {})) for s in sorted(symbols)}
    out: dict[str, dict[int, Any]] = {}
    for name, entries in axes.items():
        for axis, entry in enumerate(entries):
            if entry in dims:
                out.setdefault(name, {})[axis] = dims[entry]
            elif entry != "_" and not entry.isdigit():
                raise ValueError(
                    f"dynamic[{name!r}] entry {entry!r}: from_torch takes symbol names, "
                    "integers or '_' (torch.export derives expressions itself)"
                )
    return out, axes


def _torch_error(err: Exception) -> UnsupportedModelError:
    """What to do about the errors a Hugging Face-style model meets in torch.export."""
    text = f"{type(err).__name__}: {err}"
    first = text.strip().splitlines()[0][:300]
    if "Cache" in text:
        fix = (
            "the model returns a KV-cache object, which is not a tensor: export with "
            "use_cache=False (pass it as a keyword or set model.config.use_cache = False)"
        )
    elif "scaled_dot_product" in text or "sdpa" in text.lower():
        fix = (
            "scaled_dot_product_attention does not decompose to ops torchax lowers: load the "
            "model with attn_implementation='eager' (transformers) or write attention as matmuls"
        )
    elif "0/1 specialization" in text or "specialized" in text or "Constraints violated" in text:
        fix = (
            "torch.export fixed a dimension you marked dynamic: give example inputs of size "
            ">= 2 on every dynamic axis (PyTorch specializes sizes 0 and 1), and mark every "
            "input that shares the dimension with the same symbol"
        )
    else:
        fix = "see the first line above; torch.export.draft_export(...) lists every problem"
    return UnsupportedModelError(f"{first}\nWhat to do: {fix}")


def _jax_tree(values: list[Any], spec: Any) -> Any:
    """Torch's output ``TreeSpec`` rebuilt with plain dicts, tuples and lists for JAX."""
    it = iter(values)

    def build(s: Any) -> Any:
        if s.is_leaf():
            return next(it)
        children = [build(c) for c in s.children()]
        if isinstance(s.context, list | tuple) and len(s.context) == len(children):
            if all(isinstance(k, str) for k in s.context):  # dict, OrderedDict, ModelOutput
                return dict(zip(s.context, children, strict=True))
        return list(children) if s.type is list else tuple(children)

    return build(spec)


def from_torch(
    model: Any,
    args: Any,
    kwargs: Mapping[str, Any] | None = None,
    dynamic: Mapping[str, Spec] | None = None,
    platforms: Sequence[str] | None = None,
) -> Exported:
    """Export a PyTorch module with ``torch.export`` and torchax; call it as the module.

    ``args`` (a tensor or a tuple) and ``kwargs`` are example inputs: tensors become the
    artifact's inputs with their dtypes (int64 ids arrive as int32 unless JAX runs with x64)
    and names; other values (``use_cache=False``) are fixed. ``dynamic`` maps input names to
    symbols (``{"input_ids": "b, t", "attention_mask": "b, t"}``), one scope for all. The
    weights go inside the artifact, each tied weight once.
    """
    import torch
    import torchax
    import torchax.export

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"from_torch takes a torch.nn.Module, got {type(model).__name__}")
    if model.training:
        raise TrainingModeError(
            f"{type(model).__name__} is in training mode (dropout active, batch norm on batch "
            "statistics): call model.eval() before exporting"
        )
    args = tuple(args) if isinstance(args, tuple | list) else (args,)
    kwargs = dict(kwargs or {})
    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    tensors = {k: v for k, v in bound.arguments.items() if isinstance(v, torch.Tensor)}
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    torch_dims, axes = _torch_dims(shapes, dynamic or {})
    dynamic_shapes = {k: torch_dims.get(k) for k in bound.arguments}
    try:
        program = torch.export.export(
            model, args, kwargs, dynamic_shapes=dynamic_shapes if torch_dims else None
        )
        _, states, interpret = torchax.export.exported_program_to_jax(program, export_raw=True)
    except Exception as err:  # torch.export and torchax raise many types; each explained
        raise _torch_error(err) from err
    weights = _dedup_weights(states)
    in_spec, out_spec = program.call_spec.in_spec, program.call_spec.out_spec
    kw_order = list(in_spec.children()[1].context)
    constants = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
    if any(not isinstance(a, torch.Tensor) for a in args):
        raise UnsupportedModelError(
            "from_torch takes tensors as positional inputs; pass other values as keywords "
            "(they are fixed at export time)"
        )

    def fn(*a: Any, **k: Any) -> Any:
        flat = [*a, *[k[n] if n in k else constants[n] for n in kw_order]]
        return _jax_tree(list(interpret(weights, flat)), out_spec)

    fn.__name__ = type(model).__name__
    all_dims = symbolic_shapes(shapes, {k: ", ".join(v) for k, v in axes.items()})
    program_bounds = _range_constraints(program, tensors, all_dims)
    if program_bounds:  # bounds torch.export proved (e.g. t <= max_position_embeddings)
        all_dims = symbolic_shapes(
            shapes, {k: (", ".join(v), program_bounds) for k, v in axes.items()}
        )

    def spec(name: str, t: Any) -> jax.ShapeDtypeStruct:
        dtype = _dtype(np.empty(0, torchax.ops.mappings.t2j_dtype(t.dtype)))  # int64 -> int32
        return jax.ShapeDtypeStruct(all_dims.get(name, tuple(t.shape)), dtype)

    positional = list(bound.arguments)[: len(args)]
    arg_specs = [spec(n, t) for n, t in zip(positional, args, strict=True)]
    kwarg_specs = {k: spec(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    exp = jax.export.export(jax.jit(fn), platforms=_platforms(platforms))(*arg_specs, **kwarg_specs)
    return remember(
        exp,
        source=f"torch {torch.__version__} + torchax {torchax.__version__}",
        input_names=_leaf_names(positional, arg_specs, kwarg_specs),
    )


def _dedup_weights(states: Sequence[Any]) -> list[Any]:
    """Torch parameters and buffers as JAX arrays; a tensor seen twice (tied) is one array."""
    import torchax

    env = torchax.default_env()
    seen: dict[tuple[Any, ...], Any] = {}
    out = []
    for t in states:
        key = (
            (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
            if hasattr(t, "untyped_storage")
            else (id(t),)
        )
        if key not in seen:
            seen[key] = env.t2j_copy(t)
        out.append(seen[key])
    return out


def _range_constraints(
    program: Any, tensors: Mapping[str, Any], dims: Mapping[str, tuple[Any, ...]]
) -> list[str]:
    """``"t <= 64"`` for each bound torch.export proved on a symbol we named."""
    import torch

    user_kind = torch.export.graph_signature.InputKind.USER_INPUT
    user = [s for s in program.graph_signature.input_specs if s.kind == user_kind]
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    found = []
    for input_spec, name in zip(user, [k for k in tensors], strict=False):
        val = nodes[input_spec.arg.name].meta.get("val")
        if name not in dims or val is None:
            continue
        for size, dim in zip(val.shape, dims[name], strict=True):
            if isinstance(size, torch.SymInt) and jax.export.is_symbolic_dim(dim):
                rng = program.range_constraints.get(size.node.expr)
                if rng is None or not str(dim).isidentifier():
                    continue
                upper = str(rng.upper)
                if upper.isdigit():  # finite: torch writes int_oo for no bound
                    found.append(f"{dim} <= {upper}")
    return sorted(set(found))


# ---------------------------------------------------------------------------------------
# TensorFlow and Keras (imported inside the functions)

_NONE_BATCH = (
    "TensorFlow's XLA bridge writes StableHLO for concrete shapes only, and {what} has a None "
    "dimension. What to do: pass input_signature with every size set (one export per batch "
    "size, e.g. [tf.TensorSpec([8, 128], tf.float32)]); or, for one artifact with a symbolic "
    "batch, build the model in Keras 3 on the JAX backend (KERAS_BACKEND=jax before importing "
    "keras) and pass the Keras model. (TensorFlow's own converter, savedmodel_to_stablehlo, "
    "keeps the None as a `?` size but writes shape-dialect ops that JAX cannot compile.)"
)


def _keras_model(obj: Any) -> bool:
    keras = __import__("sys").modules.get("keras")
    return keras is not None and isinstance(obj, keras.Model)


def _from_keras_jax(model: Any, platforms: Sequence[str] | None) -> Exported:
    """A Keras 3 model on the JAX backend: ``stateless_call`` with every variable inside."""
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]  # BatchNorm statistics

    def forward(*xs: Any) -> Any:
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
    exp = jax.export.export(jax.jit(forward), platforms=_platforms(platforms))(*specs)
    keras_version = __import__("keras").__version__
    names = [t.name for t in model.inputs]
    return remember(exp, source=f"keras {keras_version} (jax backend)", input_names=names)


def _tf_callable(obj: Any, signature_key: str) -> tuple[Callable[..., Any], list[Any], str]:
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

        def by_name(*xs: Any) -> Any:
            return sig(**dict(zip(names, xs, strict=True)))

        return _keep(by_name, loaded), specs, f"SavedModel signature {signature_key}"
    if _keras_model(obj):
        specs = [tf.TensorSpec(t.shape, t.dtype) for t in obj.inputs]
        return tf.function(obj, jit_compile=True), specs, "Keras model"
    specs = list(getattr(obj, "input_signature", None) or [])
    return obj, specs, "tf.function"


def _keep(fn: Callable[..., Any], owner: Any) -> Callable[..., Any]:
    """``fn`` holding a strong reference to ``owner`` (restored functions hold it weakly)."""

    def kept(*xs: Any) -> Any:
        return fn(*xs)

    kept.owner = owner  # type: ignore[attr-defined]
    return kept


def from_tf(
    obj: Any,
    input_signature: Sequence[Any] | None = None,
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

    def tf_fn(*xs: Any) -> Any:
        return fn(*xs)

    called = jax2tf.call_tf(tf_fn, has_side_effects=False, output_shape_dtype=out_struct)

    def forward(*xs: Any) -> Any:
        out = called(*xs)
        return next(iter(out.values())) if single else out

    forward.__name__ = kind.split()[0]
    avals = [jax.ShapeDtypeStruct(s, d) for s, d in zip(shapes, dtypes, strict=True)]
    exp = jax.export.export(jax.jit(forward), platforms=_platforms(platforms))(*avals)
    names = [getattr(s, "name", None) or f"x{i}" for i, s in enumerate(specs)]
    return remember(exp, source=f"tensorflow {tf.__version__} ({kind})", input_names=names)
