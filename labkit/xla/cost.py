"""What a compiled program costs in FLOPs: XLA's cost analysis, or a count from the HLO shapes.

FLOPs here are *global* unless a name says ``per_device``: an SPMD program's HLO is what one
device runs, so its count is multiplied by the number of devices (``num_partitions`` x
``replica_count`` in the module header). That is the number
:func:`labkit.core.timing.mfu` divides by the peak of all devices together.

XLA's ``cost_analysis()`` is empty for a deviceless (compile-only GPU) executable; then
:func:`hlo_flops` counts from the HLO text the FLOPs of matrix products only: ``dot`` and
``convolution`` ops (also inside fusions) and cuBLAS GEMM custom calls such as
``__cublas$lt$matmul``, ``2 * M * N * K`` each (``2 x output elements x contracted size``),
with loops counted ``known_trip_count`` times. Elementwise work is not counted: for matmul-
heavy programs it is a few percent of XLA's own count.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from labkit.core.types import PyTree
from labkit.xla.hlo_text import Instruction, Module, integers, parse_module, per_module

if TYPE_CHECKING:
    from jax.stages import Compiled

    from labkit.xla.compile_cache import StoredCompile

# Peak to use per operand element type (labkit.core.hardware precisions). float32 matmuls at
# JAX's DEFAULT precision run as TF32 on Ampere/Hopper tensor cores.
PRECISION_OF = {"bf16": "bf16", "f16": "bf16", "f32": "tf32", "f64": "fp32"}
GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul")  # also the $f8 variants


def cost(compiled: Compiled | StoredCompile) -> dict[str, float]:
    """XLA's cost analysis of a compiled executable, one flat dict (per device; {} deviceless)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, Sequence):  # older jaxlibs returned one dict per device
        analysis = analysis[0] if analysis else {}
    return {str(k): float(v) for k, v in (analysis or {}).items()}


def _elements(shape: str) -> int:
    m = re.match(r"\(?\s*[a-z][a-z0-9]*\[([^\]]*)\]", shape)  # a tuple: its first array
    if m is None:
        return 0
    return math.prod(int(d.replace("<=", "")) for d in m.group(1).split(",") if d.strip())


def _dims(shape: str) -> list[int]:
    m = re.match(r"\(?\s*[a-z][a-z0-9]*\[([^\]]*)\]", shape)
    return [int(d.replace("<=", "")) for d in m.group(1).split(",") if d.strip()] if m else []


def precision_of(shape: str) -> str:
    """The hardware-table precision whose peak applies to a matmul on operands of ``shape``."""
    dtype = shape.lstrip("(").split("[", 1)[0].strip()
    return "fp8" if dtype.startswith("f8") else PRECISION_OF.get(dtype, "fp32")


def matmul_flops(inst: Instruction, shapes: dict[str, str]) -> tuple[float, str]:
    """(FLOPs, precision) of one dot, convolution or GEMM custom call; (0, "") for others.

    ``shapes`` maps operand names of the instruction's computation to their HLO shapes.
    """
    if inst.opcode not in ("dot", "convolution", "custom-call"):
        return 0.0, ""
    lhs = shapes.get(inst.operands[0], "") if inst.operands else ""
    out = _elements(inst.shape)
    if inst.opcode == "dot":
        k = math.prod(_dims(lhs)[d] for d in integers(inst.attr("lhs_contracting_dims") or ""))
        return 2.0 * out * k, precision_of(lhs)
    if inst.opcode == "convolution" and len(inst.operands) > 1:
        kernel = _dims(shapes.get(inst.operands[1], ""))
        labels = (inst.attr("dim_labels") or "").split("_")
        kernel_labels = labels[1].split("->")[0] if len(labels) > 1 else ""
        if len(kernel_labels) != len(kernel) or "o" not in kernel_labels:
            return 0.0, ""
        per_output = math.prod(kernel) // kernel[kernel_labels.index("o")]
        return 2.0 * out * per_output, precision_of(lhs)
    target = (inst.attr("custom_call_target") or "").strip('"')
    if inst.opcode == "custom-call" and target.startswith(GEMM_TARGETS):
        numbers = inst.backend_config().get("gemm_backend_config", {})
        contracting = numbers.get("dot_dimension_numbers", {}).get("lhs_contracting_dimensions")
        dims = _dims(lhs)
        k = math.prod(dims[int(d)] for d in contracting or [])
        return 2.0 * out * k, "fp8" if "$f8" in target else precision_of(lhs)
    return 0.0, ""


def kernel_flops(module: Module, inst: Instruction) -> Counter[str]:
    """FLOPs by precision of one instruction, including the computations it calls."""
    shapes = module.shapes(inst.computation)
    flops, precision = matmul_flops(inst, shapes)
    out: Counter[str] = Counter({precision: flops} if flops else {})
    if inst.opcode == "while":
        trips = inst.trip_count
        callees, times = inst.callees("body"), 1 if trips is None else trips
    elif inst.opcode == "conditional":  # the most expensive branch
        branches = [_computation_flops(module, name) for name in inst.callees()]
        return out + max(branches, key=lambda c: sum(c.values()), default=Counter())
    elif inst.opcode in ("fusion", "call", "async-start", "fusion-start"):
        callees, times = inst.callees("calls", "to_apply"), 1
    else:
        return out
    for name in callees:
        for key, value in _computation_flops(module, name).items():
            out[key] += value * times
    return out


def computation_flops(module: Module, name: str) -> Counter[str]:
    """FLOPs by precision of a computation (its instructions and what they call)."""
    return Counter(_computation_flops(module, name))


@per_module  # a fused computation is costed once per parse
def _computation_flops(module: Module, name: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for inst in module.computations.get(name, ()):
        out.update(kernel_flops(module, inst))
    return out


def hlo_flops(hlo: str, per_device: bool = False) -> float:
    """Matmul FLOPs (dots, convolutions, GEMM custom calls) of an HLO module; global by default.

    Global = one device's count x the devices in the module header (``num_partitions`` x
    ``replica_count``); a module without them counts as one device.
    """
    module = parse_module(hlo)
    counted = sum(computation_flops(module, module.entry).values())
    return counted if per_device else counted * (module.num_devices or 1)


def compiled_flops(compiled: Compiled | StoredCompile, per_device: bool = False) -> float:
    """FLOPs of a compiled executable: XLA's cost analysis, or :func:`hlo_flops` when empty.

    Global by default (one device's count x devices); ``per_device`` gives one device's.
    """
    text = compiled.as_text()
    if text is None:
        raise ValueError("this executable has no HLO text to count FLOPs from")
    devices = 1 if per_device else (parse_module(text).num_devices or 1)
    counted = cost(compiled).get("flops", 0.0)
    if counted <= 0:  # deviceless GPU compiles have no cost analysis: count from the HLO
        return hlo_flops(text, per_device=True) * devices
    return counted * devices


def flops(fn: Callable[..., object], *args: PyTree, per_device: bool = False) -> float:
    """Global FLOPs of one call of ``fn(*args)`` (all devices together; see module docs)."""
    import jax

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    counted = compiled_flops(jitted.lower(*args).compile(), per_device=per_device)
    if counted <= 0:
        raise ValueError("neither XLA's cost analysis nor the HLO shows FLOPs for this function")
    return counted
