"""Portable StableHLO from JAX: export, save to a file, load, check, run elsewhere, describe.

``jax.export`` turns a jitted function into an :class:`jax.export.Exported`: StableHLO
(serialized as a versioned *portable artifact*), the input and output types (possibly with
symbolic dimensions), the platforms it was lowered for and a calling-convention version.
This module wraps it in small functions with clear errors:

- :func:`export`, :func:`save` (a file with a checksummed header), :func:`load`;
- :func:`check_platform`, :func:`check_inputs` and :func:`call`: a wrong platform or a
  wrong input shape raises :class:`PlatformMismatch` / :class:`InputShapeError` saying what
  to do, before XLA sees the module; a corrupted or truncated file raises
  :class:`ArtifactError`;
- :func:`run_in_fresh_process`: load and run a saved artifact in a new Python that imports
  only jax and numpy (what a deployment does);
- :func:`describe`: platforms, inputs with symbols and bounds, calling convention, ops;
- IREE as a second consumer: :func:`strip_sharding`, :func:`iree_compile`, :func:`iree_run`
  (optional packages ``iree-base-compiler`` and ``iree-base-runtime``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from labkit.xla.hlo import op_histogram

MAGIC = b"LABKIT-JAX-EXPORT 1\n"  # first line of a saved artifact; a JSON header follows


class ArtifactError(ValueError):
    """A saved artifact cannot be read: not one, truncated, corrupted or from another format."""


class PlatformMismatch(RuntimeError):
    """The artifact was not exported for the platform it is asked to run on."""


class InputShapeError(ValueError):
    """Inputs do not match the exported types (structure, rank, dtype, size or bound)."""


class IreeUnavailable(RuntimeError):
    """IREE's Python packages are not installed."""


class IreeCompileError(RuntimeError):
    """IREE rejected a module; the message has IREE's error lines and what to do."""


@dataclasses.dataclass(frozen=True)
class Artifact:
    """An :class:`jax.export.Exported` with the header :func:`save` wrote next to it."""

    exported: Any  # jax.export.Exported
    meta: dict[str, Any]


def _exported(x: Any) -> Any:
    return x.exported if isinstance(x, Artifact) else x


def string_keys(tree: Any) -> Any:
    """Nested dicts with every key a string (serialization wants ``"0"``, not ``0``)."""
    if isinstance(tree, dict):
        return {str(k): string_keys(v) for k, v in tree.items()}
    return tree


def int_keys(tree: Any) -> Any:
    """Undo :func:`string_keys`: keys made of digits become ints again (``nnx.List`` indices)."""
    if isinstance(tree, dict):
        return {(int(k) if isinstance(k, str) and k.isdigit() else k): int_keys(v)
                for k, v in tree.items()}  # fmt: skip
    return tree


def export(fn: Callable[..., Any], *args: Any, platforms: Sequence[str] | None = None) -> Any:
    """``jax.export.export`` of ``fn`` (jitted if needed) for ``args`` (arrays or specs)."""
    jitted: Any = fn if hasattr(fn, "lower") else jax.jit(fn)
    return jax.export.export(jitted, platforms=tuple(platforms) if platforms else None)(*args)


def symbol_bounds(exported: Any) -> dict[str, tuple[float, float]]:
    """Each symbolic dimension of the inputs by name, with the bounds JAX can prove for it."""
    bounds = {}
    for aval in _exported(exported).in_avals:
        for dim in aval.shape:
            if jax.export.is_symbolic_dim(dim) and str(dim).isidentifier():
                bounds[str(dim)] = tuple(float(b) for b in jax.export.symbolic_dim_bounds(dim))
    return bounds  # type: ignore[return-value]


def save(exported: Any, path: str | os.PathLike[str], vjp_order: int = 0) -> Path:
    """Serialize ``exported`` (with ``vjp_order`` derivatives) to ``path``, with a header.

    The header (one JSON line after :data:`MAGIC`) holds the payload's length and SHA-256,
    the jax version, the platforms and the symbols' bounds (JAX does not keep a symbol's
    constraints in ``in_avals`` after deserializing: the module checks them only at run time).
    """
    payload = bytes(exported.serialize(vjp_order=vjp_order))
    meta = {
        "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
        "jax": jax.__version__, "vjp_order": vjp_order, "platforms": list(exported.platforms),
        "calling_convention_version": exported.calling_convention_version,
        "bounds": {k: list(v) for k, v in symbol_bounds(exported).items()},
    }  # fmt: skip
    path = Path(path)
    path.write_bytes(MAGIC + json.dumps(meta).encode() + b"\n" + payload)
    return path


