"""GEMMs and casts in compiled HLO: which kernel each matmul became, in which types.

- :func:`gemms` -> :class:`Gemm`: every cuBLAS / cuBLASLt call (FP8 ones included), dot in
  a Triton GEMM fusion, or plain dot, with its shapes and element types, the types its kernel
  reads, precision and dot algorithm, FLOPs per call and calls per step;
- :func:`convert_counts`: ``convert`` ops by ``"src->dst"`` element-type pair.

Used by the precision lessons (bfloat16, FP8) and by :mod:`labkit.xla.inspect_report`, whose
JSON holds each :class:`Gemm`; re-exported by :mod:`labkit.numerics.precision`.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

from labkit.xla.cost import matmul_flops
from labkit.xla.hlo_text import Instruction, Module, element_types, instructions, parse_module
from labkit.xla.predict import trip_multipliers

_GEMM_TARGETS = ("matmul", "gemm")


@dataclasses.dataclass(frozen=True)
class Gemm:
    """One matrix multiply in compiled HLO: the kernel it became, its shapes, types and cost.

    ``kernel`` is "cublas" (a cuBLAS custom call), "triton" (a dot inside a Triton GEMM
    fusion) or "dot" (a plain dot: CPU, or a GPU dot left to the emitters). The shapes are the
    product's own HLO shapes without layout (``bf16[64,128]``; a cuBLAS call's result without
    its workspace), :attr:`lhs`, :attr:`rhs` and :attr:`out` their element types; ``reads`` the
    element types the kernel reads from memory (a Triton fusion may convert them first: FP8
    read, bf16 multiplied). ``precision`` is the operand precision ("DEFAULT", "HIGH",
    "HIGHEST"), ``algorithm`` the dot algorithm preset ("" when unset), ``flops`` per call per
    device, ``per_step`` the calls per step (loops: their trips).
    """

    name: str
    kernel: str
    target: str
    lhs_shape: str
    rhs_shape: str
    out_shape: str
    reads: tuple[str, ...]
    precision: str
    algorithm: str
    flops: float
    per_step: int

    @property
    def lhs(self) -> str:
        """The left operand's element type (``"bf16"``; "" when unknown)."""
        return _dtype(self.lhs_shape)

    @property
    def rhs(self) -> str:
        """The right operand's element type."""
        return _dtype(self.rhs_shape)

    @property
    def out(self) -> str:
        """The result's element type."""
        return _dtype(self.out_shape)


def _dtype(shape: str) -> str:
    m = re.match(r"\(?\s*([a-z][a-z0-9]*)\[", shape)
    return m.group(1) if m else ""


def _unlaid(shape: str) -> str:
    """The shape without layouts, and a tuple's first member (a cuBLAS call's workspace goes)."""
    first = re.match(r"\(?\s*([a-z][a-z0-9]*\[[^\]]*\])", shape)
    return first.group(1) if first else ""


def _kernel_of(module: Module, inst: Instruction) -> Instruction:
    """The scheduled instruction that runs ``inst``: up through the fusions that hold it."""
    while (caller := module.callers.get(inst.computation)) and caller.opcode == "fusion":
        inst = caller
    return inst


def _how(inst: Instruction, kernel: Instruction) -> tuple[str, str, str, str] | None:
    """``(kernel, target, precision, algorithm)`` of a GEMM call or dot; None for other calls."""
    if inst.opcode != "dot":
        target = (inst.attr("custom_call_target") or "").strip('"')
        if not any(t in target for t in _GEMM_TARGETS):
            return None
        config = inst.backend_config().get("gemm_backend_config", {}).get("precision_config", {})
        precision = (config.get("operand_precision") or ["DEFAULT"])[0]
        algorithm = str(config.get("algorithm", "")).replace("ALG_UNSET", "")
        return "cublas", target, precision, algorithm
    fusion = str(kernel.backend_config().get("fusion_backend_config", {}).get("kind", ""))
    kind, target = ("triton", fusion) if "gemm" in fusion else ("dot", "dot")
    precision = (inst.attr("operand_precision") or "{default").strip("{}").split(",")[0]
    return kind, target, precision.upper(), inst.attr("algorithm") or ""


def gemms(hlo: str) -> list[Gemm]:
    """Every GEMM of a compiled module (cuBLAS calls, dots in Triton fusions, plain dots)."""
    module = parse_module(hlo)
    times = trip_multipliers(module)
    out = []
    for inst in instructions(hlo):
        if inst.opcode not in ("dot", "custom-call", "custom-call-start"):
            continue
        kernel = _kernel_of(module, inst)
        how = _how(inst, kernel)
        if how is None:
            continue
        kind, target, precision, algorithm = how
        shapes, outer = module.shapes(inst.computation), module.shapes(kernel.computation)
        lhs, rhs = (shapes.get(o, "") for o in (*inst.operands[:2], "", "")[:2])
        reads = {t for o in kernel.operands for t in element_types(outer.get(o, ""))}
        out.append(
            Gemm(
                name=inst.name,
                kernel=kind,
                target=target,
                lhs_shape=_unlaid(lhs),
                rhs_shape=_unlaid(rhs),
                out_shape=_unlaid(inst.shape),
                reads=tuple(sorted(reads)),
                precision=precision,
                algorithm=algorithm,
                flops=matmul_flops(inst, shapes)[0],
                per_step=times.get(inst.computation, 1),
            )
        )
    return out


def convert_counts(hlo: str) -> Counter[str]:
    """``convert`` ops by ``"src->dst"`` dtype pair, in every computation (fusions too)."""
    module = parse_module(hlo)
    counts: Counter[str] = Counter()
    for inst in instructions(hlo):
        if inst.opcode == "convert" and inst.operands:
            src = _dtype(module.shapes(inst.computation).get(inst.operands[0], ""))
            counts[f"{src or '?'}->{_dtype(inst.shape)}"] += 1
    return counts
