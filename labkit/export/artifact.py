"""The export artifact: a ``jax.export`` file any JAX reads, a JSON sidecar, checks, a fresh run.

A saved artifact is two files:

- ``model.jaxexport``: exactly ``exported.serialize()``. Nothing is added, so a process that
  has only ``jax`` reads it with ``jax.export.deserialize(open(path, "rb").read())``;
- ``model.jaxexport.json``, the sidecar: the file's SHA-256 and size, the jax and jaxlib
  versions that wrote it, the platforms, the input and output specs (names, shapes with
  symbols, dtypes, the symbols' bounds, the call structure), every dtype the export changed
  (int64 -> int32), whether it needs x64, the creation date and the source framework.

:func:`load` checks the digest against the sidecar before deserializing (a flipped byte can
still deserialize and run, with a wrong result) and says what is wrong when the sidecar is
missing or does not match. The digest detects corruption, not origin: whoever can replace the
artifact can write a matching sidecar beside it, so a swapped pair loads. To know who made an
artifact, sign it (a detached signature checked with a key you trust, e.g. Sigstore's
``cosign sign-blob`` / ``verify-blob`` or GPG) and verify the signature before :func:`load`.

:func:`check_platform`, :func:`check_inputs` and :func:`call` explain a wrong platform or a
wrong input before XLA sees it, and accept exactly what ``Exported.call`` accepts (int64 ids,
say, which JAX canonicalizes to int32). :func:`run_in_fresh_process` runs a saved file in a
new Python that imports only jax and numpy; :func:`describe` says what an artifact promises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import weakref
from collections import Counter
from pathlib import Path
from typing import Any, NotRequired, TypedDict, Unpack

import jax
import jaxlib
import numpy as np
from jax.export import Exported
from jax.tree_util import PyTreeDef

from labkit.core.types import PyTree
from labkit.xla.hlo import op_histogram

SIDECAR_FORMAT = "labkit-export-sidecar/1"  # the "format" field of every sidecar
SIDECAR_SUFFIX = ".json"  # model.jaxexport -> model.jaxexport.json


class ArtifactError(ValueError):
    """A saved artifact cannot be used: missing, not one, corrupted or of another version."""


class PlatformMismatch(RuntimeError):
    """The artifact was not exported for the platform it is asked to run on."""


class InputShapeError(ValueError):
    """Inputs do not match the exported types (structure, rank, dtype, size or bound)."""


class LeafSpec(TypedDict):
    """One input or output leaf of an artifact, as its sidecar lists it."""

    name: str  # the argument's name and the path inside it, e.g. "params['w']"
    shape: str  # e.g. "['b', '128']": symbols by name
    dtype: str


class Digest(TypedDict):
    """What :func:`verify` checks a file against."""

    bytes: int
    sha256: str


class WeightsFile(Digest):
    """The sidecar's entry for weights saved beside the artifact."""

    file: str
    leaves: int


class Sidecar(Digest):
    """The JSON written beside an artifact (``model.jaxexport.json``)."""

    format: str  # SIDECAR_FORMAT
    file: str
    jax: str
    jaxlib: str
    created: str  # ISO-8601, UTC
    source: str  # the framework, e.g. "jax" or "torch 2.9 + torchax 0.0.7"
    platforms: list[str]
    calling_convention_version: int
    nr_devices: int
    vjp_order: int
    inputs: list[LeafSpec]
    outputs: list[LeafSpec]
    in_tree: str  # how the inputs are passed: positional and keyword pytrees
    bounds: dict[str, list[float]]  # symbol -> [low, high]
    dtype_changes: list[str]  # e.g. "input_ids: int64 -> int32" (JAX without x64)
    x64: bool  # the artifact takes or returns 64-bit arrays: callers need jax_enable_x64
    weights: NotRequired[WeightsFile]


# ---------------------------------------------------------------------------------------
# Provenance: what the exporter knew (source framework, input names), kept for save()


class Provenance(TypedDict, total=False):
    """What an exporter knew about an :class:`Exported` that JAX does not keep."""

    source: str  # the framework, written to the sidecar
    input_names: list[str]  # one per input leaf
    weights: PyTree  # the first input, to save beside the artifact (weights_outside=True)
    dtype_changes: list[str]  # e.g. "input_ids: int64 -> int32", written to the sidecar


