"""Export a PyTorch module (:func:`from_torch`): ``torch.export``, then torchax's JAX interpreter.

torch and torchax are imported inside the functions: the lab's main environment has no torch.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
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
    check_call,
    dtype_changes,
    export_platforms,
    leaf_names,
    parse_bound,
    signature_of,
    source_of,
    split_spec,
    symbolic_shapes,
)

if TYPE_CHECKING:
    from jax._src.export.shape_poly import DimSize

# torch and torchax objects stay Any here: the main environment (and its mypy) has no torch.

NO_TORCH = (
    "labkit.export.from_torch needs PyTorch and torchax, which this Python ({python}) does not "
    "have: run it in the lab's PyTorch environment, .venv-torch (make setup-torch creates it; "
    "in Jupyter pick the kernel 'Python 3 (OpenXLA lab + PyTorch)', labkit-torch)"
)


def _import_torch() -> tuple[Any, Any]:
    """torch and torchax, or an error that says which environment has them."""
    import sys

    try:
        import torch
        import torchax
        import torchax.export
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(NO_TORCH.format(python=sys.executable), name=err.name) from err
    return torch, torchax


def _torch_dims(
    shapes: Mapping[str, tuple[int, ...]], dynamic: Mapping[str, Spec]
) -> tuple[dict[str, dict[int, Any]], dict[str, list[str]], dict[str, list[str]]]:
    """``torch.export`` dynamic shapes (one ``Dim`` per symbol), each input's axes and bounds."""
    import torch

    bounds: dict[str, dict[str, int]] = {}
    axes: dict[str, list[str]] = {}
    constraints: dict[str, list[str]] = {}
    for name, spec in dynamic.items():
        entries, texts = split_spec(spec, name)
        if name not in shapes or len(entries) != len(shapes[name]):
            raise ValueError(
                f"dynamic[{name!r}] = {spec!r} does not fit the tensor inputs "
                f"{ {k: v for k, v in shapes.items()} }: name a tensor input, one entry per axis"
            )
        axes[name], constraints[name] = entries, texts
        for text in texts:
            bound = parse_bound(text)
            if bound is None:
                raise ValueError(
                    f"constraint {text!r}: from_torch takes bounds on one symbol, 't <= 64' or "
                    "'t >= 2' (torch.export.Dim's max and min)"
                )
            bounds.setdefault(bound[0], {})[bound[1]] = bound[2]
    symbols = {e for entries in axes.values() for e in entries if e.isidentifier() and e != "_"}
    unknown = sorted(set(bounds) - symbols)
    if unknown:
        raise ValueError(f"constraints bound {unknown}, which no dynamic entry uses as a symbol")
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
    return out, axes, constraints


_DIM_FIX = re.compile(r"^\s*(\w+)\s*=\s*Dim\(\s*'(\w+)'\s*(.*)\)\s*$")
_CONST_FIX = re.compile(r"^\s*(\w+)\s*=\s*(\d+)\s*$")
_SAME_FIX = re.compile(r"^\s*(\w+)\s*=\s*([A-Za-z_]\w*)\s*$")


def _suggested_fixes(text: str) -> list[str]:
    """The lines under torch.export's "Suggested fixes:" (``t = Dim('t', max=64)``)."""
    if "Suggested fixes:" not in text:
        return []
    lines = text.split("Suggested fixes:", 1)[1].splitlines()
    out = []
    for line in lines[1:] if lines and not lines[0].strip() else lines:
        if not line.strip():
            break
        out.append(line.strip())
    return out


def _spec_text(axes: Mapping[str, list[str]], constraints: Mapping[str, list[str]]) -> str:
    """``{'ids': ('b, t', ['t <= 64'])}``: a ``dynamic`` argument, as the user would write it."""
    items = []
    for name, entries in axes.items():
        spec = ", ".join(entries)
        used = [c for c in constraints.get(name, []) if c]
        items.append(f"{name!r}: {(spec, used)!r}" if used else f"{name!r}: {spec!r}")
    return "{" + ", ".join(items) + "}"


