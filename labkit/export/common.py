"""What the export front ends share: dynamic-dimension specs, input names, dtypes, errors.

Also the helpers the export lessons share (:func:`max_rel_error`, :func:`main_signature`,
:func:`string_keys` / :func:`int_keys`).
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import jax
import numpy as np
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey
from numpy.typing import ArrayLike

from labkit.core.types import PyTree

if TYPE_CHECKING:  # an int or a symbolic dimension; jax.export has no public name for it
    from jax._src.export.shape_poly import DimSize

Spec = str | tuple[str, Sequence[str]]  # "b, t" or ("b, t", ["t <= 64"])

BUILTIN_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # jax.export's own; plugins may add more


class TrainingModeError(ValueError):
    """A module is in training mode: its export would compute something else than inference."""


class UnsupportedModelError(ValueError):
    """The model cannot be exported as it is; the message says what to change."""


class DtypeError(UnsupportedModelError):
    """Export would change a dtype and lose precision (float64 with x64 off); the message says
    how to keep it or how to change it on purpose."""


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


# ---------------------------------------------------------------------------------------
# Platforms


def _known_platforms() -> set[str]:
    """Platform names jax.export can lower for: the built-in ones and registered plugins."""
    try:
        from jax._src import xla_bridge  # no public list; plugins register here

        known = set(xla_bridge.known_platforms())
    except (ImportError, AttributeError):
        known = set()
    return (known | set(BUILTIN_PLATFORMS)) - {"gpu", "proxy"}  # an alias, a remote client


def export_platforms(platforms: Sequence[str] | str | None) -> tuple[str, ...] | None:
    """``platforms`` as a tuple, each name checked now (jax.export takes any string and the
    artifact fails only when called); ``None`` stays ``None`` (this machine's platform)."""
    if platforms is None:
        return None
    names = (platforms,) if isinstance(platforms, str) else tuple(platforms)
    if not names:
        raise ValueError("platforms is empty: name at least one, e.g. ('cuda', 'cpu')")
    known = _known_platforms()
    for name in names:
        if name == "gpu":
            raise ValueError(
                "platforms names 'gpu', an alias jax.export does not lower for: name the GPU "
                "kind, 'cuda' (NVIDIA) or 'rocm' (AMD)"
            )
        if not isinstance(name, str) or name not in known:
            close = difflib.get_close_matches(str(name).lower(), sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"unknown platform {name!r}{hint}: jax.export lowers for {sorted(known)}; "
                "an artifact for a misspelled platform would fail only when called"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"platforms {names} names one platform twice: list each once")
    return names


# ---------------------------------------------------------------------------------------
# Dtypes

_LOSSY = {np.dtype(np.float64): "float32", np.dtype(np.complex128): "complex64"}


def x64_enabled() -> bool:
    """Whether JAX keeps 64-bit types here (``jax_enable_x64``)."""
    return bool(jax.config.jax_enable_x64)


def _listing(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def dtype_changes(dtypes: Mapping[str, np.dtype], fix: str) -> list[str]:
    """The dtype changes JAX would make to these named values (``"ids: int64 -> int32"``).

    With x64 off, JAX computes float64 in float32: that is refused with :class:`DtypeError`
    (``fix`` says how to cast on purpose; the message also says how to keep float64). The
    int64 -> int32 change (token ids) is returned, for the sidecar.
    """
    if x64_enabled():
        return []
    lossy = [f"{n} ({np.dtype(d)})" for n, d in dtypes.items() if np.dtype(d) in _LOSSY]
    if lossy:
        raise DtypeError(
            f"{_listing(lossy)}: JAX runs with x64 off here, so the artifact would compute in "
            "float32 without a word (7 significant digits instead of 16). What to do: "
            f"{fix}; or keep float64: export with x64 on (with jax.enable_x64(True): "
            "...export...); that artifact takes and returns float64 (and int64), "
            "labkit.export.call and run_in_fresh_process turn x64 on to run it, and a plain "
            "caller needs jax.config.update('jax_enable_x64', True)"
        )
    changes = []
    for name, dtype in dtypes.items():
        canonical = jax.dtypes.canonicalize_dtype(dtype)
        if canonical != np.dtype(dtype):
            changes.append(f"{name}: {np.dtype(dtype)} -> {canonical}")
    return changes


def explicit_dtype(x: object) -> np.dtype | None:
    """The dtype an array-like states (``None`` for Python scalars: JAX types them weakly)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return None
    try:
        return np.dtype(dtype)
    except TypeError:  # a framework's own dtype object (tf.DType, torch.dtype)
        return None


def canonical_dtype(x: ArrayLike | jax.ShapeDtypeStruct) -> np.dtype:
    """The dtype JAX gives ``x`` (int64 becomes int32 unless x64 is on, as in ``jax.jit``)."""
    return jax.dtypes.canonicalize_dtype(x.dtype if hasattr(x, "dtype") else np.result_type(x))


# ---------------------------------------------------------------------------------------
# Input names, pytree paths and dynamic specs


def slash_path(name: str, path: Sequence[object]) -> str:
    """``params/0/w`` for the leaf ``params['0']['w']`` (how ``dynamic`` names a leaf)."""
    parts = [name]
    for key in path:
        if isinstance(key, DictKey):
            parts.append(str(key.key))
        elif isinstance(key, SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, GetAttrKey):
            parts.append(key.name)
        elif isinstance(key, FlattenedIndexKey):
            parts.append(str(key.key))
        else:
            parts.append(str(key))
    return "/".join(parts)


def named_leaves(named: Mapping[str, PyTree]) -> dict[str, tuple[str, PyTree]]:
    """Every leaf of named inputs: ``{"params/w": ("params['w']", leaf), "x": ("x", x)}``."""
    out: dict[str, tuple[str, PyTree]] = {}
    for name, tree in named.items():
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            out[slash_path(name, path)] = (name + jax.tree_util.keystr(path), leaf)
    return out


def match_dynamic(
    dynamic: Mapping[str, Spec], leaves: Mapping[str, tuple[str, PyTree]]
) -> dict[str, Spec]:
    """``dynamic`` keyed by leaf path (``params/scale``); ``params['scale']`` is accepted too."""
    by_keystr = {keystr: slash for slash, (keystr, _) in leaves.items()}
    out: dict[str, Spec] = {}
    for key, spec in dynamic.items():
        slash = key if key in leaves else by_keystr.get(key)
        if slash is None:
            inside = sorted(s for s in leaves if s.startswith(f"{key}/"))
            if inside:
                raise ValueError(
                    f"dynamic names {key!r}, which holds several arrays: name each leaf by its "
                    f"path, e.g. {_listing(inside, 4)}"
                )
            more = f" and {len(leaves) - 12} more" if len(leaves) > 12 else ""
            raise ValueError(
                f"dynamic names {key!r}, which is not an array input; the array inputs are "
                f"{sorted(leaves)[:12]}{more} (a leaf inside a dict or list is named by its "
                "path: params/scale)"
            )
        out[slash] = spec
    return out


def split_spec(spec: Spec, name: str) -> tuple[list[str], list[str]]:
    """A spec's per-axis entries and its constraints (``("b, t", ["t <= 64"])``)."""
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


_BOUND = re.compile(r"\s*(?:([A-Za-z_]\w*)\s*(<=|>=)\s*(\d+)|(\d+)\s*(<=|>=)\s*([A-Za-z_]\w*))\s*")


def parse_bound(text: str) -> tuple[str, str, int] | None:
    """``"t <= 64"`` -> ``("t", "max", 64)``; ``"2 <= b"`` -> ``("b", "min", 2)``; else None."""
    m = _BOUND.fullmatch(text)
    if m is None:
        return None
    if m[1] is not None:
        return m[1], "max" if m[2] == "<=" else "min", int(m[3])
    return m[6], "min" if m[5] == "<=" else "max", int(m[4])


def symbolic_shapes(
    shapes: Mapping[str, tuple[int | None, ...]], dynamic: Mapping[str, Spec]
) -> dict[str, tuple[DimSize, ...]]:
    """Each named input's shape with its dynamic dimensions as symbols of one scope.

    ``dynamic`` maps an input name to one entry per axis: a symbol (``"b"``), an
    expression (``"2*b"``), an integer, or ``"_"`` to keep the example's size; a
    ``(spec, constraints)`` pair bounds symbols (``("b, t", ["t <= 64"])``). Symbols with
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
        for entry, size in zip(entries, shapes[name], strict=True):
            if entry == "_" and size is None:
                raise ValueError(
                    f"dynamic[{name!r}] = {spec!r}: '_' keeps the example's size, but {name} "
                    f"has no size on that axis (shape {shapes[name]}): give a symbol or a number"
                )
        dims[name] = [str(s) if e == "_" else e for e, s in zip(entries, shapes[name], strict=True)]
        constraints += more
    flat = [e for entries in dims.values() for e in entries]
    try:
        symbols = jax.export.symbolic_shape(", ".join(flat), constraints=constraints)
    except ValueError as err:
        raise ValueError(
            f"jax.export.symbolic_shape rejects dynamic={dict(dynamic)!r}: {err}. A constraint "
            "is 'e1 <= e2', 'e1 >= e2' or 'e1 == e2' over symbols and integers ('t <= 64')"
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


def leaf_names(
    names: list[str], arg_specs: list[PyTree], kwarg_specs: dict[str, PyTree]
) -> list[str]:
    """A readable name per input leaf: the argument's name, plus the path inside a pytree."""
    out = []
    for name, tree in [*zip(names, arg_specs, strict=True), *sorted(kwarg_specs.items())]:
        paths = jax.tree_util.tree_flatten_with_path(tree)[0]
        out += [name + jax.tree_util.keystr(p) for p, _ in paths]
    return out


# ---------------------------------------------------------------------------------------
# Calls


def signature_of(fn: object, skip_self: bool = False) -> inspect.Signature | None:
    """``inspect.signature`` of ``fn`` (without ``self``), or None where Python has none."""
    try:
        sig = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())[1:] if skip_self else list(sig.parameters.values())
    empty = inspect.Parameter.empty  # names and defaults only: what a message should show
    return sig.replace(
        parameters=[p.replace(annotation=empty) for p in params], return_annotation=empty
    )


def check_call(
    what: str, sig: inspect.Signature | None, args: Sequence[object], kwargs: Mapping[str, object]
) -> inspect.BoundArguments | None:
    """Bind example inputs to the model's signature; a mismatch shows the signature."""
    if sig is None:
        return None
    try:
        return sig.bind(*args, **kwargs)
    except TypeError as err:
        given = [f"{len(args)} positional"] + [f"{k}=" for k in kwargs]
        raise TypeError(
            f"the example inputs ({', '.join(given)}) do not fit {what}{sig}: {err}. Pass "
            "them as you would call it"
        ) from None


def source_of(wrapper: object, target: object, names: Sequence[str]) -> None:
    """Make jax name ``target`` (the user's code) in errors while tracing ``wrapper``.

    ``__wrapped__`` gives jax the source location; ``__signature__`` keeps the wrapper's own
    argument names for jax's messages (``inspect.signature`` stops there).
    """
    unique = [
        n if n.isidentifier() and names.count(n) == 1 else f"arg{i}" for i, n in enumerate(names)
    ]
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in unique]
    params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    wrapper.__wrapped__ = target  # type: ignore[attr-defined]
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
