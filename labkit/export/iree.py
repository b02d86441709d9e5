"""IREE, a second consumer of JAX's StableHLO: strip sharding, compile, run.

IREE is an independent MLIR compiler and runtime (optional packages ``iree-base-compiler``
and ``iree-base-runtime``, same version). It compiles the StableHLO of a static, unsharded
export for ``llvm-cpu`` and runs it outside JAX: :func:`strip_sharding`,
:func:`iree_compile`, :func:`iree_inputs`, :func:`iree_run`.
"""

from __future__ import annotations

import importlib.util
import re
import textwrap

import jax
import numpy as np
from jax.export import Exported
from numpy.typing import ArrayLike

from labkit.core.types import PyTree
from labkit.export.artifact import Artifact


class IreeUnavailable(RuntimeError):
    """IREE's Python packages are not installed."""


class IreeCompileError(RuntimeError):
    """IREE rejected a module; the message has IREE's error lines and what to do."""


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
        return all(
            importlib.util.find_spec(m) is not None for m in ("iree.compiler", "iree.runtime")
        )
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
        return bytes(
            ic.compile_str(
                mlir, target_backends=[backend], input_type="stablehlo", extra_args=extra
            )
        )
    except ic.CompilerToolError as err:
        raise IreeCompileError(_iree_advice(str(err))) from err


def _iree_advice(message: str) -> str:
    """IREE's ``error:`` lines, shortened, and what to do about the known ones."""
    errors = [
        textwrap.shorten(line.split("error:", 1)[1], 160, placeholder=" ...")
        for line in message.splitlines()
        if "error:" in line
    ]
    text = "; ".join(dict.fromkeys(errors)) or message.strip().splitlines()[0]
    if "sdy" in text:
        hint = (
            "strip the sharding annotations (labkit.export.iree.strip_sharding) or export unsharded"
        )
    elif "statically shaped" in text or "dynamic" in text:
        hint = "export with static shapes (one export per shape you serve) for IREE"
    else:
        hint = "set IREE_SAVE_TEMPS=<dir> to keep IREE's reproducer"
    end = "" if text.endswith((".", "...")) else "."
    return f"IREE cannot compile this module: {text}{end} What to do: {hint}"


def iree_inputs(exported: Exported | Artifact, *args: PyTree, **kwargs: PyTree) -> list[np.ndarray]:
    """The flat arrays the exported module's ``main`` takes (unused inputs dropped)."""
    exp = exported.exported if isinstance(exported, Artifact) else exported
    leaves = [np.asarray(x) for x in jax.tree.leaves((args, kwargs))]
    return [leaves[i] for i in exp.module_kept_var_idx]


def iree_run(
    vmfb: bytes, *args: ArrayLike, backend: str = "llvm-cpu", function: str = "main"
) -> list[np.ndarray]:
    """Run ``function`` of an IREE module on numpy inputs; the results as numpy arrays."""
    require_iree()
    import iree.runtime as irt  # type: ignore[import-not-found, unused-ignore]

    module = irt.load_vm_flatbuffer(vmfb, backend=backend)
    result = getattr(module, function)(*[np.asarray(a) for a in args])
    results = result if isinstance(result, tuple | list) else [result]
    return [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]