def _translate_fixes(
    fixes: list[str],
    axes: Mapping[str, list[str]],
    constraints: Mapping[str, list[str]],
    shapes: Mapping[str, tuple[int, ...]],
) -> list[str]:
    """torch's suggested fixes in the kit's ``dynamic`` spec, where they translate."""
    given = _spec_text(axes, constraints)
    axes = {k: list(v) for k, v in axes.items()}
    constraints = {k: list(v) for k, v in constraints.items()}
    notes = []
    for fix in fixes:
        if m := _DIM_FIX.match(fix):
            symbol, args = m[1], m[3]
            for key, op in (("min", ">="), ("max", "<=")):
                if found := re.search(rf"\b{key}\s*=\s*(\d+)", args):
                    for name, entries in axes.items():
                        if symbol in entries:
                            kept = [c for c in constraints[name] if not _bounds(c, symbol, key)]
                            constraints[name] = [*kept, f"{symbol} {op} {found[1]}"]
                            break
        elif m := _CONST_FIX.match(fix):
            symbol, size = m[1], int(m[2])
            example = [
                shapes[n][i] for n, e in axes.items() for i, s in enumerate(e) if s == symbol
            ]
            if size in (0, 1) and size in example:
                notes.append(
                    f"PyTorch specializes sizes 0 and 1: give example inputs of size >= 2 on "
                    f"{symbol}"
                )
                continue
            notes.append(f"the model fixes {symbol} to {size}: write {size} (or '_') there")
            axes = {n: [str(size) if s == symbol else s for s in e] for n, e in axes.items()}
        elif m := _SAME_FIX.match(fix):
            old, new = m[1], m[2]
            notes.append(f"{old} and {new} are one dimension: use the symbol {new} for both")
            axes = {n: [new if s == old else s for s in e] for n, e in axes.items()}
    fixed = _spec_text(axes, constraints)
    return [*notes, f"dynamic={fixed}"] if fixed != given else notes


def _bounds(constraint: str, symbol: str, key: str) -> bool:
    parsed = parse_bound(constraint)
    return parsed is not None and parsed[0] == symbol and parsed[1] == key


def _torch_error(
    err: Exception,
    axes: Mapping[str, list[str]],
    constraints: Mapping[str, list[str]],
    shapes: Mapping[str, tuple[int, ...]],
) -> UnsupportedModelError:
    """What to do about an error torch.export raised: torch's own suggestion, in kit terms."""
    text = f"{type(err).__name__}: {err}"
    first = text.strip().splitlines()[0][:300]
    detail = list(
        dict.fromkeys(s.strip() for s in text.splitlines()[1:] if s.strip().startswith("- "))
    )
    fixes = _suggested_fixes(text)
    if "Cache" in text:
        fix = (
            "the model returns a KV-cache object, which is not a tensor: export with "
            "use_cache=False (pass it as a keyword or set model.config.use_cache = False)"
        )
    elif fixes:
        translated = _translate_fixes(fixes, axes, constraints, shapes)
        fix = f"torch.export suggests {'; '.join(fixes)}"
        if translated:
            fix += f". In from_torch's terms: {'; '.join(translated)}"
    else:
        given = ", ".join(f"{k} {list(v)}" for k, v in shapes.items())
        fix = (
            f"see the first line above (the example inputs were {given}: a shape error names "
            "them); torch.export.draft_export(...) lists every problem"
        )
    return UnsupportedModelError("\n".join([first, *detail[:4], f"What to do: {fix}"]))


