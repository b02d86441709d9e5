"""Can the work scheduled between a collective's start and done hide its transfer? An estimate.

Everything here is an *estimate read from the compiled program* (HLO shapes and the hardware
table's datasheet peaks and latencies), not a measurement: nothing runs. The model
(:func:`formula` prints it):

- **Transfer time** of a collective = ``alpha + bytes each GPU sends / link bandwidth``.
  ``alpha`` is the fixed cost of one NCCL call (:data:`labkit.core.hardware.LATENCIES`,
  XLA's own 5 us estimate): it dominates small transfers. Bytes per GPU for a group of
  ``n``: a ring all-reduce of ``B`` bytes moves ``2(n-1)/n * B`` (reduce-scatter, then
  all-gather); an all-gather (``B`` = the gathered result), a reduce-scatter (``B`` = the
  input) and an all-to-all move ``(n-1)/n * B``; a collective-permute, send or recv moves
  ``B``. The link bandwidth is NVLink in one direction, half the table's ``nvlink_gbps``
  (its 900 GB/s for an H100 SXM counts both directions; a ring sends and receives at once).
- **Kernel time** of each kernel = ``max(floor, FLOPs / peak, bytes / HBM bandwidth)``.
  ``floor`` is the least time a kernel occupies the GPU (launch and tail, XLA's 1 us
  estimate). FLOPs are matrix-product FLOPs (``2*M*N*K``, :mod:`labkit.xla.cost`) at the
  peak of their operand type (bf16 -> bf16; f32 -> TF32, what DEFAULT precision gets on
  Hopper; f8 -> FP8). Bytes are the kernel's result plus what it reads of each operand: an
  operand the kernel only slices (``slice``, ``dynamic-slice``) counts the slices' bytes,
  not the whole buffer. A loop counts its body ``trip_count`` times (XLA's ``known_trip_count``;
  once when XLA knows none).
- **Verdict**: ``hidden = min(1, kernel time between start and done / transfer time)``;
  "hidden" when the work covers the whole transfer, "exposed" when it covers under 10% (or
  the collective is synchronous), "partly hidden" between.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, cast

from labkit.core.hardware import LATENCIES, Hardware, Latencies, Precision, hardware
from labkit.xla import hlo
from labkit.xla.cost import kernel_flops
from labkit.xla.hlo_text import Instruction, Module, parse_module, shape_bytes, split_top_level

__all__ = [
    "EXPOSED_BELOW",
    "Cost",
    "Estimate",
    "computation_cost",
    "estimate",
    "formula",
    "kernel_cost",
    "link_bytes",
    "rows",
    "totals",
    "verdicts",
]

EXPOSED_BELOW = 0.1  # hidden fraction under which a transfer counts as exposed
_RING_FACTOR = {"all-reduce": 2.0, "all-gather": 1.0, "reduce-scatter": 1.0, "all-to-all": 1.0}
_SLICING = ("slice", "dynamic-slice")


@dataclasses.dataclass(frozen=True)
class Cost:
    """What some kernels cost: FLOPs, HBM bytes, launches, and seconds by the model's terms.

    ``seconds`` is the sum over kernels of ``max(floor, math, memory)``; ``math_s`` and
    ``memory_s`` the sums of each kernel's FLOPs / peak and bytes / HBM bandwidth, and
    ``floor_s`` the kernels times the floor: the terms a roofline bound is made of.
    """

    flops: float = 0.0
    hbm_bytes: float = 0.0
    kernels: int = 0
    matmuls: int = 0
    seconds: float = 0.0
    math_s: float = 0.0
    memory_s: float = 0.0
    floor_s: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(*(a + b for a, b in zip(_fields(self), _fields(other), strict=True)))

    def times(self, n: int) -> Cost:
        """This cost ``n`` times (a loop body run ``n`` times)."""
        return Cost(*(a * n for a in _fields(self)))


def _fields(cost: Cost) -> tuple[Any, ...]:
    return dataclasses.astuple(cost)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """One transfer (a collective, or a send/recv) and the work scheduled while it is in flight.

    Times in seconds; ``transfer_s = latency_s + wire_s``; ``hidden`` is the fraction of the
    transfer the work between start and done can cover.
    """

    name: str
    kind: str
    mode: str  # "async" (start/done pair) or "sync"
    computation: str
    bytes: int  # the collective's buffer (see labkit.xla.hlo.Collective)
    link_bytes: float  # bytes one GPU sends over the link
    latency_s: float  # alpha: the fixed cost of the call
    wire_s: float  # link_bytes / link bandwidth
    transfer_s: float
    kernels: int  # compute kernels between start and done
    matmuls: int  # of which with matrix-product FLOPs
    flops: float
    hbm_bytes: float
    compute_s: float
    hidden: float
    verdict: str  # "hidden", "partly hidden" or "exposed"


def link_bytes(kind: str, nbytes: float, group_size: int | None) -> float:
    """Bytes one GPU sends for a collective of ``kind`` over ``nbytes`` among ``group_size``."""
    n = group_size or 1
    if kind in _RING_FACTOR:
        return _RING_FACTOR[kind] * (n - 1) / n * nbytes
    return float(nbytes)  # collective-permute, broadcast, send/recv: the whole buffer


def _read_bytes(module: Module, inst: Instruction, index: int, full: int) -> int:
    """Bytes a fusion reads of operand ``index``: its slices' bytes if it only slices it."""
    called = [i for c in inst.callees("calls") for i in module.computations.get(c, ())]
    param = next((i for i in called if i.parameter_number == index), None)
    if param is None:
        return full
    users = [i for i in called if param.name in i.operands]
    if users and all(u.opcode in _SLICING and u.operands[0] == param.name for u in users):
        return sum(shape_bytes(u.shape) for u in users)
    return full


