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
    check_call,
    dtype_changes,
    explicit_dtype,
    export_platforms,
    has_arrays,
    int_keys,
    leaf_names,
    match_dynamic,
    named_leaves,
    signature_of,
    slash_path,
    source_of,
    string_keys,
    symbolic_shapes,
)

if TYPE_CHECKING:  # flax is imported where a module is exported
    from flax import nnx

# Arguments by which a __call__ takes its mode, and the value that means inference.
_MODE_ARGS = {
    "train": False,
    "training": False,
    "is_training": False,
    "deterministic": True,
    "use_running_average": True,
    "inference": True,
}


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
            "nnx.view(model, deterministic=True, use_running_average=True))"
        )


def _mode_hint(sig: inspect.Signature | None, kwargs: Mapping[str, object]) -> str:
    """How to pass inference mode to a __call__ that takes it as an argument."""
    for name, param in (sig.parameters if sig is not None else {}).items():
        if name in _MODE_ARGS:
            now = kwargs.get(name, param.default)
            shown = "" if now is inspect.Parameter.empty else f" (it is {now!r} in this export)"
            return (
                f"its __call__ takes the mode as an argument, {name}{shown}, which overrides "
                f"model.eval(): pass {name}={_MODE_ARGS[name]!r} to from_jax"
            )
    return (
        "call model.eval(), or pass the argument that selects inference mode; a module that "
        "updates other state (a KV cache) must take that state as an input instead"
    )


def _state_changed(
    name: str, changed: list[str], sig: inspect.Signature | None, kwargs: Mapping[str, object]
) -> TrainingModeError:
    return TrainingModeError(
        f"{name} changed its own state while computing: {', '.join(changed)}. It ran in "
        "training mode (batch statistics updated, random numbers drawn): the export would "
        f"normalize with each batch's statistics and drop one fixed pattern. What to do: "
        f"{_mode_hint(sig, kwargs)}"
    )


def from_jax(
    fn_or_module: Callable[..., PyTree] | nnx.Module,
    *args: PyTree,
    dynamic: Mapping[str, Spec] | None = None,
    platforms: Sequence[str] | None = None,
    weights_outside: bool = False,
    **kwargs: PyTree,
) -> Exported:
    """Export a JAX callable or Flax NNX module called as ``fn(*args, **kwargs)``.

    Positional arguments and keyword arguments holding arrays (any pytree: dicts, lists,
    ``jax.ShapeDtypeStruct`` specs) become the artifact's inputs, with their dtypes; keyword
    arguments without arrays (``train=False``) are fixed at export time. An NNX module's
    weights go inside the artifact; a module in training mode, or one that changes its own
    state while computing (BatchNorm statistics, dropout's RNG), is refused. ``dynamic``
    names inputs, or leaves inside them by path (``"params/scale"``), and their symbolic
    dimensions, all in one scope (``{"tokens": "b, t", "mask": ("b, t", ["t <= 64"])}``).
    float64 inputs are refused while x64 is off (JAX would compute in float32); int64 becomes
    int32, recorded in the sidecar. ``platforms`` defaults to this machine's (e.g.
    ``("cuda", "cpu")`` for both); each name is checked. ``weights_outside=True`` (NNX modules)
    makes the weights the first input instead, a dict with string keys that :func:`save`
    writes beside the artifact and :func:`load` passes back in.
    """
    from flax import nnx

    lowering = export_platforms(platforms)
    weights = None
    state_dtypes: dict[str, np.dtype] = {}
    if isinstance(fn_or_module, nnx.Module):
        module = fn_or_module
        _refuse_training(module)
        graphdef, state = nnx.split(module)
        source_name = type(module).__name__
        target: object = type(module).__call__
        sig = signature_of(target, skip_self=True)
        for path, variable in nnx.to_flat_state(state):
            if (dtype := explicit_dtype(variable.get_raw_value())) is not None:
                state_dtypes[f"weight {'.'.join(map(str, path))}"] = dtype

        def fn(*a: PyTree, **k: PyTree) -> PyTree:
            fresh = jax.tree.map(lambda x: x, state)  # new Variables, made inside the trace
            if weights is not None:
                nnx.replace_by_pure_dict(fresh, int_keys(a[0]))
                a = a[1:]
            flat = list(nnx.to_flat_state(fresh))
            before = [v.get_raw_value() for _, v in flat]
            out = nnx.merge(graphdef, fresh)(*a, **k)
            changed = [
                f"{'.'.join(map(str, p))} ({type(v).__name__})"
                for (p, v), old in zip(flat, before, strict=True)
                if v.get_raw_value() is not old
            ]
            if changed:
                raise _state_changed(source_name, changed, sig, {**k, **static_kwargs})
            return out

        if weights_outside:  # parameters and batch statistics (not RNG state)
            learned = nnx.state(module, nnx.Any(nnx.Param, nnx.BatchStat))
            weights = string_keys(nnx.to_pure_dict(learned))
    elif callable(fn_or_module):
        fn = target = fn_or_module
        sig = signature_of(fn)
        source_name = getattr(fn, "__name__", type(fn).__name__)
    else:
        raise TypeError(
            f"from_jax takes a function or a Flax NNX module, got {type(fn_or_module).__name__}"
        )
    check_call(source_name, sig, args, kwargs)
    params = list(sig.parameters.values()) if sig is not None else []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if weights is not None:
        args, positional = (weights, *args), ["weights", *positional]
    names = [positional[i] if i < len(positional) else f"args[{i}]" for i in range(len(args))]
    traced_kwargs = {k: v for k, v in kwargs.items() if has_arrays(v)}
    static_kwargs = {k: v for k, v in kwargs.items() if k not in traced_kwargs}
    leaves = named_leaves(dict(zip(names, args, strict=True)) | traced_kwargs)
    given = {k: d for k, (_, leaf) in leaves.items() if (d := explicit_dtype(leaf)) is not None}
    changes = dtype_changes(
        {**given, **state_dtypes},
        fix="cast float64 inputs to float32 (x.astype(np.float32), or "
        "jax.ShapeDtypeStruct(shape, jnp.float32) specs) and keep weights in float32",
    )
    shapes = {k: tuple(np.shape(leaf)) for k, (_, leaf) in leaves.items()}
    dims = symbolic_shapes(shapes, match_dynamic(dynamic or {}, leaves))

    def spec(name: str, value: PyTree) -> PyTree:
        def leaf_spec(path: Sequence[object], x: PyTree) -> jax.ShapeDtypeStruct:
            key = slash_path(name, path)
            return jax.ShapeDtypeStruct(dims.get(key, np.shape(x)), canonical_dtype(x))

        return jax.tree_util.tree_map_with_path(leaf_spec, value)

    arg_specs = [spec(n, a) for n, a in zip(names, args, strict=True)]
    kwarg_specs = {k: spec(k, v) for k, v in traced_kwargs.items()}

    def exported_fn(*a: PyTree, **k: PyTree) -> PyTree:
        return fn(*a, **k, **static_kwargs)

    exported_fn.__name__ = source_name
    source_of(exported_fn, target, names)  # jax's tracing errors name the user's code
    exp = jax.export.export(jax.jit(exported_fn), platforms=lowering)(*arg_specs, **kwarg_specs)
    return remember(
        exp,
        source="jax",
        input_names=leaf_names(names, arg_specs, kwarg_specs),
        weights=weights,
        dtype_changes=changes,
    )