def read_header(blob: bytes, source: str = "artifact") -> tuple[dict[str, Any], bytes]:
    """Split a saved artifact into its header and payload; check length and checksum."""
    if not blob.startswith(MAGIC):
        raise ArtifactError(
            f"{source} is not a labkit export artifact (it does not start with {MAGIC!r}): "
            "write artifacts with labkit.export.save, or deserialize raw bytes with "
            "jax.export.deserialize"
        )
    line_end = blob.find(b"\n", len(MAGIC))
    try:
        meta = json.loads(blob[len(MAGIC) : line_end]) if line_end > 0 else None
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or "sha256" not in meta:
        raise ArtifactError(f"{source}: its header is damaged; export and save it again")
    payload = blob[line_end + 1 :]
    if len(payload) != meta["bytes"]:
        raise ArtifactError(
            f"{source} is truncated or padded: {len(payload)} payload bytes, the header says "
            f"{meta['bytes']}; copy the file again or re-export it"
        )
    if hashlib.sha256(payload).hexdigest() != meta["sha256"]:
        raise ArtifactError(
            f"{source} is corrupted: its SHA-256 does not match the header; copy the file "
            "again or re-export it"
        )
    return meta, payload


def load(path: str | os.PathLike[str]) -> Artifact:
    """Read and deserialize an artifact written by :func:`save`."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"no artifact at {path}: export and save one first")
    meta, payload = read_header(path.read_bytes(), str(path))
    try:
        exported = jax.export.deserialize(bytearray(payload))
    except (ValueError, TypeError, RuntimeError, IndexError) as err:
        raise ArtifactError(
            f"{path}: jax {jax.__version__} cannot deserialize it (written by jax "
            f"{meta.get('jax')}): {err}. Serialized exports have a compatibility window: "
            "re-export with this jax"
        ) from err
    return Artifact(exported, meta)


def _here() -> str:
    """This process's platform in export's spelling ("cpu", "cuda", "rocm", "tpu")."""
    device = jax.devices()[0]
    if device.platform == "gpu":
        return "rocm" if "rocm" in device.client.platform_version.lower() else "cuda"
    return str(device.platform)


def check_platform(exported: Any, platform: str | None = None) -> str:
    """Raise :class:`PlatformMismatch` unless ``exported`` runs on ``platform`` (default: here)."""
    platforms = tuple(_exported(exported).platforms)
    platform = platform or _here()
    if platform not in platforms:
        raise PlatformMismatch(
            f"this artifact was exported for {platforms} but this process runs on "
            f"{platform!r}: re-export with platforms=({', '.join(map(repr, platforms))}, "
            f"{platform!r}) (one artifact can hold several), or run it on a {platforms[0]} machine"
        )
    return platform


def check_inputs(exported: Any, *args: Any, **kwargs: Any) -> dict[str, int]:
    """Check args against the exported types; return the value of each symbol.

    Raises :class:`InputShapeError` naming the input, what was expected and what to do.
    """
    exp = _exported(exported)
    bounds = exported.meta.get("bounds", {}) if isinstance(exported, Artifact) else {}
    bounds = {**{k: list(v) for k, v in symbol_bounds(exp).items()}, **bounds}
    leaves, tree = jax.tree.flatten((args, kwargs))
    if tree != exp.in_tree:
        raise InputShapeError(
            f"inputs are structured as {tree}, the export expects {exp.in_tree}: pass the "
            "same pytree (e.g. the params dict with string keys) as at export time"
        )
    values: dict[str, int] = {}
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
        (args, kwargs))[0]]  # fmt: skip
    for path, leaf, aval in zip(paths, leaves, exp.in_avals, strict=True):
        shape, dtype = np.shape(leaf), np.result_type(leaf)
        where = f"input {path} ({aval.str_short()})"
        if len(shape) != len(aval.shape) or dtype != aval.dtype:
            raise InputShapeError(
                f"{where} got {dtype}{list(shape)}: pass a {aval.dtype} array of rank "
                f"{len(aval.shape)}"
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
            lo, hi = bounds.get(name, (1, float("inf")))
            if not lo <= size <= hi:
                raise InputShapeError(
                    f"{where} got shape {shape}: {name} = {size} is outside the exported "
                    f"range {lo:g} <= {name} <= {hi:g}; pass a size in that range, or "
                    "re-export with a wider constraint"
                )
    return values


def call(exported: Any, *args: Any, **kwargs: Any) -> Any:
    """Check platform and inputs (clear errors), then run the exported function here."""
    check_platform(exported)
    check_inputs(exported, *args, **kwargs)
    return _exported(exported).call(*args, **kwargs)


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

    def rows(self) -> list[dict[str, Any]]:
        """``{"field", "value"}`` rows for a markdown table."""
        shapes = Counter(self.inputs)
        ins = ", ".join(f"{n} x {s}" if n > 1 else s for s, n in shapes.items())
        symbols = ", ".join(f"{lo:g} <= {k} <= {hi:g}" for k, (lo, hi) in self.symbols.items())
        return [{"field": k, "value": v} for k, v in {
            "platforms": ", ".join(self.platforms), "inputs": ins,
            "outputs": ", ".join(self.outputs), "symbols": symbols or "(none)",
            "calling convention": self.calling_convention_version,
            "devices": self.nr_devices, "gradient kept": self.has_vjp,
            "top ops": ", ".join(f"{op} {n}" for op, n in self.ops.most_common(4)),
        }.items()]  # fmt: skip


def describe(exported: Any) -> ExportInfo:
    """Describe an :class:`Exported` or :class:`Artifact` (bounds from the header if saved)."""
    exp = _exported(exported)
    bounds = symbol_bounds(exp)
    if isinstance(exported, Artifact):
        bounds.update({k: (v[0], v[1]) for k, v in exported.meta.get("bounds", {}).items()})
    return ExportInfo(
        tuple(exp.platforms), [a.str_short() for a in exp.in_avals],
        [a.str_short() for a in exp.out_avals], bounds, exp.calling_convention_version,
        exp.nr_devices, exp.has_vjp(), op_histogram(exp.mlir_module()),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------
# A fresh process that imports only jax and numpy

_CHILD = r"""
import hashlib, json, sys, time
start = time.perf_counter()
import jax, numpy as np
src, inputs, outputs, magic = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].encode()
blob = open(src, "rb").read()
assert blob.startswith(magic), "not a labkit export artifact"
end = blob.index(b"\n", len(magic))
meta, payload = json.loads(blob[len(magic):end]), blob[end + 1:]
assert hashlib.sha256(payload).hexdigest() == meta["sha256"], "artifact corrupted"
exp = jax.export.deserialize(bytearray(payload))
with np.load(inputs) as z:
    leaves = [z[f"a{i}"] for i in range(len(z.files))]