_PROVENANCE: dict[int, tuple[weakref.ref[Exported], Provenance]] = {}


def remember(exported: Exported, **facts: Unpack[Provenance]) -> Exported:
    """Attach ``facts`` (``source``, ``input_names``...) to ``exported`` for :func:`save`."""
    key = id(exported)
    _PROVENANCE[key] = (weakref.ref(exported, lambda _: _PROVENANCE.pop(key, None)), facts)
    return exported


def provenance(exported: Exported) -> Provenance:
    """What :func:`remember` attached to ``exported`` (empty for a plain ``jax.export``)."""
    ref, facts = _PROVENANCE.get(id(exported), (None, Provenance()))
    return Provenance(**facts) if ref is not None and ref() is exported else Provenance()


@dataclasses.dataclass(frozen=True)
class Artifact:
    """An :class:`jax.export.Exported` read by :func:`load`, with its sidecar."""

    exported: Exported
    meta: Sidecar
    path: Path
    weights: PyTree = None  # the first input, when it was saved beside (weights_outside=True)

    def call(self, *args: PyTree, **kwargs: PyTree) -> PyTree:
        """Check the platform and the inputs (clear errors), then run it here.

        Weights saved beside the artifact are passed in first.
        """
        if self.weights is not None:
            args = (self.weights, *args)
        return call(self, *args, **kwargs)


def _exported(x: Exported | Artifact) -> Exported:
    return x.exported if isinstance(x, Artifact) else x


def _require_exported(x: object, what: str) -> Exported:
    if isinstance(x, Artifact):
        return x.exported
    if not isinstance(x, Exported):
        raise TypeError(
            f"{what} takes a jax.export.Exported (from labkit.export.from_jax, from_torch, "
            f"from_tf or jax.export.export), got {type(x).__name__}: {x!r:.60}"
        )
    return x


