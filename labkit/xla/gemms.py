"""GEMMs and casts in compiled HLO: which kernel each matmul became, in which types.

- :func:`gemms` -> :class:`Gemm`: every cuBLAS / cuBLASLt call (FP8 ones included), dot in
  a Triton GEMM fusion, or plain dot, with operand and result element types, precision and
  dot algorithm;
- :func:`convert_counts`: ``convert`` ops by ``"src->dst"`` element-type pair.

Used by the precision lessons (bfloat16, FP8); re-exported by :mod:`labkit.numerics.precision`.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

from labkit.xla.hlo import instructions, parse_module

_GEMM_TARGETS = ("matmul", "gemm")


@dataclasses.dataclass(frozen=True)
class Gemm:
    """One matrix multiply in compiled HLO: how it runs and in which types.

    ``kernel`` is "cublas" (a cuBLAS custom call), "triton" (a dot inside a Triton GEMM
    fusion) or "dot" (a plain dot: CPU, or a GPU dot left to the emitters). ``precision``
    is the operand precision ("DEFAULT", "HIGH", "HIGHEST") and ``algorithm`` the dot
    algorithm preset ("" when unset).
    """

    name: str
    kernel: str
    target: str
    lhs: str
    rhs: str
    out: str
    precision: str
    algorithm: str


def _dtype(shape: str) -> str:
    m = re.match(r"\(?\s*([a-z][a-z0-9]*)\[", shape)
    return m.group(1) if m else ""


def gemms(hlo: str) -> list[Gemm]:
    """Every GEMM of a compiled module (cuBLAS calls, dots in Triton fusions, plain dots)."""
    insts = instructions(hlo)
    shapes = {(i.computation, i.name): i.shape for i in insts}
    caller = parse_module(hlo).callers
    out = []
    for inst in insts:
        ops = [_dtype(shapes.get((inst.computation, o), "")) for o in inst.operands[:2]]
        ops += [""] * (2 - len(ops))
        if inst.opcode in ("custom-call", "custom-call-start"):
            target = (inst.attr("custom_call_target") or "").strip('"')
            if not any(t in target for t in _GEMM_TARGETS):
                continue
            config = (
                inst.backend_config().get("gemm_backend_config", {}).get("precision_config", {})
            )
            precision = (config.get("operand_precision") or ["DEFAULT"])[0]
            algorithm = str(config.get("algorithm", "")).replace("ALG_UNSET", "")
            out.append(
                Gemm(
                    inst.name,
                    "cublas",
                    target,
                    *ops,
                    _dtype(inst.shape),
                    precision,  # type: ignore[call-arg]
                    algorithm,
                )
            )
        elif inst.opcode == "dot":
            kernel, target, up = "dot", "dot", caller.get(inst.computation)
            while up is not None:
                kind = str(up.backend_config().get("fusion_backend_config", {}).get("kind", ""))
                if "gemm" in kind:
                    kernel, target = "triton", kind
                up = caller.get(up.computation)
            precision = (inst.attr("operand_precision") or "{default").strip("{}").split(",")[0]
            out.append(
                Gemm(
                    inst.name,
                    kernel,
                    target,
                    *ops,
                    _dtype(inst.shape),  # type: ignore[call-arg]
                    precision.upper(),
                    inst.attr("algorithm") or "",
                )
            )
    return out


def convert_counts(hlo: str) -> Counter[str]:
    """``convert`` ops by ``"src->dst"`` dtype pair, in every computation (fusions too)."""
    insts = instructions(hlo)
    shapes = {(i.computation, i.name): i.shape for i in insts}
    counts: Counter[str] = Counter()
    for inst in insts:
        if inst.opcode == "convert" and inst.operands:
            src = _dtype(shapes.get((inst.computation, inst.operands[0]), ""))
            counts[f"{src or '?'}->{_dtype(inst.shape)}"] += 1
    return counts