def _kernel_bytes(module: Module, inst: Instruction, shapes: dict[str, str]) -> float:
    result = inst.shape
    if inst.opcode == "custom-call" and result.startswith("("):  # drop the cuBLAS workspace
        result = split_top_level(result[1:-1])[0]
    total = shape_bytes(result) if result else 0
    for index, operand in enumerate(inst.operands):
        if operand not in shapes or not shapes[operand]:
            continue
        full = shape_bytes(shapes[operand])
        total += _read_bytes(module, inst, index, full) if inst.opcode == "fusion" else full
    return float(total)


def kernel_cost(
    module: Module, inst: Instruction, hw: Hardware, latencies: Latencies = LATENCIES
) -> Cost:
    """The :class:`Cost` of one scheduled instruction; loops count their trips, calls and
    conditionals what they run (a conditional: its dearest branch)."""
    if not hlo.is_compute(module, inst):
        return Cost()
    if inst.opcode in ("while", "call", "conditional"):
        names = inst.callees("body") if inst.opcode == "while" else inst.callees()
        parts = [computation_cost(module, name, hw, latencies) for name in names]
        if inst.opcode == "conditional":
            return max(parts, key=lambda c: c.seconds, default=Cost())
        total = sum(parts, Cost())
        if inst.opcode != "while":
            return total
        return total.times(1 if inst.trip_count is None else inst.trip_count)
    flops = kernel_flops(module, inst)
    shapes = module.shapes(inst.computation)
    nbytes = _kernel_bytes(module, inst, shapes)
    math_s = sum(f / (hw.peak_tflops(cast(Precision, p)) * 1e12) for p, f in flops.items())
    memory_s = nbytes / (hw.hbm_gbps * 1e9)
    floor_s = latencies.kernel_floor_us * 1e-6
    total_flops = sum(flops.values())
    return Cost(
        total_flops,
        nbytes,
        1,
        int(total_flops > 0),
        max(floor_s, math_s, memory_s),
        math_s,
        memory_s,
        floor_s,
    )


def computation_cost(
    module: Module, name: str, hw: Hardware, latencies: Latencies = LATENCIES
) -> Cost:
    """The summed :class:`Cost` of a computation's instructions (its kernels)."""
    return sum(
        (kernel_cost(module, i, hw, latencies) for i in module.computations.get(name, ())), Cost()
    )


def _verdict(hidden: float, mode: str) -> str:
    if mode == "sync" or hidden < EXPOSED_BELOW:
        return "exposed"
    return "hidden" if hidden >= 1.0 else "partly hidden"


def _link(hw: Hardware, link_gbps: float | None) -> float:
    link = link_gbps or (hw.nvlink_gbps or 0.0) / 2
    if link <= 0:
        raise ValueError(f"{hw.name} has no NVLink figure: pass link_gbps= (GB/s, one way)")
    return link