def _path(path: object, what: str) -> Path:
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise TypeError(
            f"{what} takes a file path (str or pathlib.Path), got {type(path).__name__}: "
            f"{path!r:.60}; for example 'model.jaxexport'"
        )
    return Path(path)


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """The sidecar of an artifact: ``model.jaxexport`` -> ``model.jaxexport.json``."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def weights_path(path: str | os.PathLike[str]) -> Path:
    """Weights saved beside an artifact: ``model.jaxexport`` -> ``model.jaxexport.weights.npz``."""
    path = Path(path)
    return path.with_name(path.name + ".weights.npz")


# ---------------------------------------------------------------------------------------
# Specs and bounds


def _is_64bit(dtype: object) -> bool:
    """float64, int64, uint64 or complex128 (what JAX keeps only with x64 on)."""
    kind, size = getattr(dtype, "kind", None), getattr(dtype, "itemsize", None)
    return (kind in ("f", "i", "u") and size == 8) or (kind == "c" and size == 16)


def needs_x64(exported: Exported | Artifact) -> bool:
    """Whether the artifact takes or returns 64-bit arrays (exported with x64 on)."""
    avals = [*_exported(exported).in_avals, *_exported(exported).out_avals]
    return any(_is_64bit(a.dtype) for a in avals)


def _x64_for(exported: Exported | Artifact) -> contextlib.AbstractContextManager[object]:
    """x64 on while running an artifact that needs it (it was exported with x64)."""
    return jax.enable_x64(True) if needs_x64(exported) else contextlib.nullcontext()


def symbol_bounds(exported: Exported | Artifact) -> dict[str, tuple[float, float]]:
    """Each symbolic dimension of the inputs by name, with the bounds JAX can prove for it.

    JAX does not keep a symbol's constraints after deserializing: a loaded artifact's own
    bounds come from its sidecar (:func:`describe` and :func:`check_inputs` use them).
    """
    bounds: dict[str, tuple[float, float]] = {}
    for aval in _exported(exported).in_avals:
        for dim in aval.shape:
            if jax.export.is_symbolic_dim(dim) and str(dim).isidentifier():
                lo, hi = jax.export.symbolic_dim_bounds(dim)
                bounds[str(dim)] = (float(lo), float(hi))
    if isinstance(exported, Artifact):
        bounds.update({k: (float(v[0]), float(v[1])) for k, v in exported.meta["bounds"].items()})
    return bounds


def _leaf_paths(tree: PyTreeDef) -> list[str]:
    """``jax.tree_util.keystr`` of every leaf of a treedef (``[0][1]['ids']``)."""
    dummy = jax.tree.unflatten(tree, list(range(tree.num_leaves)))
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(dummy)[0]]


def input_specs(exported: Exported) -> list[LeafSpec]:
    """``{"name", "shape", "dtype"}`` per input leaf; names from the exporter where known."""
    names = provenance(exported).get("input_names") or _leaf_paths(exported.in_tree)
    return [
        {"name": n, "shape": str(list(map(str, a.shape))), "dtype": str(a.dtype)}
        for n, a in zip(names, exported.in_avals, strict=True)
    ]


def output_specs(exported: Exported) -> list[LeafSpec]:
    """``{"name", "shape", "dtype"}`` per output leaf (names are pytree paths)."""
    names = _leaf_paths(exported.out_tree)
    return [
        {"name": n, "shape": str(list(map(str, a.shape))), "dtype": str(a.dtype)}
        for n, a in zip(names, exported.out_avals, strict=True)
    ]


# ---------------------------------------------------------------------------------------
# save / load


def save(
    exported: Exported,
    path: str | os.PathLike[str],
    vjp_order: int = 0,
    source: str | None = None,
) -> Path:
    """Write ``exported.serialize(vjp_order)`` to ``path`` and its JSON sidecar beside it.

    The file holds the serialized bytes and nothing else (plain ``jax.export.deserialize``
    reads it). ``source`` names the framework; by default the one the exporter recorded.
    """
    exported = _require_exported(exported, "labkit.export.save")
    path = _path(path, "labkit.export.save")
    if path.is_dir():
        raise ArtifactError(
            f"{path} is a folder: give a file name, e.g. {path / 'model.jaxexport'}"
        )
    facts = provenance(exported)
    payload = bytes(exported.serialize(vjp_order=vjp_order))
    meta: Sidecar = {
        "format": SIDECAR_FORMAT,
        "file": path.name,
        "bytes": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "source": source or facts.get("source", "jax"),
        "platforms": list(exported.platforms),
        "calling_convention_version": exported.calling_convention_version,
        "nr_devices": exported.nr_devices,
        "vjp_order": vjp_order,
        "inputs": input_specs(exported),
        "outputs": output_specs(exported),
        "in_tree": str(exported.in_tree),
        "bounds": {k: list(v) for k, v in symbol_bounds(exported).items()},
        "dtype_changes": list(facts.get("dtype_changes", [])),
        "x64": needs_x64(exported),
    }
    weights = facts.get("weights")
    if weights is not None:  # the first input, written beside the artifact
        leaves = [np.asarray(x) for x in jax.tree.leaves(weights)]
        with weights_path(path).open("wb") as f:
            np.savez(f, **{f"a{i}": x for i, x in enumerate(leaves)})  # type: ignore[arg-type]
        blob = weights_path(path).read_bytes()
        meta["weights"] = {
            "file": weights_path(path).name,
            "sha256": hashlib.sha256(blob).hexdigest(),
            "bytes": len(blob),
            "leaves": len(leaves),
        }
    path.write_bytes(payload)
    sidecar_path(path).write_text(json.dumps(meta, indent=1) + "\n")
    return path


def _load_weights(path: Path, meta: WeightsFile, exported: Exported) -> PyTree:
    """The weights saved beside ``path``, checked against the sidecar, as the first input."""
    side = path.with_name(meta["file"])
    if not side.is_file():
        raise ArtifactError(f"{path} needs its weights {side.name} beside it: copy both files")
    verify(side.read_bytes(), meta, str(side))
    with np.load(side) as z:
        leaves = [z[f"a{i}"] for i in range(meta["leaves"])]
    dummy = jax.tree.unflatten(exported.in_tree, list(range(len(exported.in_avals))))
    return jax.tree.unflatten(jax.tree.structure(dummy[0][0]), leaves)


def read_sidecar(path: str | os.PathLike[str]) -> Sidecar:
    """The sidecar of the artifact at ``path``; :class:`ArtifactError` saying what is wrong."""
    side = sidecar_path(path)
    if not side.is_file():
        raise ArtifactError(
            f"{path} has no sidecar {side.name}: its digest cannot be checked. Save it with "
            "labkit.export.save, or (if you trust the file) read it with "
            "jax.export.deserialize(open(path, 'rb').read())"
        )
    try:
        meta: Sidecar = json.loads(side.read_text())  # checked below for its format only
    except (ValueError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{side} is not valid JSON ({err}): save the artifact again") from err
    if not isinstance(meta, dict) or meta.get("format") != SIDECAR_FORMAT:
        raise ArtifactError(
            f"{side} is not a labkit sidecar (no format {SIDECAR_FORMAT!r}): save the "
            "artifact again with labkit.export.save"
        )
    return meta


def verify(payload: bytes, meta: Digest, source: str = "artifact") -> None:
    """Raise :class:`ArtifactError` unless ``payload`` has the sidecar's size and SHA-256."""
    if len(payload) != meta["bytes"]:
        raise ArtifactError(
            f"{source} is truncated or padded: {len(payload)} bytes, its sidecar says "
            f"{meta['bytes']}; copy the file again or re-export it"
        )
    if hashlib.sha256(payload).hexdigest() != meta["sha256"]:
        raise ArtifactError(
            f"{source} is corrupted: its SHA-256 does not match its sidecar; copy the file "
            "again or re-export it"
        )


