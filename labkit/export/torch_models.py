"""Export a PyTorch module (:func:`from_torch`): ``torch.export``, then torchax's JAX interpreter.

torch and torchax are imported inside the functions: the lab's main environment has no torch.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.export import Exported

from labkit.core.types import PyTree
from labkit.export.artifact import remember
from labkit.export.common import (
    Spec,
    TrainingModeError,
    UnsupportedModelError,
    canonical_dtype,
    leaf_names,
    platform_tuple,
    split_spec,
    symbolic_shapes,
)

if TYPE_CHECKING:
    from jax._src.export.shape_poly import DimSize

# torch and torchax objects stay Any here: the main environment (and its mypy) has no torch.


def _torch_dims(
    shapes: Mapping[str, tuple[int, ...]], dynamic: Mapping[str, Spec]
) -> tuple[dict[str, dict[int, Any]], dict[str, list[str]]]:
    """``torch.export`` dynamic shapes (one ``Dim`` per symbol name) and each input's axes."""
    import torch

    bounds: dict[str, dict[str, int]] = {}
    axes: dict[str, list[str]] = {}
    for name, spec in dynamic.items():
        entries, constraints = split_spec(spec, name)
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


def _jax_tree(values: list[jax.Array], spec: Any) -> PyTree:
    """Torch's output ``TreeSpec`` rebuilt with plain dicts, tuples and lists for JAX."""
    it = iter(values)

    def build(s: Any) -> PyTree:
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
    args: object,
    kwargs: Mapping[str, object] | None = None,
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

    def fn(*a: jax.Array, **k: jax.Array) -> PyTree:
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
        dtype = canonical_dtype(
            np.empty(0, torchax.ops.mappings.t2j_dtype(t.dtype))
        )  # int64 -> int32
        return jax.ShapeDtypeStruct(all_dims.get(name, tuple(t.shape)), dtype)

    positional = list(bound.arguments)[: len(args)]
    arg_specs = [spec(n, t) for n, t in zip(positional, args, strict=True)]
    kwarg_specs = {k: spec(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    exp = jax.export.export(jax.jit(fn), platforms=platform_tuple(platforms))(
        *arg_specs, **kwarg_specs
    )
    return remember(
        exp,
        source=f"torch {torch.__version__} + torchax {torchax.__version__}",
        input_names=leaf_names(positional, arg_specs, kwarg_specs),
    )


def _dedup_weights(states: Sequence[Any]) -> list[jax.Array]:
    """Torch parameters and buffers as JAX arrays; a tensor seen twice (tied) is one array."""
    import torchax

    env = torchax.default_env()
    seen: dict[tuple[object, ...], jax.Array] = {}
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
    program: Any, tensors: Mapping[str, object], dims: Mapping[str, tuple[DimSize, ...]]
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
