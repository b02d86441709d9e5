"""What a compiled GPU program shows on a read: split-K GEMMs, the copies around combined
all-reduces, and what to try when one term of the step dominates.

- :func:`split_k`: XLA's split-K rewrite (``split_k_gemm_rewriter.cc``, applied when a GEMM's
  tile config has ``split_k`` > 1) turns a ``[M, K] x [K, N]`` product into a batched one over
  ``[s, K/s]`` slices of ``K`` that writes ``s`` partial products, which a following kernel
  sums. In the HLO the dot gains one batch dimension, placed just before a contracting
  dimension of each operand, and a ``reduce`` over the result's leading dimension of size
  ``s`` consumes it (an attention product has the same dot shape, but nothing sums its batch):
  both are the signature read here.
- :func:`pack_and_unpack`: XLA's all-reduce combiner sends many small gradients as one buffer;
  a fusion packs them (a ``concatenate``) before the ``all-reduce-start`` and one fusion per
  gradient unpacks its part (a ``slice``) after the ``-done``. Both read and write the whole
  buffer through HBM: the kit's memory term counts them, priced here.
- :func:`what_to_try`: one line per dominant term of :func:`labkit.xla.predict.predict`
  (floors, memory, exposed communication, math) naming a flag or a sharding to try.
"""

from __future__ import annotations

import dataclasses
import re

from labkit.core.hardware import Hardware, hardware
from labkit.xla import hlo, overlap
from labkit.xla.hlo_text import Instruction, Module, parse_module
from labkit.xla.predict import StepPrediction, trip_multipliers

__all__ = ["PackUnpack", "SplitK", "pack_and_unpack", "split_k", "what_to_try"]

_DIMS = re.compile(r"\d+")


@dataclasses.dataclass(frozen=True)
class SplitK:
    """A split-K GEMM: its dot, the kernel (fusion) that runs it, ``splits`` slices of ``k``,
    and the bytes of f32 partials it writes per call."""

    dot: str
    kernel: str
    splits: int
    k: int
    partial_bytes: int


def _dims(inst: Instruction, key: str) -> list[int]:
    return [int(d) for d in _DIMS.findall(inst.attr(key) or "")]


def _shape_dims(shape: str) -> list[int]:
    inside = re.search(r"\[([^\]]*)\]", shape)
    return [int(d) for d in _DIMS.findall(inside.group(1))] if inside else []


def _kernel_of(module: Module, inst: Instruction) -> Instruction:
    kernel = inst
    while (caller := module.callers.get(kernel.computation)) is not None:
        if caller.opcode != "fusion":
            break
        kernel = caller
    return kernel


def split_k(text: str) -> list[SplitK]:
    """Every split-K GEMM of a compiled program (see the module docstring)."""
    module = parse_module(text)
    out = []
    for comp, insts in module.computations.items():
        shapes = module.shapes(comp)
        for inst in insts:
            if inst.opcode != "dot" or len(inst.operands) < 2:
                continue
            lb, rb = _dims(inst, "lhs_batch_dims"), _dims(inst, "rhs_batch_dims")
            lc, rc = _dims(inst, "lhs_contracting_dims"), _dims(inst, "rhs_contracting_dims")
            if len(lb) != 1 or len(rb) != 1 or lb[0] + 1 not in lc or rb[0] + 1 not in rc:
                continue
            lhs = _shape_dims(shapes.get(inst.operands[0], ""))
            rhs = _shape_dims(shapes.get(inst.operands[1], ""))
            if not lhs or not rhs or lhs[lb[0]] != rhs[rb[0]] or lhs[lb[0]] < 2:
                continue
            splits = lhs[lb[0]]
            kernel = _kernel_of(module, inst)
            if not _summed(module, kernel, splits):
                continue
            k = splits * lhs[lb[0] + 1]
            out.append(SplitK(inst.name, kernel.name, splits, k, _bytes(kernel.shape)))
    return out


def _summed(module: Module, kernel: Instruction, splits: int) -> bool:
    """Whether a kernel reads ``kernel``'s result and reduces its leading dimension (of size
    ``splits``): the sum of split-K partials."""
    for user in module.computations.get(kernel.computation, ()):
        if kernel.name not in user.operands:
            continue
        if user.opcode == "reduce" and _reduces_leading(user, user.operands[0], splits, {}):
            return True
        for callee in user.callees("calls"):
            insts = module.computations.get(callee, ())
            shapes = module.shapes(callee)
            index = user.operands.index(kernel.name)
            param = next((i.name for i in insts if i.parameter_number == index), None)
            if param is None:
                continue
            aliases = {param}
            for i in insts:  # bitcasts of the partials are the partials
                if i.opcode in ("bitcast", "convert") and i.operands and i.operands[0] in aliases:
                    aliases.add(i.name)
            if any(
                i.opcode == "reduce" and _reduces_leading(i, i.operands[0], splits, shapes)
                for i in insts
                if i.operands and i.operands[0] in aliases
            ):
                return True
    return False