def load(path: str | os.PathLike[str]) -> Artifact:
    """Read the artifact at ``path``: check size and SHA-256 against the sidecar, deserialize.

    The digest catches a damaged copy, not a forged one: an artifact swapped together with a
    matching sidecar loads. Check a signature first where origin matters.
    """
    path = _path(path, "labkit.export.load")
    if not path.is_file():
        raise ArtifactError(f"no artifact at {path}: export and save one first")
    meta = read_sidecar(path)
    payload = path.read_bytes()
    verify(payload, meta, str(path))
    try:
        exported = jax.export.deserialize(bytearray(payload))
    except (ValueError, TypeError, RuntimeError, IndexError) as err:
        raise ArtifactError(
            f"{path}: jax {jax.__version__} cannot deserialize it (written by jax "
            f"{meta.get('jax')} on {meta.get('created', '?')}): {err}. jax.export reads "
            "artifacts up to 6 months old: re-export with this jax"
        ) from err
    weights = _load_weights(path, meta["weights"], exported) if "weights" in meta else None
    return Artifact(exported, meta, path, weights)


# ---------------------------------------------------------------------------------------
# Checks that agree with Exported.call


def _here() -> str:
    """This process's platform in export's spelling ("cpu", "cuda", "rocm", "tpu")."""
    device = jax.devices()[0]
    if device.platform == "gpu":
        return "rocm" if "rocm" in device.client.platform_version.lower() else "cuda"
    return str(device.platform)


def check_platform(exported: Exported | Artifact, platform: str | None = None) -> str:
    """Raise :class:`PlatformMismatch` unless ``exported`` runs on ``platform`` (default: here)."""
    platforms = tuple(_require_exported(exported, "check_platform").platforms)
    platform = platform or _here()
    if platform not in platforms:
        raise PlatformMismatch(
            f"this artifact was exported for {platforms} but this process runs on "
            f"{platform!r}: re-export with platforms=({', '.join(map(repr, platforms))}, "
            f"{platform!r}) (one artifact can hold several), or run it on a {platforms[0]} machine"
        )
    return platform


