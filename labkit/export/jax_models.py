"""Export a JAX callable or a Flax NNX module (:func:`from_jax`); training mode is refused."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import jax
import numpy as np
from jax.export import Exported

from labkit.core.types import PyTree
from labkit.export.artifact import remember
from labkit.export.common import (
    Spec,
    TrainingModeError,
    canonical_dtype,
    has_arrays,
    int_keys,
    is_array,
    leaf_names,
    platform_tuple,
    string_keys,
    symbolic_shapes,
)

if TYPE_CHECKING:  # flax is imported where a module is exported
    from flax import nnx


def training_layers(module: nnx.Module) -> list[str]:
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


def _refuse_training(module: nnx.Module) -> None:
    layers = training_layers(module)
    if layers:
        raise TrainingModeError(
            f"{type(module).__name__} is in training mode; its export would not compute "
            f"inference: {'; '.join(layers)}. Call model.eval() before exporting (or export "
            "nnx.view(model, deterministic=True, use_running_average=True)); pass "
            "allow_training=True only if you mean to export the training behaviour"
        )


def from_jax(
    fn_or_module: Callable[..., PyTree] | nnx.Module,
    *args: PyTree,
    dynamic: Mapping[str, Spec] | None = None,
    platforms: Sequence[str] | None = None,
    allow_training: bool = False,
    weights_outside: bool = False,
    **kwargs: PyTree,
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

        def fn(*a: PyTree, **k: PyTree) -> PyTree:
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
    traced_kwargs = {k: v for k, v in kwargs.items() if has_arrays(v)}
    static_kwargs = {k: v for k, v in kwargs.items() if k not in traced_kwargs}
    named = dict(zip(names, args, strict=True)) | traced_kwargs
    shapes = {k: tuple(np.shape(v)) for k, v in named.items() if is_array(v)}
    dims = symbolic_shapes(shapes, dynamic or {})

    def spec(name: str, value: PyTree) -> PyTree:
        if name in dims:
            return jax.ShapeDtypeStruct(dims[name], canonical_dtype(value))
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), canonical_dtype(x)), value)

    arg_specs = [spec(n, a) for n, a in zip(names, args, strict=True)]
    kwarg_specs = {k: spec(k, v) for k, v in traced_kwargs.items()}

    def exported_fn(*a: PyTree, **k: PyTree) -> PyTree:
        return fn(*a, **k, **static_kwargs)

    exported_fn.__name__ = source_name
    exp = jax.export.export(jax.jit(exported_fn), platforms=platform_tuple(platforms))(
        *arg_specs, **kwarg_specs
    )
    names_out = leaf_names(names, arg_specs, kwarg_specs)
    return remember(exp, source="jax", input_names=names_out, weights=weights)