def _reduces_leading(inst: Instruction, operand: str, splits: int, shapes: dict[str, str]) -> bool:
    dims = _dims(inst, "dimensions")
    leading = _shape_dims(shapes.get(operand, ""))
    return dims == [0] and (not leading or leading[0] == splits)


def _bytes(shape: str) -> int:
    from labkit.xla.hlo_text import shape_bytes

    return shape_bytes(shape) if shape else 0


@dataclasses.dataclass(frozen=True)
class PackUnpack:
    """The kernels around one combined all-reduce, per step: the packing fusion(s) before its
    start, the unpacking ones after its done, and what the kit's model charges them (us)."""

    collective: str
    pack: tuple[str, ...]
    unpack: tuple[str, ...]
    memory_us: float  # their HBM bytes / bandwidth, per step
    floor_us: float  # their kernel floors, per step
    share_of_memory: float  # memory_us / the step's memory term


def _root(module: Module, inst: Instruction) -> str:
    """The opcode of a fusion's root (what the kernel finally does)."""
    for callee in inst.callees("calls"):
        for i in module.computations.get(callee, ()):
            if i.is_root:
                return i.opcode
    return inst.opcode


def _through(insts: dict[str, Instruction], name: str) -> str:
    """Follow bitcasts and get-tuple-elements back to the instruction that made ``name``."""
    inst = insts.get(name)
    while inst is not None and inst.opcode in ("bitcast", "get-tuple-element") and inst.operands:
        name = inst.operands[0]
        inst = insts.get(name)
    return name


def pack_and_unpack(
    text: str, gpu: str | Hardware = "H100 SXM", memory_s: float | None = None
) -> list[PackUnpack]:
    """The pack and unpack kernels of every async all-reduce that combines several buffers,
    with their share of the step's memory term (``memory_s``, default the model's)."""
    from labkit.xla.predict import predict

    hw = gpu if isinstance(gpu, Hardware) else hardware(gpu)
    module = parse_module(text)
    times = trip_multipliers(module)
    total = memory_s if memory_s is not None else predict(text, hw).memory_s
    out = []
    for pair in hlo.async_pairs(text):
        if pair.kind != "all-reduce":
            continue
        insts = {i.name: i for i in module.computations[pair.computation]}
        start = insts[pair.start]
        fed = {_through(insts, o) for o in start.operands}
        pack = [n for n in fed if n in insts and _root(module, insts[n]) == "concatenate"]
        users = [
            i
            for i in insts.values()
            if any(_through(insts, o) == pair.done for o in i.operands)
            and hlo.is_compute(module, i)
        ]
        unpack = [i.name for i in users if _root(module, i) in ("slice", "dynamic-slice")]
        if not pack or len(unpack) < 2:
            continue
        runs = times.get(pair.computation, 1)
        costs = [overlap.kernel_cost(module, insts[n], hw) for n in (*pack, *unpack)]
        memory_us = sum(c.memory_s for c in costs) * runs * 1e6
        floor_us = sum(c.floor_s for c in costs) * runs * 1e6
        share = memory_us / (total * 1e6) if total > 0 else 0.0
        out.append(
            PackUnpack(pair.start, tuple(sorted(pack)), tuple(unpack), memory_us, floor_us, share)
        )
    return out


def what_to_try(pred: StepPrediction) -> list[str]:
    """What to try, for the term that sets the model's range (and any close to it): one line
    each, naming a flag or a sharding. Suggestions of the kit's model, to be measured."""
    terms = {
        "kernel floors": pred.floor_s,
        "memory": pred.memory_s,
        "exposed communication": pred.exposed_s,
        "math": pred.math_s,
    }
    top = max(terms.values())
    lines = {
        "kernel floors": "kernel floors dominate (many small kernels): give each kernel more "
        "work (a larger batch per GPU, fewer devices for a model this small); command buffers "
        "(xla_gpu_enable_command_buffer, on by default) are what cut launch cost on a GPU",
        "memory": "HBM traffic dominates: look for copies (the pack and unpack around combined "
        "all-reduces; --xla_gpu_all_reduce_combine_threshold_bytes trades them for more "
        "collectives) and for f32 where bf16 would do",
        "exposed communication": "exposed communication dominates: keep the latency-hiding "
        "scheduler on (xla_gpu_enable_latency_hiding_scheduler), split the combined "
        "all-reduce (--xla_gpu_all_reduce_combine_threshold_bytes) so parts overlap the "
        "backward pass, or send less: FSDP or tensor parallelism instead of replicated "
        "parameters, bf16 gradients",
        "math": "math dominates: the matmuls run at the peak of their types: bf16 (04) or FP8 "
        "(05) products, and tiles tuned on a GPU",
    }
    return [lines[k] for k, v in terms.items() if top > 0 and v >= 0.5 * top]