def check_inputs(exported: Exported | Artifact, *args: PyTree, **kwargs: PyTree) -> dict[str, int]:
    """Check args against the exported types; return the value of each symbol.

    Accepts what ``Exported.call`` accepts: dtypes are compared after JAX canonicalizes them
    (int64 ids become int32 unless x64 is on). Raises :class:`InputShapeError` naming the
    input, what was expected and what to do.
    """
    exp = _require_exported(exported, "check_inputs")
    if needs_x64(exp) and not jax.config.jax_enable_x64:
        wide = [a.str_short() for a in (*exp.in_avals, *exp.out_avals) if _is_64bit(a.dtype)]
        raise InputShapeError(
            f"this artifact was exported with x64 on (its inputs and outputs include "
            f"{', '.join(wide)}) and x64 is off here: call it with labkit.export.call (which "
            "turns x64 on for the call), inside `with jax.enable_x64(True):`, or after "
            "jax.config.update('jax_enable_x64', True)"
        )
    bounds = symbol_bounds(exported)
    leaves, tree = jax.tree.flatten((args, kwargs))
    expected: Any = exp.in_tree  # jaxlib ships no stubs: mypy cannot compare two PyTreeDefs
    if tree != expected:
        raise InputShapeError(
            f"inputs are structured as {tree}, the export expects {exp.in_tree}: pass the "
            "same positional and keyword arguments (and pytrees) as at export time"
        )
    values: dict[str, int] = {}
    if isinstance(exported, Artifact):
        names = [leaf["name"] for leaf in exported.meta["inputs"]]
    else:
        names = provenance(exp).get("input_names") or _leaf_paths(tree)
    if len(names) != len(leaves):
        names = _leaf_paths(tree)
    for path, leaf, aval in zip(names, leaves, exp.in_avals, strict=True):
        shape = tuple(np.shape(leaf))
        dtype = jax.dtypes.canonicalize_dtype(np.result_type(leaf))
        where = f"input {path} ({aval.str_short()})"
        if len(shape) != len(aval.shape) or dtype != aval.dtype:
            raise InputShapeError(
                f"{where} got {np.result_type(leaf)}{list(shape)}: pass a {aval.dtype} array "
                f"of rank {len(aval.shape)}"
            )
        for axis, (size, dim) in enumerate(zip(shape, aval.shape, strict=True)):
            if not jax.export.is_symbolic_dim(dim):
                if size != dim:
                    raise InputShapeError(
                        f"{where} got shape {shape}: axis {axis} must be {dim} (exported as "
                        "a constant); re-export with a symbolic dimension to vary it"
                    )
                continue
            name = str(dim)
            if not name.isidentifier():
                continue  # an expression such as 2*b: JAX's own shape assertions check it
            if values.setdefault(name, size) != size:
                raise InputShapeError(
                    f"{where} got shape {shape}: {name} = {size} here but {values[name]} in "
                    f"an earlier input; every {name} must have one size"
                )
            lo, hi = bounds.get(name, (1.0, float("inf")))
            if not lo <= size <= hi:
                raise InputShapeError(
                    f"{where} got shape {shape}: {name} = {size} is outside the exported "
                    f"range {lo:g} <= {name} <= {hi:g}; pass a size in that range, or "
                    "re-export with a wider constraint"
                )
    return values


def call(exported: Exported | Artifact, *args: PyTree, **kwargs: PyTree) -> PyTree:
    """Check platform and inputs (clear errors), then run the exported function here.

    An artifact exported with x64 (float64 inputs or outputs) runs with x64 on.
    """
    check_platform(exported)
    with _x64_for(exported):
        check_inputs(exported, *args, **kwargs)
        return _exported(exported).call(*args, **kwargs)


# ---------------------------------------------------------------------------------------
# describe


@dataclasses.dataclass(frozen=True)
class ExportInfo:
    """What an artifact promises: platforms, types with symbols, calling convention, ops."""

    platforms: tuple[str, ...]
    inputs: list[str]
    outputs: list[str]
    symbols: dict[str, tuple[float, float]]
    calling_convention_version: int
    nr_devices: int
    has_vjp: bool
    ops: Counter[str]

    def rows(self) -> list[dict[str, str | int | bool]]:
        """``{"field", "value"}`` rows for a markdown table."""
        shapes = Counter(self.inputs)
        ins = ", ".join(f"{n} x {s}" if n > 1 else s for s, n in shapes.items())
        symbols = ", ".join(f"{lo:g} <= {k} <= {hi:g}" for k, (lo, hi) in self.symbols.items())
        fields: dict[str, str | int | bool] = {
            "platforms": ", ".join(self.platforms),
            "inputs": ins,
            "outputs": ", ".join(self.outputs),
            "symbols": symbols or "(none)",
            "calling convention": self.calling_convention_version,
            "devices": self.nr_devices,
            "gradient kept": self.has_vjp,
            "top ops": ", ".join(f"{op} {n}" for op, n in self.ops.most_common(4)),
        }
        return [{"field": k, "value": v} for k, v in fields.items()]


