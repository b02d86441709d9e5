"""What the export front ends share: dynamic-dimension specs, input names, dtypes, errors.

Also the helpers the export lessons share (:func:`max_rel_error`, :func:`main_signature`,
:func:`string_keys` / :func:`int_keys`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import jax
import numpy as np
from numpy.typing import ArrayLike

from labkit.core.types import PyTree

if TYPE_CHECKING:  # an int or a symbolic dimension; jax.export has no public name for it
    from jax._src.export.shape_poly import DimSize

Spec = str | tuple[str, Sequence[str]]  # "b, t" or ("b, t", ["t <= 64"])


class TrainingModeError(ValueError):
    """A module is in training mode: its export would compute something else than inference."""


class UnsupportedModelError(ValueError):
    """The model cannot be exported as it is; the message says what to change."""


def max_rel_error(actual: ArrayLike, reference: ArrayLike) -> float:
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


def string_keys(tree: PyTree) -> PyTree:
    """Nested dicts with every key a string (serialization wants ``"0"``, not ``0``)."""
    if isinstance(tree, dict):
        return {str(k): string_keys(v) for k, v in tree.items()}
    return tree


def int_keys(tree: PyTree) -> PyTree:
    """Undo :func:`string_keys`: keys made of digits become ints again (``nnx.List`` indices)."""
    if isinstance(tree, dict):
        return {
            (int(k) if isinstance(k, str) and k.isdigit() else k): int_keys(v)
            for k, v in tree.items()
        }
    return tree


def split_spec(spec: Spec, name: str) -> tuple[list[str], list[str]]:
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
) -> dict[str, tuple[DimSize, ...]]:
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
        entries, more = split_spec(spec, name)
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


def is_array(x: object) -> bool:
    return isinstance(x, np.ndarray | np.generic | jax.Array | jax.ShapeDtypeStruct)


def has_arrays(tree: PyTree) -> bool:
    return any(is_array(leaf) for leaf in jax.tree.leaves(tree))


def canonical_dtype(x: ArrayLike | jax.ShapeDtypeStruct) -> np.dtype:
    """The dtype JAX gives ``x`` (int64 becomes int32 unless x64 is on, as in ``jax.jit``)."""
    return jax.dtypes.canonicalize_dtype(x.dtype if hasattr(x, "dtype") else np.result_type(x))


def platform_tuple(platforms: Sequence[str] | None) -> tuple[str, ...] | None:
    if platforms is None:
        return None
    if isinstance(platforms, str):
        return (platforms,)
    return tuple(platforms)


def leaf_names(
    names: list[str], arg_specs: list[PyTree], kwarg_specs: dict[str, PyTree]
) -> list[str]:
    """A readable name per input leaf: the argument's name, plus the path inside a pytree."""
    out = []
    for name, tree in [*zip(names, arg_specs, strict=True), *sorted(kwarg_specs.items())]:
        paths = jax.tree_util.tree_flatten_with_path(tree)[0]
        out += [name + jax.tree_util.keystr(p) for p, _ in paths]
    return out