class _DropErrors(logging.Filter):
    """Drop torch's ERROR log lines (a traceback it then raises): the error says it once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and record.name.startswith("torch"))


@contextlib.contextmanager
def _quiet_torch_errors() -> Iterator[None]:
    """torch's loggers print each failed fake-tensor op as a traceback before raising."""
    loggers = [
        logger
        for name, logger in logging.Logger.manager.loggerDict.items()
        if (name == "torch" or name.startswith("torch.")) and isinstance(logger, logging.Logger)
    ]
    handlers = {h for logger in [*loggers, logging.getLogger()] for h in logger.handlers}
    drop = _DropErrors()
    for handler in handlers:
        handler.addFilter(drop)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(drop)


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


def _refuse_training(model: Any) -> None:
    """Every submodule in eval mode, or a TrainingModeError that names the ones that are not."""
    training = [name or "(the model itself)" for name, m in model.named_modules() if m.training]
    if not training:
        return
    kinds = {name: type(m).__name__ for name, m in model.named_modules()}
    listed = ", ".join(f"{n} ({kinds.get(n, type(model).__name__)})" for n in training[:6])
    more = f" and {len(training) - 6} more" if len(training) > 6 else ""
    if model.training:
        lead = f"{type(model).__name__} is in training mode"
    else:
        lead = f"{type(model).__name__} is in eval mode but some submodules are not"
    raise TrainingModeError(
        f"{lead} (dropout active, batch norm on batch statistics): {listed}{more}. Call "
        "model.eval() before exporting (it sets every submodule; a later .train() on one "
        "undoes it there)"
    )


def _float64_nodes(program: Any) -> list[str]:
    """Graph values torch.export computed in float64, with the user's line that made them."""
    import torch

    wide = (torch.float64, torch.complex128)
    found = []
    for node in program.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype in wide:
            trace = (node.meta.get("stack_trace") or "").strip().splitlines()
            line = next((t.strip() for t in reversed(trace) if t.strip().startswith("File")), "")
            m = re.match(r'File "(.*)", line (\d+), in (\w+)', line)
            found.append(f"{node.name} at {m[1]}:{m[2]} in {m[3]}" if m else node.name)
    return found