def describe(exported: Exported | Artifact) -> ExportInfo:
    """Describe an :class:`Exported` or :class:`Artifact` (bounds from the sidecar if saved)."""
    exp = _require_exported(exported, "describe")
    return ExportInfo(
        tuple(exp.platforms),
        [a.str_short() for a in exp.in_avals],
        [a.str_short() for a in exp.out_avals],
        symbol_bounds(exported),
        exp.calling_convention_version,
        exp.nr_devices,
        exp.has_vjp(),
        op_histogram(exp.mlir_module()),
    )


# ---------------------------------------------------------------------------------------
# A fresh process that imports only jax and numpy

_CHILD = r"""
import hashlib, json, sys, time
start = time.perf_counter()
import jax, numpy as np
src, sidecar, inputs, outputs = sys.argv[1:5]
payload = open(src, "rb").read()
meta = json.load(open(sidecar))
if hashlib.sha256(payload).hexdigest() != meta["sha256"]:
    sys.exit(f"{src}: SHA-256 does not match {sidecar}")
if meta.get("x64"):  # exported with x64: its float64 inputs and outputs need it here too
    jax.config.update("jax_enable_x64", True)
exp = jax.export.deserialize(bytearray(payload))
with np.load(inputs) as z:
    leaves = [z[f"a{i}"] for i in range(len(z.files))]
args, kwargs = jax.tree.unflatten(exp.in_tree, leaves)
out = jax.tree.leaves(jax.block_until_ready(exp.call(*args, **kwargs)))
np.savez(outputs, **{f"a{i}": np.asarray(x) for i, x in enumerate(out)})
loaded = sorted(m for m in ("labkit", "flax", "optax", "torch", "tensorflow", "keras")
                if m in sys.modules)
print(json.dumps({"seconds": time.perf_counter() - start, "modules": loaded,
                  "backend": jax.default_backend(), "jax": jax.__version__}))
"""


@dataclasses.dataclass(frozen=True)
class FreshRun:
    """Outputs of an artifact run by :func:`run_in_fresh_process`, and what that process saw."""

    outputs: list[np.ndarray]  # the output leaves, flat
    result: PyTree  # the same outputs in the exported output structure
    seconds: float  # import jax + load + run, inside the child
    wall_s: float  # the whole subprocess, interpreter start included
    imported: list[str]  # which of labkit, flax, optax, torch, tensorflow, keras it imported
    backend: str


def run_in_fresh_process(
    path: str | os.PathLike[str], *args: PyTree, timeout: float = 120.0, **kwargs: PyTree
) -> FreshRun:
    """Load the artifact at ``path`` in a new Python (jax + numpy only) and run it on args.

    The child checks the digest against the sidecar, deserializes with plain
    ``jax.export.deserialize`` and calls the result with the inputs' own structure (with x64
    on where the sidecar says the artifact needs it).
    """
    art = load(path)  # a clear error here rather than in the child
    if art.weights is not None:
        args = (art.weights, *args)
    leaves = [np.asarray(x) for x in jax.tree.leaves((args, kwargs))]
    if len(leaves) != len(art.exported.in_avals):
        raise InputShapeError(
            f"{len(leaves)} input arrays given, the artifact takes {len(art.exported.in_avals)} "
            f"({art.exported.in_tree}): pass the inputs it was exported with"
        )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    with tempfile.TemporaryDirectory(prefix="labkit-fresh-") as tmp:
        inputs, outputs = Path(tmp, "in.npz"), Path(tmp, "out.npz")
        np.savez(inputs, **{f"a{i}": x for i, x in enumerate(leaves)})  # type: ignore[arg-type]
        cmd = [
            sys.executable,
            "-c",
            _CHILD,
            str(art.path.resolve()),
            str(sidecar_path(art.path).resolve()),
            str(inputs),
            str(outputs),
        ]
        start = time.perf_counter()
        proc = subprocess.run(
            cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
            raise RuntimeError(f"the fresh process failed (exit {proc.returncode}):\n{tail}")
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        with np.load(outputs) as z:
            outs = [z[f"a{i}"] for i in range(len(z.files))]
    result = jax.tree.unflatten(art.exported.out_tree, outs)
    return FreshRun(outs, result, report["seconds"], wall, report["modules"], report["backend"])