def estimate(
    text: str,
    gpu: str | Hardware = "H100 SXM",
    link_gbps: float | None = None,
    latencies: Latencies = LATENCIES,
) -> list[Estimate]:
    """Every collective and send/recv of a compiled program, with its overlap estimate.

    ``gpu`` is a hardware-table name (or entry); ``link_gbps`` overrides the one-direction
    link bandwidth (default: half the table's NVLink figure); ``latencies`` the per-call and
    per-kernel fixed costs. See the module docstring and :func:`formula`.
    """
    hw = gpu if isinstance(gpu, Hardware) else hardware(gpu)
    link = _link(hw, link_gbps)
    module = parse_module(text)
    pairs = {p.start: p for p in hlo.async_pairs(text)}
    by_name = {i.name: i for i in hlo.instructions(text)}
    found: list[tuple[str, str, int, int | None, str]] = [
        (c.name, c.kind, c.bytes, c.group_size or module.num_devices, c.computation)
        for c in hlo.collectives(text)
    ]
    for p in pairs.values():
        if p.kind in ("send", "recv"):
            data = split_top_level(by_name[p.start].shape[1:-1])[0]  # (data, u32[], token[])
            found.append((p.start, p.kind, shape_bytes(data), 2, p.computation))
    out = []
    for name, kind, nbytes, group, comp in found:
        moved = link_bytes(kind, nbytes, group)
        alpha = latencies.collective_us * 1e-6 if moved > 0 else 0.0
        wire = moved / (link * 1e9)
        transfer = alpha + wire
        pair = pairs.get(name)
        between = [by_name[n] for n in pair.ops_between] if pair else []
        work = sum((kernel_cost(module, i, hw, latencies) for i in between), Cost())
        hidden = min(1.0, work.seconds / transfer) if transfer > 0 else 1.0
        mode = "async" if pair and not pair.is_sync else "sync"
        out.append(
            Estimate(
                name,
                kind,
                mode,
                comp,
                nbytes,
                moved,
                alpha,
                wire,
                transfer,
                work.kernels,
                work.matmuls,
                work.flops,
                work.hbm_bytes,
                work.seconds,
                hidden if mode == "async" else 0.0,
                _verdict(hidden, mode),
            )
        )
    order = {i.name: k for k, i in enumerate(hlo.instructions(text))}
    return sorted(out, key=lambda e: order[e.name])


def formula(
    gpu: str | Hardware = "H100 SXM",
    link_gbps: float | None = None,
    latencies: Latencies = LATENCIES,
) -> str:
    """The overlap model as text, with this GPU's numbers in it."""
    hw = gpu if isinstance(gpu, Hardware) else hardware(gpu)
    link = _link(hw, link_gbps)
    return (
        f"transfer = alpha + bytes sent / link = {latencies.collective_us:g} us + bytes / "
        f"{link:g} GB/s  (ring all-reduce sends 2(n-1)/n x buffer; all-gather, reduce-scatter "
        f"(n-1)/n)\n"
        f"kernel   = max(floor, FLOPs / peak, bytes / HBM) = max({latencies.kernel_floor_us:g} us, "
        f"FLOPs / {hw.bf16_tflops:g} TFLOP/s bf16 ({hw.tf32_tflops:g} tf32), bytes / "
        f"{hw.hbm_gbps:g} GB/s)\n"
        f"hidden   = min(1, sum of kernel times between start and done / transfer); "
        f"exposed below {EXPOSED_BELOW:.0%} or when synchronous\n"
        f"alpha and floor: {latencies.source}"
    )


def verdicts(estimates: list[Estimate]) -> dict[str, int]:
    """How many transfers are hidden, partly hidden and exposed."""
    counts = Counter(e.verdict for e in estimates)
    return {k: counts[k] for k in ("hidden", "partly hidden", "exposed")}


def totals(estimates: list[Estimate]) -> dict[str, float]:
    """Summed transfer time and how much of it the scheduled work hides, in microseconds.

    Each op in the program text counts once (an op in a loop body: once, not per trip).
    """
    transfer = sum(e.transfer_s for e in estimates)
    hidden = sum(e.hidden * e.transfer_s for e in estimates)
    return {
        "transfer_us": transfer * 1e6,
        "latency_us": sum(e.latency_s for e in estimates) * 1e6,
        "hidden_us": hidden * 1e6,
        "exposed_us": (transfer - hidden) * 1e6,
    }


def rows(estimates: list[Estimate]) -> list[dict[str, str | int | float]]:
    """Table rows: transfer, bytes, estimated times (microseconds) and the verdict."""
    return [
        {
            "transfer": e.name,
            "kind": e.kind,
            "mode": e.mode,
            "bytes": e.bytes,
            "latency_us": round(e.latency_s * 1e6, 3),
            "wire_us": round(e.wire_s * 1e6, 3),
            "transfer_us": round(e.transfer_s * 1e6, 3),
            "kernels": e.kernels,
            "matmuls": e.matmuls,
            "compute_us": round(e.compute_s * 1e6, 3),
            "hidden": f"{e.hidden:.0%}",
            "verdict": e.verdict,
        }
        for e in estimates
    ]