def from_torch(
    model: Any,
    args: object,
    kwargs: Mapping[str, object] | None = None,
    dynamic: Mapping[str, Spec] | None = None,
    platforms: Sequence[str] | None = None,
) -> Exported:
    """Export a PyTorch module with ``torch.export`` and torchax; call it as the module.

    ``args`` (a tensor or a tuple) and ``kwargs`` are example inputs: tensors become the
    artifact's inputs with their dtypes and names (int64 ids arrive as int32 unless JAX runs
    with x64, recorded in the sidecar; float64 is refused unless x64 is on); other values
    (``use_cache=False``) are fixed. ``dynamic`` maps input names to symbols, bounds
    included (``{"input_ids": ("b, t", ["t <= 64"]), "attention_mask": "b, t"}``), one scope
    for all; torch.export's suggested fixes come back in that form. The module and every
    submodule must be in eval mode. The weights go inside the artifact, each tied weight once.
    """
    torch, torchax = _import_torch()
    lowering = export_platforms(platforms)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"from_torch takes a torch.nn.Module, got {type(model).__name__}")
    _refuse_training(model)
    args = tuple(args) if isinstance(args, tuple | list) else (args,)
    kwargs = dict(kwargs or {})
    what = f"{type(model).__name__}.forward"
    bound = check_call(what, signature_of(model.forward), args, kwargs)
    arguments = bound.arguments if bound is not None else dict(kwargs)
    for name, value in arguments.items():
        if not isinstance(value, torch.Tensor) and any(
            isinstance(leaf, torch.Tensor) for leaf in jax.tree.leaves(value)
        ):
            raise UnsupportedModelError(
                f"{what}'s input {name!r} is a {type(value).__name__} holding tensors: "
                "from_torch takes tensors as inputs; wrap the model in a Module whose forward "
                "takes each tensor as its own argument"
            )
    if any(not isinstance(a, torch.Tensor) for a in args):
        raise UnsupportedModelError(
            "from_torch takes tensors as positional inputs; pass other values as keywords "
            "(they are fixed at export time)"
        )
    tensors = {k: v for k, v in arguments.items() if isinstance(v, torch.Tensor)}
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    torch_dims, axes, constraints = _torch_dims(shapes, dynamic or {})
    dynamic_shapes = {k: torch_dims.get(k) for k in arguments}
    weights_dtypes = {
        **{f"parameter {name}": t.dtype for name, t in model.named_parameters()},
        **{f"buffer {name}": t.dtype for name, t in model.named_buffers()},
    }
    _torch_dtypes(torch, {**{f"input {k}": v.dtype for k, v in tensors.items()}, **weights_dtypes})
    try:
        with _quiet_torch_errors():
            program = torch.export.export(
                model, args, kwargs, dynamic_shapes=dynamic_shapes if torch_dims else None
            )
            _, states, interpret = torchax.export.exported_program_to_jax(program, export_raw=True)
    except Exception as err:  # torch.export and torchax raise many types; each explained
        raise _torch_error(err, axes, constraints, shapes) from err
    _torch_dtypes(torch, {f"value {n}": torch.float64 for n in _float64_nodes(program)})
    weights = _dedup_weights(states)
    in_spec, out_spec = program.call_spec.in_spec, program.call_spec.out_spec
    kw_order = list(in_spec.children()[1].context)
    constants = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}

    def fn(*a: jax.Array, **k: jax.Array) -> PyTree:
        flat = [*a, *[k[n] if n in k else constants[n] for n in kw_order]]
        return _jax_tree(list(interpret(weights, flat)), out_spec)

    fn.__name__ = type(model).__name__
    all_dims = symbolic_shapes(
        shapes, {k: (", ".join(v), constraints.get(k, [])) for k, v in axes.items()}
    )
    program_bounds = _range_constraints(program, tensors, all_dims)
    if program_bounds:  # bounds torch.export proved (e.g. t <= max_position_embeddings)
        merged = sorted({*program_bounds, *(c for cs in constraints.values() for c in cs)})
        all_dims = symbolic_shapes(shapes, {k: (", ".join(v), merged) for k, v in axes.items()})

    def spec(name: str, t: Any) -> jax.ShapeDtypeStruct:
        dtype = canonical_dtype(np.empty(0, torchax.ops.mappings.t2j_dtype(t.dtype)))
        return jax.ShapeDtypeStruct(all_dims.get(name, tuple(t.shape)), dtype)

    positional = list(arguments)[: len(args)]
    arg_specs = [spec(n, t) for n, t in zip(positional, args, strict=True)]
    kwarg_specs = {k: spec(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    changes = [
        f"{name}: {str(t.dtype).removeprefix('torch.')} -> {s.dtype}"
        for name, t, s in [
            *zip(positional, args, arg_specs, strict=True),
            *((k, kwargs[k], s) for k, s in kwarg_specs.items()),
        ]
        if np.dtype(torchax.ops.mappings.t2j_dtype(t.dtype)) != s.dtype
    ]
    source_of(fn, model.forward, positional)  # jax's tracing errors name forward
    with _quiet_torch_errors():
        exp = jax.export.export(jax.jit(fn), platforms=lowering)(*arg_specs, **kwarg_specs)
    return remember(
        exp,
        source=f"torch {torch.__version__} + torchax {torchax.__version__}",
        input_names=leaf_names(positional, arg_specs, kwarg_specs),
        dtype_changes=changes,
    )


def _torch_dtypes(torch: Any, dtypes: Mapping[str, Any]) -> None:
    """Refuse float64 tensors while x64 is off (see :func:`dtype_changes`)."""
    wide = {torch.float64: np.float64, torch.complex128: np.complex128}
    dtype_changes(
        {name: np.dtype(wide[d]) for name, d in dtypes.items() if d in wide},
        fix="convert the model and its inputs to float32 (model.float(), x.float()) and "
        "remove float64 casts from forward",
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
