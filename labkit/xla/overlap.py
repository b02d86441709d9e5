"""Can the work scheduled between a collective's start and done hide its transfer? An estimate.

Everything here is an *estimate read from the compiled program* (HLO shapes and the hardware
table's datasheet peaks), not a measurement: nothing runs. The model:

- **Transfer time** = bytes each GPU sends / link bandwidth. Bytes per GPU for a group of
  ``n``: a ring all-reduce of ``B`` bytes moves ``2(n-1)/n * B`` (reduce-scatter, then
  all-gather); an all-gather (``B`` = the gathered result), a reduce-scatter (``B`` = the
  input) and an all-to-all move ``(n-1)/n * B``; a collective-permute, send or recv moves
  ``B``. The link bandwidth is NVLink in one direction, half the table's ``nvlink_gbps`` (its
  900 GB/s for an H100 SXM counts both directions; a ring sends and receives at once).
  Per-call latency (microseconds in NCCL) is ignored, so small transfers look cheap.
- **Compute time** of each kernel between start and done = ``max(FLOPs / peak, bytes / HBM
  bandwidth)``. FLOPs are matrix-product FLOPs (``2*M*N*K``, :mod:`labkit.xla.cost`) at the
  peak of their operand type (bf16 -> bf16; f32 -> TF32, what DEFAULT precision gets on
  Hopper; f8 -> FP8). Bytes are the kernel's operands and result, each moved once through
  HBM (an upper bound for kernels that read slices). A loop counts ``known_trip_count``
  times its body. Launch overheads are ignored.
- **Verdict**: ``hidden = min(1, compute / transfer)``; "hidden" when the work covers the
  whole transfer, "exposed" when it covers under 10% (or the collective is synchronous),
  "partly hidden" between.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from labkit.core.hardware import Hardware, hardware
from labkit.xla import hlo
from labkit.xla.cost import kernel_flops
from labkit.xla.hlo_text import Instruction, Module, parse_module, shape_bytes, split_top_level

EXPOSED_BELOW = 0.1  # hidden fraction under which a transfer counts as exposed
_RING_FACTOR = {"all-reduce": 2.0, "all-gather": 1.0, "reduce-scatter": 1.0, "all-to-all": 1.0}


@dataclasses.dataclass(frozen=True)
class Estimate:
    """One transfer (a collective, or a send/recv) and the work scheduled while it is in flight.

    Times in seconds; ``hidden`` is the fraction of the transfer the work can cover.
    """

    name: str
    kind: str
    mode: str  # "async" (start/done pair) or "sync"
    computation: str
    bytes: int  # the collective's buffer (see labkit.xla.hlo.Collective)
    link_bytes: float  # bytes one GPU sends over the link
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


def _kernel_bytes(inst: Instruction, shapes: dict[str, str]) -> float:
    result = inst.shape
    if inst.opcode == "custom-call" and result.startswith("("):  # drop the cuBLAS workspace
        result = split_top_level(result[1:-1])[0]
    operands = [shapes[o] for o in inst.operands if o in shapes]
    return float(sum(shape_bytes(s) for s in [*operands, result] if s))


def kernel_cost(module: Module, inst: Instruction, hw: Hardware) -> tuple[float, float, float]:
    """(FLOPs, HBM bytes, seconds) of one scheduled instruction; loops count their trips."""
    if not hlo.is_compute(module, inst):
        return 0.0, 0.0, 0.0
    if inst.opcode in ("while", "call", "conditional"):
        key = {"while": "body", "call": "to_apply"}.get(inst.opcode)
        names = [inst.attr(key) or ""] if key else []
        if inst.opcode == "conditional":
            names = split_top_level((inst.attr("branch_computations") or "{}")[1:-1])
        trips = 1
        if inst.opcode == "while":
            trips = int(inst.backend_config().get("known_trip_count", {}).get("n", 1))
        parts = [_computation_cost(module, n.lstrip("%"), hw) for n in names]
        if inst.opcode == "conditional":
            return max(parts, key=lambda c: c[2], default=(0.0, 0.0, 0.0))
        return tuple(trips * sum(p[i] for p in parts) for i in range(3))  # type: ignore[return-value]
    flops = kernel_flops(module, inst)
    shapes = {i.name: i.shape for i in module.computations[inst.computation]}
    nbytes = _kernel_bytes(inst, shapes)
    math_s = sum(f / (hw.peak_tflops(p) * 1e12) for p, f in flops.items())  # type: ignore[arg-type,misc]
    return sum(flops.values()), nbytes, max(math_s, nbytes / (hw.hbm_gbps * 1e9))


def _computation_cost(module: Module, name: str, hw: Hardware) -> tuple[float, float, float]:
    costs = [kernel_cost(module, i, hw) for i in module.computations.get(name, ())]
    return tuple(sum(c[i] for c in costs) for i in range(3))  # type: ignore[return-value]


def _verdict(hidden: float, mode: str) -> str:
    if mode == "sync" or hidden < EXPOSED_BELOW:
        return "exposed"
    return "hidden" if hidden >= 1.0 else "partly hidden"


def estimate(
    text: str, gpu: str | Hardware = "H100 SXM", link_gbps: float | None = None
) -> list[Estimate]:
    """Every collective and send/recv of a compiled program, with its overlap estimate.

    ``gpu`` is a hardware-table name (or entry); ``link_gbps`` overrides the one-direction
    link bandwidth (default: half the table's NVLink figure). See the module docstring.
    """
    hw = gpu if isinstance(gpu, Hardware) else hardware(gpu)
    link = link_gbps or (hw.nvlink_gbps or 0.0) / 2
    if link <= 0:
        raise ValueError(f"{hw.name} has no NVLink figure: pass link_gbps= (GB/s, one way)")
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
        transfer = moved / (link * 1e9)
        pair = pairs.get(name)
        between = [by_name[n] for n in pair.ops_between] if pair else []
        costs = [kernel_cost(module, i, hw) for i in between]
        flops, hbm, compute = (sum(c[i] for c in costs) for i in range(3))
        hidden = min(1.0, compute / transfer) if transfer > 0 else 1.0
        mode = "async" if pair and not pair.is_sync else "sync"
        out.append(
            Estimate(
                name,
                kind,
                mode,
                comp,
                nbytes,
                moved,
                transfer,
                sum(c[2] > 0 for c in costs),
                sum(c[0] > 0 for c in costs),
                flops,
                hbm,
                compute,
                hidden if mode == "async" else 0.0,
                _verdict(hidden, mode),
            )
        )
    order = {i.name: k for k, i in enumerate(hlo.instructions(text))}
    return sorted(out, key=lambda e: order[e.name])


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
        "hidden_us": hidden * 1e6,
        "exposed_us": (transfer - hidden) * 1e6,
    }


def rows(estimates: list[Estimate]) -> list[dict[str, Any]]:
    """Table rows: transfer, bytes, estimated times (microseconds) and the verdict."""
    return [
        {
            "transfer": e.name,
            "kind": e.kind,
            "mode": e.mode,
            "bytes": e.bytes,
            "transfer_us": round(e.transfer_s * 1e6, 3),
            "kernels": e.kernels,
            "matmuls": e.matmuls,
            "compute_us": round(e.compute_s * 1e6, 3),
            "hidden": f"{e.hidden:.0%}",
            "verdict": e.verdict,
        }
        for e in estimates
    ]