args, kwargs = jax.tree.unflatten(exp.in_tree, leaves)
out = jax.tree.leaves(jax.block_until_ready(exp.call(*args, **kwargs)))
np.savez(outputs, **{f"a{i}": np.asarray(x) for i, x in enumerate(out)})
loaded = sorted(m for m in ("labkit", "flax", "optax", "torch") if m in sys.modules)
print(json.dumps({"seconds": time.perf_counter() - start, "modules": loaded,
                  "backend": jax.default_backend(), "jax": jax.__version__}))
"""


@dataclasses.dataclass(frozen=True)
class FreshRun:
    """Outputs of an artifact run by :func:`run_in_fresh_process`, and what that process saw."""

    outputs: list[np.ndarray]
    seconds: float  # import jax + load + run, inside the child
    wall_s: float  # the whole subprocess, interpreter start included
    imported: list[str]  # which of labkit, flax, optax, torch the child imported (none expected)
    backend: str


def run_in_fresh_process(
    path: str | os.PathLike[str], *args: Any, timeout: float = 120.0, **kwargs: Any
) -> FreshRun:
    """Load the artifact at ``path`` in a new Python (jax + numpy only) and run it on args."""
    read_header(Path(path).read_bytes(), str(path))  # a clear error before spawning
    leaves = [np.asarray(x) for x in jax.tree.leaves((args, kwargs))]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        inputs, outputs = Path(tmp, "in.npz"), Path(tmp, "out.npz")
        np.savez(inputs, **{f"a{i}": x for i, x in enumerate(leaves)})  # type: ignore[arg-type]
        cmd = [sys.executable, "-c", _CHILD, str(Path(path).resolve()), str(inputs),
               str(outputs), MAGIC.decode()]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
            raise RuntimeError(f"the fresh process failed (exit {proc.returncode}):\n{tail}")
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        with np.load(outputs) as z:
            outs = [z[f"a{i}"] for i in range(len(z.files))]
    return FreshRun(outs, report["seconds"], wall, report["modules"], report["backend"])


# ---------------------------------------------------------------------------------------
# IREE: a second consumer of the same StableHLO

_SDY_ATTR = re.compile(r"\s*sdy\.sharding(?:_rule)?\s*=\s*#sdy\.[\w_]+<[^>]*>,?")
_MHLO_SHARDING = re.compile(r'\s*mhlo\.sharding\s*=\s*"[^"]*",?')
_SDY_MESH = re.compile(r"^\s*sdy\.mesh\b.*$\n?", re.MULTILINE)


def strip_sharding(mlir: str) -> str:
    """StableHLO text without Shardy (``sdy``) meshes and sharding attributes.

    What IREE needs from a module lowered with shardings for one device. A module with
    ``sdy`` *ops* left (sharding constraints, manual computations) raises ValueError: export
    a version without sharding instead.
    """
    text = _SDY_MESH.sub("", mlir)
    text = _MHLO_SHARDING.sub("", _SDY_ATTR.sub("", text))
    text = re.sub(r"\s*\{\s*,?\s*\}", "", re.sub(r",\s*\}", "}", text))  # emptied attr dicts
    left = sorted(set(re.findall(r"\bsdy\.[a-z_]+", text)))
    if left:
        raise ValueError(
            f"sharding ops remain after stripping: {left}; export the function without "
            "shardings (unsharded inputs, no sharding constraints) for IREE"
        )
    return text


def iree_available() -> bool:
    """True if ``iree.compiler`` and ``iree.runtime`` can be imported."""
    try:
        return all(importlib.util.find_spec(m) is not None
                   for m in ("iree.compiler", "iree.runtime"))  # fmt: skip
    except ModuleNotFoundError:
        return False


def require_iree() -> None:
    """Raise :class:`IreeUnavailable` with the install command if IREE is missing."""
    if not iree_available():
        raise IreeUnavailable(
            "IREE is not installed: pip install iree-base-compiler iree-base-runtime "
            "(about 470 MB with sympy; pin the same version for both)"
        )


def iree_compile(
    mlir: str | bytes, backend: str = "llvm-cpu", cpu: str = "host", opt_level: str | None = None
) -> bytes:
    """Compile StableHLO (text or portable bytes) with IREE into a VM flatbuffer.

    ``opt_level`` sets IREE's ``--iree-opt-level`` ("O0" to "O3"; None keeps its default).
    """
    require_iree()
    import iree.compiler as ic  # type: ignore[import-not-found, unused-ignore]

    extra = [f"--iree-opt-level={opt_level}"] if opt_level else []
    extra += [f"--iree-llvmcpu-target-cpu={cpu}"] if backend == "llvm-cpu" else []
    try:
        return bytes(ic.compile_str(mlir, target_backends=[backend], input_type="stablehlo",
                                    extra_args=extra))  # fmt: skip
    except ic.CompilerToolError as err:
        raise IreeCompileError(_iree_advice(str(err))) from err


def _iree_advice(message: str) -> str:
    """IREE's ``error:`` lines, shortened, and what to do about the known ones."""
    errors = [line.split("error:", 1)[1].strip()[:160] for line in message.splitlines()
              if "error:" in line]  # fmt: skip
    text = "; ".join(dict.fromkeys(errors)) or message.strip().splitlines()[0]
    if "sdy" in text:
        hint = "strip the sharding annotations (labkit.export.strip_sharding) or export unsharded"
    elif "statically shaped" in text or "dynamic" in text:
        hint = "export with static shapes (one export per shape you serve) for IREE"
    else:
        hint = "set IREE_SAVE_TEMPS=<dir> to keep IREE's reproducer"
    return f"IREE cannot compile this module: {text}. What to do: {hint}"


def iree_inputs(exported: Any, *args: Any, **kwargs: Any) -> list[np.ndarray]:
    """The flat arrays the exported module's ``main`` takes (unused inputs dropped)."""
    exp = _exported(exported)
    leaves = [np.asarray(x) for x in jax.tree.leaves((args, kwargs))]
    return [leaves[i] for i in exp.module_kept_var_idx]


def iree_run(vmfb: bytes, *args: Any, backend: str = "llvm-cpu", function: str = "main"
             ) -> list[np.ndarray]:  # fmt: skip
    """Run ``function`` of an IREE module on numpy inputs; the results as numpy arrays."""
    require_iree()
    import iree.runtime as irt  # type: ignore[import-not-found, unused-ignore]

    module = irt.load_vm_flatbuffer(vmfb, backend=backend)
    result = getattr(module, function)(*[np.asarray(a) for a in args])
    results = result if isinstance(result, tuple | list) else [result]
    return [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]
